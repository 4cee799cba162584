package run

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/task"
)

// podFile writes a plain pod manifest named name with local placement and the
// given containers (indented six spaces, as in taskFile).
func podFile(t *testing.T, name, podSpec string) string {
	t.Helper()
	doc := fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %s}\nspec:%s\n%s\n", name, localPlacement, podSpec)
	p := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// finishedPod waits until the namespace holds exactly one pod in a final phase with
// every container terminated, and returns it.
func finishedPod(t *testing.T, env *clustertest.Env, d time.Duration) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	eventually(t, d, "one kept pod with every container terminated", func() bool {
		ps := pods(t, env)
		if len(ps) != 1 {
			return false
		}
		pod = ps[0]
		if pod.Status.Phase != corev1.PodFailed && pod.Status.Phase != corev1.PodSucceeded {
			return false
		}
		for _, s := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
			if s.State.Terminated == nil {
				return false
			}
		}
		return true
	})
	return pod
}

// Two regular containers, neither named base nor main: without --main-container the
// run is refused (64) with an error naming mainContainer and nothing is created;
// with it, the named container decides even though the other never exits by itself.
func TestRunMainContainerFlag(t *testing.T) {
	const containers = `      containers:
        - {name: worker, image: busybox, command: [sh, -c, 'echo worker-done; exit 4']}
        - {name: proxy, image: busybox, command: [sh, -c, 'trap "exit 0" TERM; while :; do sleep 1; done', %s]}`
	for name, file := range map[string]func(t *testing.T, pod string) string{
		"task": func(t *testing.T, pod string) string { return taskFile(t, "twomain", "", pod) },
		"pod":  func(t *testing.T, pod string) string { return podFile(t, "twomain", pod) },
	} {
		t.Run(name, func(t *testing.T) {
			env := clustertest.New(t)
			mark := marker()
			f := file(t, fmt.Sprintf(containers, mark))

			refused := run(t, env, "run", "-f", f)
			if refused.code != 64 {
				t.Errorf("without --main-container: exit %d, want 64", refused.code)
			}
			for _, want := range []string{"mainContainer", "worker", "proxy"} {
				if !strings.Contains(refused.stderr.String(), want) {
					t.Errorf("without --main-container: stderr lacks %q", want)
				}
			}
			wrong := run(t, env, "run", "-f", f, "--main-container", "nosuch")
			if wrong.code != 64 || !strings.Contains(wrong.stderr.String(), `"nosuch"`) {
				t.Errorf("--main-container nosuch: exit %d, want 64 and an error naming it", wrong.code)
			}
			if n := len(pods(t, env)); n != 0 {
				t.Fatalf("refused runs created %d pods", n)
			}

			p := run(t, env, "run", "-f", f, "--main-container", "worker", "-o", "json")
			if p.code != 4 {
				t.Errorf("with --main-container worker: exit %d, want 4", p.code)
			}
			var o map[string]any
			if err := json.Unmarshal([]byte(outcomeLine(t, p.stdout.String())), &o); err != nil {
				t.Fatal(err)
			}
			if o["reason"] != "ExitCode" || o["exitCode"] != float64(4) {
				t.Errorf("outcome %v, want reason ExitCode, exitCode 4", o)
			}
			if !strings.Contains(p.stdout.String(), `"line":"worker-done"`) {
				t.Errorf("stdout lacks the worker's log")
			}
			eventually(t, 30*time.Second, "the pod to be deleted", func() bool { return len(pods(t, env)) == 0 })
			eventually(t, 10*time.Second, "no process of the pod on the node", func() bool { return len(processes(mark)) == 0 })
		})
	}
}

// --cleanup DeleteSucceeded: a failed task's pod is kept with nothing running in it
// and no finalizer; a succeeded task's pod is deleted.
func TestRunCleanupDeleteSucceeded(t *testing.T) {
	t.Run("failed is kept", func(t *testing.T) {
		env := clustertest.New(t)
		mark := marker()
		f := taskFile(t, "keepfailed", "  mainContainer: base", fmt.Sprintf(`      containers:
        - {name: base, image: busybox, command: [sh, -c, 'echo failing; exit 3']}
        - {name: envoy, image: envoyproxy/envoy:v1.31.0, command: %s}`, sidecarCmd(mark)))
		p := run(t, env, "run", "-f", f, "--cleanup", "DeleteSucceeded")
		if p.code != 3 {
			t.Errorf("exit %d, want 3", p.code)
		}
		// kubetask has exited: the pod must already be final, without finalizer.
		ps := pods(t, env)
		if len(ps) != 1 {
			t.Fatalf("%d pods after the run, want the kept one", len(ps))
		}
		pod := finishedPod(t, env, 5*time.Second)
		if slices.Contains(pod.Finalizers, task.Finalizer) {
			t.Errorf("kept pod still has the finalizer %s", task.Finalizer)
		}
		if pod.DeletionTimestamp != nil {
			t.Errorf("kept pod is being deleted")
		}
		for _, s := range pod.Status.ContainerStatuses {
			if s.Name == "base" && s.State.Terminated.ExitCode != 3 {
				t.Errorf("kept pod's main container exited %d, want 3", s.State.Terminated.ExitCode)
			}
		}
		t.Logf("kept pod %s: phase %s reason %s", pod.Name, pod.Status.Phase, pod.Status.Reason)
		eventually(t, 10*time.Second, "no process of the pod on the node", func() bool { return len(processes(mark)) == 0 })
	})
	t.Run("succeeded is deleted", func(t *testing.T) {
		env := clustertest.New(t)
		f := taskFile(t, "delsucceeded", "", `      containers:
        - {name: base, image: busybox, command: [sh, -c, 'echo fine']}`)
		p := run(t, env, "run", "-f", f, "--cleanup", "DeleteSucceeded")
		if p.code != 0 {
			t.Errorf("exit %d, want 0", p.code)
		}
		if got := p.stdout.String(); got != "fine\n" {
			t.Errorf("stdout %q", got)
		}
		eventually(t, 30*time.Second, "the pod to be deleted", func() bool { return len(pods(t, env)) == 0 })
	})
}

// An init container that outlives timeouts.startup: StartupTimeout (70), explained,
// the pod deleted and none of its processes left.
func TestRunStartupTimeout(t *testing.T) {
	env := clustertest.New(t)
	mark := marker()
	f := taskFile(t, "startup", "  timeouts: {startup: 2s}", fmt.Sprintf(`      initContainers:
        - {name: setup, image: busybox, command: [sh, -c, 'trap "exit 0" TERM; i=0; while [ $i -lt 30 ]; do sleep 1; i=$((i+1)); done', %s]}
      containers:
        - {name: base, image: busybox, command: [sh, -c, 'echo should-not-run']}`, mark))
	begin := time.Now()
	p := run(t, env, "run", "-f", f)
	took := time.Since(begin)
	if p.code != 70 {
		t.Errorf("exit %d, want 70 (StartupTimeout)", p.code)
	}
	if took > 20*time.Second {
		t.Errorf("took %s, want about the 2 s startup timeout", took)
	}
	if !strings.Contains(p.stderr.String(), "FAILED Failed/StartupTimeout") {
		t.Errorf("stderr does not name StartupTimeout")
	}
	if strings.Contains(p.stdout.String(), "should-not-run") {
		t.Errorf("the main container ran")
	}
	if ps := pods(t, env); len(ps) != 0 {
		t.Errorf("pod %s still exists after kubetask exited", ps[0].Name)
	}
	eventually(t, 10*time.Second, "no process of the pod on the node", func() bool { return len(processes(mark)) == 0 })
}
