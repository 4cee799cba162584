package run

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/cli"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/task"
)

func TestRunSucceeds(t *testing.T) {
	env := clustertest.New(t)
	f := taskFile(t, "ok", "", `      containers:
        - {name: base, image: busybox, command: [sh, -c, 'echo hello; echo world']}`)
	p := run(t, env, "run", "-f", f)
	if p.code != 0 {
		t.Fatalf("exit %d, want 0", p.code)
	}
	if got := p.stdout.String(); got != "hello\nworld\n" {
		t.Errorf("stdout %q, want the main container's log", got)
	}
	if !strings.Contains(p.stderr.String(), "Succeeded/Completed") {
		t.Errorf("stderr does not report Succeeded/Completed:\n%s", p.stderr)
	}
	eventually(t, 30*time.Second, "the pod to be deleted", func() bool { return len(pods(t, env)) == 0 })
	if l := leases(t, env); len(l) != 0 {
		t.Errorf("leases left behind: %v (the run's instance Lease is deleted as it exits)", l)
	}
}

func TestRunFailurePropagatesExitCode(t *testing.T) {
	env := clustertest.New(t)
	f := taskFile(t, "fails", "", `      containers:
        - {name: base, image: busybox, command: [sh, -c, 'echo working; echo broken-input >&2; exit 7']}`)
	p := run(t, env, "run", "-f", f)
	if p.code != 7 {
		t.Fatalf("exit %d, want 7", p.code)
	}
	for _, want := range []string{"FAILED Failed/ExitCode", "exited with code 7", "last log lines", "broken-input", "pod events"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	eventually(t, 30*time.Second, "the pod to be deleted", func() bool { return len(pods(t, env)) == 0 })
}

// A main container that exits 0 while an envoy-like sidecar runs forever: the
// command exits 0 within a few seconds of the main container's exit and the
// pod (and every process of it) is gone.
func TestRunSidecarForever(t *testing.T) {
	env := clustertest.New(t)
	mark := marker()
	f := taskFile(t, "sidecar", "  mainContainer: base", fmt.Sprintf(`      containers:
        - {name: base, image: busybox, command: [sh, -c, 'sleep 1; echo main-done']}
        - {name: envoy, image: envoyproxy/envoy:v1.31.0, command: %s}`, sidecarCmd(mark)))
	p := start(t, env, "run", "-f", f, "-o", "json")
	code := p.wait(t, time.Minute)
	exited := time.Now()
	// The kubelet's timestamp of the main container's last line (same host clock).
	var mainDone time.Time
	for _, l := range lines(p.stdout.String()) {
		var ev struct {
			Type, Line string
			Time       time.Time
		}
		if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == "log" && ev.Line == "main-done" {
			mainDone = ev.Time
		}
	}
	if mainDone.IsZero() {
		t.Fatalf("no log line main-done in:\n%s", p.stdout)
	}
	took := exited.Sub(mainDone)
	t.Logf("exit %d %s after the main container's last line\nstdout:\n%s", code, took, p.stdout)
	if code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	if took > 5*time.Second {
		t.Errorf("exited %s after the main container finished, want a few seconds at most", took)
	}
	eventually(t, 30*time.Second, "the pod to be deleted", func() bool { return len(pods(t, env)) == 0 })
	eventually(t, 10*time.Second, "no sidecar process on the node", func() bool { return len(processes(mark)) == 0 })
}

// The same with --cleanup Keep: the pod stays, nothing of it keeps running, and
// kubetask's finalizer is gone.
func TestRunSidecarKeep(t *testing.T) {
	env := clustertest.New(t)
	mark := marker()
	f := taskFile(t, "keep", "  mainContainer: base", fmt.Sprintf(`      containers:
        - {name: base, image: busybox, command: [sh, -c, 'echo main-done']}
        - {name: envoy, image: envoyproxy/envoy:v1.31.0, command: %s}`, sidecarCmd(mark)))
	start := time.Now()
	p := run(t, env, "run", "-f", f, "--cleanup", "Keep")
	if p.code != 0 {
		t.Fatalf("exit %d, want 0", p.code)
	}
	t.Logf("run took %s", time.Since(start))
	var pod corev1.Pod
	eventually(t, 30*time.Second, "the kept pod's containers to stop", func() bool {
		ps := pods(t, env)
		if len(ps) != 1 {
			return false
		}
		pod = ps[0]
		if pod.Status.Phase != corev1.PodFailed && pod.Status.Phase != corev1.PodSucceeded {
			return false
		}
		for _, s := range pod.Status.ContainerStatuses {
			if s.State.Terminated == nil {
				return false
			}
		}
		return true
	})
	if slices.Contains(pod.Finalizers, task.Finalizer) {
		t.Errorf("kept pod still has the finalizer %s", task.Finalizer)
	}
	if pod.DeletionTimestamp != nil {
		t.Errorf("kept pod is being deleted")
	}
	t.Logf("kept pod: phase %s reason %s", pod.Status.Phase, pod.Status.Reason)
	eventually(t, 10*time.Second, "no sidecar process on the node", func() bool { return len(processes(mark)) == 0 })
}

func TestRunNativeSidecar(t *testing.T) {
	env := clustertest.New(t)
	mark := marker()
	f := taskFile(t, "native", "", fmt.Sprintf(`      initContainers:
        - {name: shipper, image: fluent/fluent-bit:3.1, restartPolicy: Always, command: %s}
      containers:
        - {name: report, image: busybox, command: [sh, -c, 'echo report-done; exit 0']}`, sidecarCmd(mark)))
	p := run(t, env, "run", "-f", f)
	if p.code != 0 {
		t.Fatalf("exit %d, want 0", p.code)
	}
	if !strings.Contains(p.stdout.String(), "report-done") {
		t.Errorf("stdout lacks the main container's log")
	}
	eventually(t, 30*time.Second, "the pod to be deleted", func() bool { return len(pods(t, env)) == 0 })
	eventually(t, 10*time.Second, "no sidecar process on the node", func() bool { return len(processes(mark)) == 0 })
}

func TestRunResultFromTerminationMessage(t *testing.T) {
	env := clustertest.New(t)
	f := taskFile(t, "termmsg", "  result: {from: TerminationMessage}", `      containers:
        - {name: base, image: busybox, command: [sh, -c, 'printf "{\"answer\": 42}" > /dev/termination-log']}`)
	out := filepath.Join(t.TempDir(), "result.json")
	p := run(t, env, "run", "-f", f, "--result", out, "-o", "json")
	if p.code != 0 {
		t.Fatalf("exit %d, want 0", p.code)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != `{"answer": 42}` {
		t.Errorf("result %q", got)
	}
	var o map[string]any
	if err := json.Unmarshal([]byte(outcomeLine(t, p.stdout.String())), &o); err != nil {
		t.Fatal(err)
	}
	if o["result"] != `{"answer": 42}` || o["reason"] != "Completed" {
		t.Errorf("outcome %v", o)
	}
}

func TestRunResultFromFile100KiB(t *testing.T) {
	env := clustertest.New(t)
	const size = 100 << 10
	f := taskFile(t, "fileresult", "  result: {from: File, path: /kubetask/result.txt, maxBytes: 1Mi}", fmt.Sprintf(`      containers:
        - {name: main, image: busybox, command: [sh, -c, 'yes 0123456789abcdef | head -c %d > /kubetask/result.txt']}`, size))
	out := filepath.Join(t.TempDir(), "result.txt")
	p := run(t, env, "run", "-f", f, "--result", out)
	if p.code != 0 {
		t.Fatalf("exit %d, want 0", p.code)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("0123456789abcdef\n"), size/17+1)[:size]
	if !bytes.Equal(got, want) {
		t.Errorf("result: %d bytes, want %d bytes of the pattern", len(got), size)
	}
	eventually(t, 30*time.Second, "the pod to be deleted", func() bool { return len(pods(t, env)) == 0 })
}

// Infrastructure failures fail fast with their reason and exit code, and the pod is
// cleaned up.
func TestRunInfrastructureFailures(t *testing.T) {
	for name, tc := range map[string]struct {
		spec, pod string
		code      int
		reason    string
	}{
		"image pull": {"  timeouts: {imagePull: 2s}", `      containers:
        - {name: base, image: kubetask.invalid/pull-error/app, command: [sh, -c, 'exit 0']}`, 67, "ImagePullFailed"},
		"missing configmap": {"  timeouts: {containerConfig: 2s}", `      containers:
        - name: base
          image: busybox
          command: [sh, -c, 'exit 0']
          env: [{name: X, valueFrom: {configMapKeyRef: {name: missing, key: k}}}]`, 68, "ConfigError"},
		"run timeout": {"  timeouts: {run: 2s}", `      containers:
        - {name: base, image: busybox, command: [sh, -c, 'sleep 60']}`, 71, "RunTimeout"},
		"unschedulable": {"  timeouts: {schedule: 3s}", `      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: no-such-label, operator: Exists}]}]}}}
      containers:
        - {name: base, image: busybox, command: [sh, -c, 'exit 0']}`, 69, "ScheduleTimeout"},
	} {
		t.Run(name, func(t *testing.T) {
			env := clustertest.New(t)
			f := taskFile(t, "infra", tc.spec, tc.pod)
			begin := time.Now()
			p := run(t, env, "run", "-f", f)
			if p.code != tc.code {
				t.Errorf("exit %d, want %d", p.code, tc.code)
			}
			if took := time.Since(begin); took > 20*time.Second {
				t.Errorf("took %s, want a fast failure", took)
			}
			if !strings.Contains(p.stderr.String(), "FAILED Failed/"+tc.reason) {
				t.Errorf("stderr does not name %s", tc.reason)
			}
			eventually(t, 30*time.Second, "the pod to be deleted", func() bool { return len(pods(t, env)) == 0 })
		})
	}
}

// Ctrl-C (or SIGTERM) mid-run deletes the pod, leaves no process on the node,
// and exits 130 (143).
func TestRunInterrupted(t *testing.T) {
	for name, tc := range map[string]struct {
		sig  syscall.Signal
		code int
	}{"SIGINT": {syscall.SIGINT, 130}, "SIGTERM": {syscall.SIGTERM, 143}} {
		t.Run(name, func(t *testing.T) {
			env := clustertest.New(t)
			mark := marker()
			f := taskFile(t, "interrupted", "  mainContainer: base", fmt.Sprintf(`      containers:
        - {name: base, image: busybox, command: [sh, -c, 'echo started; while :; do sleep 1; done', %s]}
        - {name: envoy, image: envoyproxy/envoy:v1.31.0, command: %s}`, mark, sidecarCmd(mark)))
			p := start(t, env, "run", "-f", f)
			eventually(t, time.Minute, "the main container to start", func() bool { return strings.Contains(p.stdout.String(), "started") })
			eventually(t, 10*time.Second, "both containers' processes", func() bool { return len(processes(mark)) >= 2 })
			if err := p.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			signalled := time.Now()
			code := p.wait(t, time.Minute)
			took := time.Since(signalled)
			t.Logf("exited %s after the signal; stderr:\n%s", took, p.stderr)
			// The main container ignores SIGTERM (PID 1 without a handler): it is
			// killed at the end of its 5 s grace period.
			if took > 15*time.Second {
				t.Errorf("took %s after the signal, want the grace period (5 s) and a little", took)
			}
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if ps := pods(t, env); len(ps) != 0 {
				t.Errorf("pod %s still exists after kubetask exited", ps[0].Name)
			}
			if pids := processes(mark); len(pids) != 0 {
				t.Errorf("processes of the pod still run: %v", pids)
			}
		})
	}
}

// kube-apiserver restarted while the log streams: the full log, no line twice.
func TestRunLogsSurviveAPIServerRestart(t *testing.T) {
	env := clustertest.New(t)
	const n = 300
	f := taskFile(t, "restart", "", fmt.Sprintf(`      containers:
        - {name: base, image: busybox, command: [sh, -c, 'i=1; while [ $i -le %d ]; do echo line-$i; i=$((i+1)); sleep 0.05; done']}`, n))
	p := start(t, env, "-v", "run", "-f", f)
	eventually(t, time.Minute, "the first lines", func() bool { return len(lines(p.stdout.String())) >= 10 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := env.Cluster.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver restarted after %d lines", len(lines(p.stdout.String())))
	code := p.wait(t, 2*time.Minute)
	t.Logf("stderr:\n%s", p.stderr)
	if code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	got := lines(p.stdout.String())
	var want []string
	for i := 1; i <= n; i++ {
		want = append(want, fmt.Sprintf("line-%d", i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("log: %d lines, want %d in order without duplicates; got:\n%s", len(got), n, strings.Join(got, "\n"))
	}
	// The restart did break the stream (logged at debug level with -v).
	if !strings.Contains(p.stderr.String(), "log stream broke; resuming") {
		t.Errorf("the log stream was never resumed; the test did not exercise a broken stream")
	}
}

// The CLI killed mid-run; `kubetask run --attach` with the same task attaches to
// the same pod, creates no second one and reports the correct outcome.
func TestRunAttachAfterKill(t *testing.T) {
	env := clustertest.New(t)
	f := taskFile(t, "attach", "", `      containers:
        - {name: base, image: busybox, command: [sh, -c, 'echo started; sleep 4; echo finished; exit 5']}`)
	p := start(t, env, "run", "-f", f)
	eventually(t, time.Minute, "the main container to start", func() bool { return strings.Contains(p.stdout.String(), "started") })
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 10*time.Second)
	before := pods(t, env)
	if len(before) != 1 {
		t.Fatalf("%d pods after the kill, want 1", len(before))
	}
	if l := leases(t, env); len(l) != 1 {
		t.Fatalf("leases after the kill: %v, want the killed run's", l)
	}
	a := run(t, env, "run", "-f", f, "--attach", "-o", "json")
	if a.code != 5 {
		t.Errorf("exit %d, want 5", a.code)
	}
	var o map[string]any
	if err := json.Unmarshal([]byte(outcomeLine(t, a.stdout.String())), &o); err != nil {
		t.Fatal(err)
	}
	if o["attached"] != true || o["pod"] != before[0].Name || o["reason"] != "ExitCode" {
		t.Errorf("outcome %v, want attached to %s with reason ExitCode", o, before[0].Name)
	}
	if !strings.Contains(a.stdout.String(), `"line":"finished"`) {
		t.Errorf("attached run did not stream the rest of the log")
	}
	eventually(t, 30*time.Second, "the pod to be deleted", func() bool { return len(pods(t, env)) == 0 })
	if l := leases(t, env); len(l) != 0 {
		t.Errorf("leases left behind by the attached run, which took over the killed run's: %v", l)
	}

	// Nothing left to attach to: a clear error and its own exit code.
	again := run(t, env, "run", "-f", f, "--attach")
	if again.code != 66 || !strings.Contains(again.stderr.String(), "no unfinished pod") {
		t.Errorf("attach with nothing to attach to: exit %d, stderr %q", again.code, again.stderr)
	}
}

// Every example under examples/local runs to success on the local node (make demo
// runs one of them).
func TestRunLocalExamples(t *testing.T) {
	files, err := filepath.Glob("../../../examples/local/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no local examples: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			env := clustertest.New(t)
			p := run(t, env, "run", "-f", f, "--result", filepath.Join(t.TempDir(), "result"))
			if p.code != 0 {
				t.Fatalf("exit %d, want 0", p.code)
			}
			eventually(t, 30*time.Second, "the pod to be deleted", func() bool { return len(pods(t, env)) == 0 })
		})
	}
}

// Two unfinished pods of the same run: kubetask refuses to pick one, names them,
// and creates nothing.
func TestRunRefusesAmbiguousAttach(t *testing.T) {
	env := clustertest.New(t)
	f := taskFile(t, "ambiguous", "", `      containers:
        - {name: base, image: busybox, command: [sh, -c, 'exit 0']}`)
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := task.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	runID, err := cli.RunID(tk, env.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	id := task.Identity{Namespace: env.Namespace, Name: tk.Name, RunID: runID, Executor: runID}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var names []string
	for attempt := range 2 {
		pod, err := task.BuildPod(tk, id, attempt)
		if err != nil {
			t.Fatal(err)
		}
		pod.Spec.NodeName = "no-such-node" // never runs
		if _, err := env.Client.CoreV1().Pods(env.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, pod.Name)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = releaseAndDelete(ctx, env, pod.Name)
		})
	}
	for _, args := range [][]string{{"run", "-f", f}, {"run", "-f", f, "--attach"}} {
		p := run(t, env, args...)
		if p.code != 66 {
			t.Errorf("%v: exit %d, want 66", args, p.code)
		}
		for _, want := range append([]string{"ambiguous"}, names...) {
			if !strings.Contains(p.stderr.String(), want) {
				t.Errorf("%v: stderr lacks %q", args, want)
			}
		}
	}
	if n := len(pods(t, env)); n != 2 {
		t.Errorf("%d pods, want the 2 created by the test", n)
	}
}

// releaseAndDelete removes kubetask's finalizer and deletes the pod.
func releaseAndDelete(ctx context.Context, env *clustertest.Env, name string) error {
	if err := attempt.Release(ctx, env.Client, env.Namespace, name, false); err != nil {
		return err
	}
	return attempt.Delete(ctx, env.Client, env.Namespace, name)
}

// TestRunDeletedExternally: a pod deleted by someone else while its main
// container runs: kubetask waits until no container runs, then decides from
// the main container. Killed by the deletion's signal: DeletedExternally
// (exit 73). Handling SIGTERM and exiting 0: its own outcome, Succeeded (exit
// 0; issue 9, defect b). Either way the pod goes.
func TestRunDeletedExternally(t *testing.T) {
	for name, tc := range map[string]struct {
		script string
		code   int
		reason string
	}{
		"killed":   {`echo started; while :; do sleep 1; done`, 73, "DeletedExternally"},
		"graceful": {`trap "echo stopping; exit 0" TERM; echo started; while :; do sleep 1; done`, 0, "Succeeded/Completed"},
	} {
		t.Run(name, func(t *testing.T) {
			env := clustertest.New(t)
			f := taskFile(t, "deleted", "", fmt.Sprintf(`      containers:
        - {name: base, image: busybox, command: [sh, -c, '%s']}`, tc.script))
			p := start(t, env, "run", "-f", f)
			eventually(t, time.Minute, "the main container to start", func() bool { return strings.Contains(p.stdout.String(), "started") })
			ps := pods(t, env)
			if len(ps) != 1 {
				t.Fatalf("%d pods, want 1", len(ps))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := env.Client.CoreV1().Pods(env.Namespace).Delete(ctx, ps[0].Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			code := p.wait(t, time.Minute)
			t.Logf("stderr:\n%s", p.stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d (%s)", code, tc.code, tc.reason)
			}
			if !strings.Contains(p.stderr.String(), tc.reason) {
				t.Errorf("stderr does not name %s", tc.reason)
			}
			eventually(t, 30*time.Second, "the pod to be gone", func() bool { return len(pods(t, env)) == 0 })
		})
	}
}

// TestRunPinnedToANode: a task whose template names its node (spec.nodeName)
// runs there, behind the fence's gate like every other: kube-apiserver
// refuses nodeName on a gated pod, so kubetask pins the pod with a required
// node affinity on the node's name instead (docs/task-format.md), and the
// real scheduler binds it to that node once the gate is removed. At 016ccbf
// this exited 68 (ConfigError).
func TestRunPinnedToANode(t *testing.T) {
	env := clustertest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) == 0 {
		t.Fatalf("listing nodes: %v (%d nodes)", err, len(nodes.Items))
	}
	node := ""
	for _, n := range nodes.Items {
		if len(n.Spec.Taints) == 0 { // the local process node (localPlacement)
			node = n.Name
		}
	}
	if node == "" {
		t.Fatalf("no untainted node among %d", len(nodes.Items))
	}
	f := taskFile(t, "pinned", "", fmt.Sprintf(`      nodeName: %s
      containers:
        - {name: base, image: busybox, command: [sh, -c, 'echo pinned-done']}`, node))
	p := run(t, env, "run", "-f", f, "--cleanup", "Keep")
	if p.code != 0 {
		t.Fatalf("exit %d, want 0\nstderr:\n%s", p.code, p.stderr)
	}
	if !strings.Contains(p.stdout.String(), "pinned-done") {
		t.Errorf("stdout %q lacks the main container's log", p.stdout)
	}
	ps := pods(t, env)
	if len(ps) != 1 {
		t.Fatalf("%d pods kept, want 1", len(ps))
	}
	pod := ps[0]
	if pod.Spec.NodeName != node {
		t.Errorf("the pod ran on %q, want %q", pod.Spec.NodeName, node)
	}
	aff := pod.Spec.Affinity
	if aff == nil || aff.NodeAffinity == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatalf("the pod has no required node affinity: %+v", aff)
	}
	terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchFields) != 1 || !slices.Equal(terms[0].MatchFields[0].Values, []string{node}) {
		t.Errorf("the pod's affinity does not pin it to %s: %+v", node, terms)
	}
}
