package cluster

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/components"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestServerVersionIsPinnedRelease(t *testing.T) {
	env := clustertest.New(t)
	v, err := env.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != components.KubernetesVersion {
		t.Errorf("server version %s, want %s", v.GitVersion, components.KubernetesVersion)
	}
}

func TestKubectlVersionShowsServer(t *testing.T) {
	env := clustertest.New(t)
	b, err := components.NewBuilder(nil)
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := b.Ensure(context.Background(), components.Kubectl)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectl, "--kubeconfig", env.Kubeconfig, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl version: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "Server Version: "+components.KubernetesVersion) {
		t.Errorf("kubectl version output lacks the server version:\n%s", out)
	}
}

// TestSchedulerBindsPods proves kube-scheduler runs: an unschedulable pod
// (no node fits) gets PodScheduled=False with reason Unschedulable.
func TestSchedulerMarksUnschedulablePods(t *testing.T) {
	env := clustertest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nowhere"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubetask.dev/no-such-node": "true"},
			Containers:   []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"true"}}},
		},
	}
	if _, err := env.Client.CoreV1().Pods(env.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		p, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod never marked Unschedulable: %+v", p.Status)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
