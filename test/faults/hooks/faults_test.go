package hooks

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// TestWatchFromBeforeAPIServerRestartExpires is the realistic 410: an
// apiserver rollout empties the watch cache, and a watcher that resumes from
// the version it saw before gets 410 Expired.
func TestWatchFromBeforeAPIServerRestartExpires(t *testing.T) {
	env := clustertest.New(t)
	clustertest.CreateIdlePod(t, env, "before")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	list, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := list.ResourceVersion

	// A watch from that version works before the restart.
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	if err := clustertest.WatchPodsFrom(wctx, env.Client, env.Namespace, old); err != nil {
		t.Fatalf("watch before the restart: %v", err)
	}
	wcancel()

	if err := env.Cluster.RestartAPIServer(ctx); err != nil {
		t.Fatalf("restarting kube-apiserver: %v", err)
	}
	// etcd kept the data.
	if _, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, "before", metav1.GetOptions{}); err != nil {
		t.Fatalf("pod lost across the apiserver restart: %v", err)
	}
	wctx, wcancel = context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	err = clustertest.WatchPodsFrom(wctx, env.Client, env.Namespace, old)
	if !apierrors.IsResourceExpired(err) {
		t.Fatalf("watch from %s after the restart: got %v, want 410 Expired", old, err)
	}
	if apierrors.IsGone(err) {
		t.Errorf("IsGone(%v) = true; client-go reports an expired watch as Expired, not Gone", err)
	}
}

// TestEtcdStopAndStart: with etcd down the apiserver fails requests; once it
// is back, the data written before is still there.
func TestEtcdStopAndStart(t *testing.T) {
	env := clustertest.New(t)
	clustertest.CreateIdlePod(t, env, "survivor")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := env.Cluster.StopEtcd(ctx); err != nil {
		t.Fatalf("stopping etcd: %v", err)
	}
	clustertest.Eventually(t, time.Minute, "apiserver fails reads while etcd is down", func(ctx context.Context) error {
		// A quorum read goes to etcd.
		_, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, "survivor", metav1.GetOptions{})
		if err == nil {
			return errString("read succeeded with etcd stopped")
		}
		return nil
	})
	if err := env.Cluster.StartEtcd(ctx); err != nil {
		t.Fatalf("starting etcd: %v", err)
	}
	clustertest.Eventually(t, time.Minute, "pod readable after etcd restart", func(ctx context.Context) error {
		_, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, "survivor", metav1.GetOptions{})
		return err
	})
}

type errString string

func (e errString) Error() string { return string(e) }
