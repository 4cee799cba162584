package simulation

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// TestFreshServerListIsNotVersionZero: the first list of a fresh simulated
// API server answers a resourceVersion other than "0" (as kube-apiserver's,
// from etcd's revision, does), so that a watch from it after a pod was
// created and the history compacted ends with 410 Expired, as test/integration's
// contract test requires whichever of its scenarios runs first (it failed
// when this one ran first: a watch from "0" starts from now and saw nothing).
func TestFreshServerListIsNotVersionZero(t *testing.T) {
	client, expire, stop := ContractClient()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods := client.CoreV1().Pods("ns")
	l, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.ResourceVersion == "0" || l.ResourceVersion == "" {
		t.Fatalf("a fresh server's list has resourceVersion %q", l.ResourceVersion)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expire()
	w, err := pods.Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Error || !apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) {
			t.Fatalf("first event %s %v, want ERROR 410 Expired", ev.Type, ev.Object)
		}
	case <-ctx.Done():
		t.Fatal("no event from a watch of a compacted version")
	}
}
