package sim

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
)

// terminated reports whether container name has terminated with code and
// the reason the kubelet would give, with both timestamps set.
func terminated(p *corev1.Pod, name string, code int32) (bool, string) {
	cs := containerStatus(p, name)
	if cs == nil {
		return false, "no status for " + name
	}
	t := cs.State.Terminated
	if t == nil {
		return false, name + " has not terminated"
	}
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	if t.ExitCode != code || t.Reason != reason {
		return false, fmt.Sprintf("%s terminated with %d/%s, want %d/%s", name, t.ExitCode, t.Reason, code, reason)
	}
	if t.StartedAt.IsZero() || t.FinishedAt.IsZero() || t.FinishedAt.Before(&t.StartedAt) {
		return false, fmt.Sprintf("%s: startedAt %v finishedAt %v", name, t.StartedAt, t.FinishedAt)
	}
	if cs.Ready {
		return false, name + " terminated but ready"
	}
	return true, ""
}

func stillRunning(p *corev1.Pod, name string) (bool, string) {
	cs := containerStatus(p, name)
	if cs == nil || cs.State.Running == nil {
		return false, name + " is not running"
	}
	return true, ""
}

// all combines checks on one pod.
func all(checks ...func(*corev1.Pod) (bool, string)) func(*corev1.Pod) (bool, string) {
	return func(p *corev1.Pod) (bool, string) {
		for _, c := range checks {
			if ok, why := c(p); !ok {
				return false, why
			}
		}
		return true, ""
	}
}

func exited(name string, code int32) func(*corev1.Pod) (bool, string) {
	return func(p *corev1.Pod) (bool, string) { return terminated(p, name, code) }
}

func runs(name string) func(*corev1.Pod) (bool, string) {
	return func(p *corev1.Pod) (bool, string) { return stillRunning(p, name) }
}

func notReady(p *corev1.Pod) (bool, string) {
	if podReady(p) {
		return false, "pod still Ready"
	}
	return true, ""
}

