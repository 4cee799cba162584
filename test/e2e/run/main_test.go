// Package run drives the built `kubetask run` against a local cluster with one
// local process node, as a user would.
//
// In short: proves what docs/run.md promises of `kubetask run` (exit codes,
// results, logs, sidecars, Ctrl-C), from the built binary; about 3 min in `go
// test ./...` on the 2-core CI machine.
package run

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) { clustertest.MainWith(m, clustertest.Options{}) }

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// kubetaskBin builds the binary under test once, next to the shared cluster's
// directory (removed with it when the test binary ends).
func kubetaskBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		dir := filepath.Join(filepath.Dir(clustertest.Cluster().Dir()), "e2erun")
		binPath, binErr = clustertest.BuildKubetask(ctx, dir)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}
