package clustertest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMain(m *testing.M) { MainWith(m, Options{}) }

// TestNewWithoutControllerManager: New gives a namespace where a pod can be
// created at once even when kube-controller-manager does not act (stopped
// here; after kube-apiserver restarts, its namespace informer may wait a
// minute in client-go's relist backoff, which made the namespace of the test
// after such a restart wait in vain for its default ServiceAccount).
func TestNewWithoutControllerManager(t *testing.T) {
	c := Cluster()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.StopControllerManager(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.RestartControllerManager(context.Background(), 0, 0); err != nil {
			t.Errorf("starting kube-controller-manager again: %v", err)
		}
	})
	env := New(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
	}
	if _, err := env.Client.CoreV1().Pods(env.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a pod in %s: %v", env.Namespace, err)
	}
}