// TestAnnotations drives each sim.kubetask.dev/ annotation and checks the
// container statuses and phase the stages produce.
func TestAnnotations(t *testing.T) {
	a := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := map[string]struct {
		annotations map[string]string
		containers  []string
		// want is the state the pod reaches; then keeps, if set, must hold for a while.
		want, keeps func(*corev1.Pod) (bool, string)
		// notBefore: want must not be reached earlier than this after creation.
		notBefore time.Duration
	}{
		"main exits with an error, sidecar keeps running": {
			annotations: a(kwokstages.ExitContainer, "main", kwokstages.ExitCode, "3", kwokstages.ExitAfter, "1s"),
			containers:  []string{"main", "sidecar"},
			notBefore:   time.Second,
			want:        all(running, exited("main", 3), runs("sidecar"), notReady),
			keeps:       all(running, exited("main", 3), runs("sidecar")),
		},
		"main exits 0, sidecar keeps running": {
			annotations: a(kwokstages.ExitContainer, "main", kwokstages.ExitAfter, "500ms"),
			containers:  []string{"main", "sidecar"},
			want:        all(running, exited("main", 0), runs("sidecar")),
			keeps:       all(running, exited("main", 0), runs("sidecar")),
		},
		"sidecar named second exits, main keeps running": {
			annotations: a(kwokstages.ExitContainer, "sidecar", kwokstages.ExitCode, "1"),
			containers:  []string{"main", "sidecar"},
			want:        all(running, exited("sidecar", 1), runs("main")),
		},
		"only container exits 0: Succeeded": {
			annotations: a(kwokstages.ExitContainer, "main", kwokstages.ExitAfter, "1s"),
			containers:  []string{"main"},
			notBefore:   time.Second,
			want:        all(phaseIs(corev1.PodSucceeded), exited("main", 0), notReady),
		},
		"only container exits 1: Failed": {
			annotations: a(kwokstages.ExitContainer, "main", kwokstages.ExitCode, "1"),
			containers:  []string{"main"},
			want:        all(phaseIs(corev1.PodFailed), exited("main", 1)),
		},
		"unknown container name: pod just runs": {
			annotations: a(kwokstages.ExitContainer, "nope", kwokstages.ExitCode, "1"),
			containers:  []string{"main"},
			want:        allRunning,
			keeps:       allRunning,
		},
		"complete 0: Succeeded": {
			annotations: a(kwokstages.CompleteAfter, "1s"),
			notBefore:   time.Second,
			containers:  []string{"main", "sidecar"},
			want:        all(phaseIs(corev1.PodSucceeded), exited("main", 0), exited("sidecar", 0), notReady),
		},
		"complete 2: Failed": {
			annotations: a(kwokstages.CompleteAfter, "500ms", kwokstages.CompleteCode, "2"),
			containers:  []string{"main", "sidecar"},
			want:        all(phaseIs(corev1.PodFailed), exited("main", 2), exited("sidecar", 2)),
		},
		"complete wins over exit-container": {
			annotations: a(kwokstages.CompleteAfter, "0s", kwokstages.ExitContainer, "main", kwokstages.ExitCode, "5"),
			containers:  []string{"main", "sidecar"},
			want:        all(phaseIs(corev1.PodSucceeded), exited("main", 0), exited("sidecar", 0)),
		},
		"sidecars stop after main exits 0: Succeeded": {
			annotations: a(kwokstages.ExitContainer, "main", kwokstages.ExitAfter, "500ms", kwokstages.SidecarsStopAfter, "1s"),
			notBefore:   1500 * time.Millisecond,
			containers:  []string{"main", "sidecar", "proxy"},
			want:        all(phaseIs(corev1.PodSucceeded), exited("main", 0), exited("sidecar", 0), exited("proxy", 0)),
		},
		"sidecars stop after main exits 1: Failed": {
			annotations: a(kwokstages.ExitContainer, "main", kwokstages.ExitCode, "1", kwokstages.SidecarsStopAfter, "500ms"),
			containers:  []string{"main", "sidecar"},
			want:        all(phaseIs(corev1.PodFailed), exited("main", 1), exited("sidecar", 0)),
		},
		"sidecars killed with 143 after main exits 0: Failed (kubelet rule)": {
			annotations: a(kwokstages.ExitContainer, "main", kwokstages.SidecarsStopAfter, "500ms", kwokstages.SidecarsExitCode, "143"),
			containers:  []string{"main", "sidecar"},
			want:        all(phaseIs(corev1.PodFailed), exited("main", 0), exited("sidecar", 143)),
		},
	}
	env := clustertest.New(t)
	i := 0
	for name, tc := range tests {
		pod := fmt.Sprintf("p%d", i)
		i++
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			createPod(t, env, simPod(pod, tc.annotations, tc.containers...))
			p := waitPod(t, env, pod, 30*time.Second, tc.want)
			if took := time.Since(start); took < tc.notBefore {
				t.Errorf("reached the wanted state after %s, before its delay of %s", took, tc.notBefore)
			}
			if !isSimNode(env, p.Spec.NodeName) {
				t.Errorf("pod runs on %q, not a simulated node", p.Spec.NodeName)
			}
			if tc.keeps != nil {
				holds(t, env, pod, 2*time.Second, tc.keeps)
			}
		})
	}
}

// TestNativeSidecar: an init container with restartPolicy Always runs next
// to the main container and is stopped when the pod completes; an ordinary
// init container shows as completed.
func TestNativeSidecar(t *testing.T) {
	env := clustertest.New(t)
	always := corev1.ContainerRestartPolicyAlways
	pod := simPod("native", map[string]string{kwokstages.ExitContainer: "main", kwokstages.ExitAfter: "1s"}, "main")
	pod.Spec.InitContainers = []corev1.Container{
		{Name: "setup", Image: "registry.k8s.io/pause:3.10"},
		{Name: "proxy", Image: "registry.k8s.io/pause:3.10", RestartPolicy: &always},
	}
	createPod(t, env, pod)
	initState := func(p *corev1.Pod, name string) *corev1.ContainerState {
		for _, s := range p.Status.InitContainerStatuses {
			if s.Name == name {
				return &s.State
			}
		}
		return nil
	}
	waitPod(t, env, "native", 30*time.Second, all(allRunning, func(p *corev1.Pod) (bool, string) {
		if s := initState(p, "setup"); s == nil || s.Terminated == nil || s.Terminated.ExitCode != 0 {
			return false, "setup not completed"
		}
		if s := initState(p, "proxy"); s == nil || s.Running == nil {
			return false, "proxy not running"
		}
		return true, ""
	}))
	waitPod(t, env, "native", 30*time.Second, all(phaseIs(corev1.PodSucceeded), exited("main", 0), func(p *corev1.Pod) (bool, string) {
		if s := initState(p, "proxy"); s == nil || s.Terminated == nil {
			return false, "proxy not stopped"
		}
		return true, ""
	}))
}
