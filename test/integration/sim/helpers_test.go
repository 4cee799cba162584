package sim

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// simPodSpec is a pod spec the scheduler places on simulated nodes only.
func simPodSpec(containers ...string) corev1.PodSpec {
	spec := corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		NodeSelector:  localcluster.SimNodeSelector(),
		Tolerations:   []corev1.Toleration{localcluster.SimNodeToleration()},
	}
	for _, c := range containers {
		spec.Containers = append(spec.Containers, corev1.Container{Name: c, Image: "registry.k8s.io/pause:3.10"})
	}
	return spec
}

func simPod(name string, annotations map[string]string, containers ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec:       simPodSpec(containers...),
	}
}

func createPod(t testing.TB, env *clustertest.Env, pod *corev1.Pod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := env.Client.CoreV1().Pods(env.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
}

// waitPod polls pod name until ok reports true and returns that pod; it
// fails the test after timeout with the last state and ok's last reason.
func waitPod(t testing.TB, env *clustertest.Env, name string, timeout time.Duration, ok func(*corev1.Pod) (bool, string)) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last *corev1.Pod
	var why string
	for {
		p, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			var done bool
			if done, why = ok(p); done {
				return p
			}
		} else {
			why = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s: condition not met after %s: %s\nlast status: %s", name, timeout, why, describe(last))
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// holds checks that ok stays true for the whole window (a pod that must
// keep running); it polls, so it waits on the condition, not on a sleep.
func holds(t testing.TB, env *clustertest.Env, name string, window time.Duration, ok func(*corev1.Pod) (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(window)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, name, metav1.GetOptions{})
		cancel()
		if err != nil {
			t.Fatalf("reading pod %s: %v", name, err)
		}
		if good, why := ok(p); !good {
			t.Fatalf("pod %s changed: %s\nstatus: %s", name, why, describe(p))
		}
		time.Sleep(200 * time.Millisecond) // poll interval inside a deadline-bound loop
	}
}

func running(p *corev1.Pod) (bool, string) {
	if p.Status.Phase != corev1.PodRunning {
		return false, "phase " + string(p.Status.Phase)
	}
	return true, ""
}

// allRunning: phase Running, Ready, every container running and ready.
func allRunning(p *corev1.Pod) (bool, string) {
	if ok, why := running(p); !ok {
		return ok, why
	}
	if len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false, fmt.Sprintf("%d container statuses for %d containers", len(p.Status.ContainerStatuses), len(p.Spec.Containers))
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil || !cs.Ready {
			return false, "container " + cs.Name + " not running and ready"
		}
	}
	if !podReady(p) {
		return false, "Ready condition not True"
	}
	return true, ""
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func phaseIs(phase corev1.PodPhase) func(*corev1.Pod) (bool, string) {
	return func(p *corev1.Pod) (bool, string) {
		return p.Status.Phase == phase, "phase " + string(p.Status.Phase)
	}
}

func containerStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

func describe(p *corev1.Pod) string {
	if p == nil {
		return "<none>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s node=%s", p.Status.Phase, p.Spec.NodeName)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, " %s=%s", c.Type, c.Status)
	}
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Running != nil:
			fmt.Fprintf(&b, " [%s running ready=%v]", cs.Name, cs.Ready)
		case cs.State.Terminated != nil:
			fmt.Fprintf(&b, " [%s terminated code=%d reason=%s]", cs.Name, cs.State.Terminated.ExitCode, cs.State.Terminated.Reason)
		default:
			fmt.Fprintf(&b, " [%s waiting]", cs.Name)
		}
	}
	return b.String()
}

func isSimNode(env *clustertest.Env, node string) bool {
	for _, n := range env.Cluster.SimNodeNames() {
		if n == node {
			return true
		}
	}
	return false
}

// waitGone waits until pod name no longer exists.
func waitGone(t testing.TB, env *clustertest.Env, name string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		_, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s still exists after %s (last error %v)", name, timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
