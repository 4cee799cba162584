package clustertest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// WatchPodsFrom opens a raw pod watch in ns from resourceVersion rv and
// returns the error the apiserver answers with: the error of the request
// itself, or the first ERROR event, converted with apierrors.FromObject. It
// returns nil if the watch delivers only ordinary events until ctx ends.
// Tests use it to prove that a watch from a stale version gets 410 Expired.
func WatchPodsFrom(ctx context.Context, client kubernetes.Interface, ns, rv string) error {
	w, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: false})
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil
			}
			if ev.Type == watch.Error {
				return apierrors.FromObject(ev.Object)
			}
		}
	}
}

// CreateIdlePod creates a pod that no node will run (it selects a label no
// node has), to move resourceVersions forward.
func CreateIdlePod(t testing.TB, env *Env, name string) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubetask.dev/no-such-node": "true"},
			Containers:   []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"true"}}},
		},
	}
	out, err := env.Client.CoreV1().Pods(env.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	return out
}

// Eventually polls cond every 100ms until it returns nil or timeout passes,
// then fails the test with cond's last error.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		last = cond(cctx)
		ccancel()
		if last == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not true after %s: %v", what, timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
