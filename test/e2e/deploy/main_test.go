// Package deploy tests the manifests in deploy/ against the local cluster: the
// default layout (namespaced/: the task-pod role bound in the listed task
// namespaces only, serve given the same list) and the cluster-wide overlay
// build and every object is accepted by a real API server (server-side
// apply, dry run); the API server's RBAC grants the default layout's
// ServiceAccount pods in its task namespaces and nowhere else; a `kubetask
// serve` that holds nothing but the deployed roles runs a task end to end
// (pods, sidecar stop, file result through exec, log capture, finalizers,
// Leases, TokenReview and SubjectAccessReview) while an action outside them
// is refused, and refuses a submission to a namespace not listed with a 422
// that says how to add it; and the real Deployment runs from the kubetask
// image (built by tools/image, loaded with `kubetask cluster load-image`) on
// the local node, each replica in a network of its own, on PostgreSQL: both
// replicas ready at the Service's endpoints, a task run through one, one
// replica evicted while the other answers (TestDeploymentFromImage).
//
// In short: proves that deploy/'s manifests apply, grant no more than they
// need, and run a task end to end from the kubetask image; about 70 s in `go
// test ./...` on the 2-core CI machine.
package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := clustertest.Run(m, clustertest.Options{})
	if err := pgtest.StopShared(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// kubetaskBin builds the binary under test once, beside the shared
// cluster's directory (removed with it).
func kubetaskBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		dir := filepath.Join(filepath.Dir(clustertest.Cluster().Dir()), "deploy")
		if binErr = os.MkdirAll(dir, 0o755); binErr != nil {
			return
		}
		binPath, binErr = clustertest.BuildKubetask(ctx, dir)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// eventually polls cond every 100 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
