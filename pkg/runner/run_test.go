package runner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/task"
)

// newFake returns a fake clientset whose pod creates get a creation timestamp
// from clk, as the API server would.
func newFake(clk *clocktesting.FakeClock) *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		p.CreationTimestamp = metav1.NewTime(clk.Now())
		return false, nil, nil
	})
	return c
}

func parseTask(t *testing.T, js string) *task.Task {
	t.Helper()
	tk, err := task.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

type result struct {
	out *Outcome
	err error
}

func start(ctx context.Context, t *testing.T, c *fake.Clientset, tk *task.Task, clk *clocktesting.FakeClock) (<-chan result, task.Identity) {
	t.Helper()
	id := task.Identity{Namespace: "ns", Name: tk.Name, RunID: "cli-test", Executor: "cli-test"}
	ch := make(chan result, 1)
	go func() {
		o, err := Run(ctx, c, nil, tk, Options{Identity: id, Clock: clk, Logs: LogsNone, Execer: noExec{}, Logger: testLogger()})
		ch <- result{o, err}
	}()
	return ch, id
}

// runPod is the name of the one pod of run id ("" when there is none yet):
// its name holds the nonce of the record the run made.
func runPod(ctx context.Context, c *fake.Clientset, id task.Identity) string {
	l, err := c.CoreV1().Pods(id.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.RunSelector(id).String()})
	if err != nil || len(l.Items) != 1 {
		return ""
	}
	return l.Items[0].Name
}

// poll waits for cond with a real-time deadline (the fake clock only drives the runner).
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The schedule timeout fires from Derive's Recheck on the injected clock, not
// on the wall clock.
func TestRunScheduleTimeoutOnInjectedClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c := newFake(clk)
	tk := parseTask(t, `{"apiVersion":"kubetask.dev/v1alpha1","kind":"Task","metadata":{"name":"t"},
"spec":{"timeouts":{"schedule":"10m"},"template":{"spec":{"containers":[{"name":"base","image":"busybox","command":["true"]}]}}}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done, id := start(ctx, t, c, tk, clk)
	var name string
	poll(t, "the pod and the runner's recheck timer", func() bool {
		name = runPod(ctx, c, id)
		return name != "" && clk.HasWaiters()
	})
	clk.Step(9 * time.Minute)
	select {
	case r := <-done:
		t.Fatalf("finished before the schedule timeout: %+v %v", r.out, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	clk.Step(2 * time.Minute)
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome after the schedule timeout passed on the fake clock")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out.Reason != podstate.ReasonScheduleTimeout || r.out.Cleanup != "deleted" {
		t.Errorf("outcome %+v, want ScheduleTimeout, deleted", r.out)
	}
	if _, err := c.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{}); err == nil {
		t.Error("pod not deleted")
	}
}

// Main exited 0 while a sidecar runs, cleanup Keep: the runner lowers
// activeDeadlineSeconds, waits until the kubelet reports the pod finished,
// then releases its finalizer; the outcome is the main container's.
func TestRunKeepStopsSidecar(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c := newFake(clk)
	tk := parseTask(t, `{"apiVersion":"kubetask.dev/v1alpha1","kind":"Task","metadata":{"name":"t"},
"spec":{"mainContainer":"base","cleanup":"Keep","template":{"spec":{"containers":[
 {"name":"base","image":"busybox","command":["true"]},{"name":"envoy","image":"envoy","command":["sleep","inf"]}]}}}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done, id := start(ctx, t, c, tk, clk)
	var (
		name string
		pod  *corev1.Pod
	)
	poll(t, "the pod", func() bool {
		if name = runPod(ctx, c, id); name == "" {
			return false
		}
		var err error
		pod, err = c.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{})
		return err == nil
	})
	// The kubelet: main exited 0 a minute after start, the sidecar runs on.
	started := metav1.NewTime(clk.Now())
	clk.Step(time.Minute)
	pod.Spec.NodeName = "node"
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &started, ContainerStatuses: []corev1.ContainerStatus{
		{Name: "base", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed",
			StartedAt: started, FinishedAt: metav1.NewTime(clk.Now())}}},
		{Name: "envoy", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}},
	}}
	if _, err := c.CoreV1().Pods("ns").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "activeDeadlineSeconds lowered", func() bool {
		p, err := c.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Spec.ActiveDeadlineSeconds != nil {
			pod = p
			return true
		}
		return false
	})
	if got := *pod.Spec.ActiveDeadlineSeconds; got < 60 || got > 62 {
		t.Errorf("activeDeadlineSeconds %d, want just after now (61)", got)
	}
	if !slices.Contains(pod.Finalizers, task.Finalizer) {
		t.Fatal("finalizer released before the pod's containers stopped")
	}
	// The kubelet stops the pod.
	pod.Status.Phase, pod.Status.Reason = corev1.PodFailed, "DeadlineExceeded"
	pod.Status.ContainerStatuses[1].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 143}}
	if _, err := c.CoreV1().Pods("ns").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out.Phase != podstate.Succeeded || r.out.Cleanup != "kept" {
		t.Errorf("outcome %+v, want Succeeded, kept", r.out)
	}
	p, err := c.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(p.Finalizers, task.Finalizer) {
		t.Error("finalizer not released")
	}
}

type noExec struct{}

func (noExec) Exec(context.Context, string, string, string, []string, io.Writer, io.Writer) error {
	return errors.New("no exec in unit tests")
}

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// TestRunRefusesAmbiguousRun: two unfinished pods of the run: Run returns
// ErrAmbiguous at once (it does not hang) and creates nothing.
func TestRunRefusesAmbiguousRun(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c := newFake(clk)
	tk := parseTask(t, `{"apiVersion":"kubetask.dev/v1alpha1","kind":"Task","metadata":{"name":"t"},
"spec":{"template":{"spec":{"containers":[{"name":"base","image":"busybox","command":["true"]}]}}}}`)
	id := task.Identity{Namespace: "ns", Name: tk.Name, RunID: "cli-test", Executor: "cli-test"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range []int{0, 1} {
		p, err := task.BuildPod(tk, id, n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Pods("ns").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Run(ctx, c, nil, tk, Options{Identity: id, Clock: clk, Logs: LogsNone, Execer: noExec{}, Logger: testLogger()})
	if !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("err %v, want ErrAmbiguous", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run hung until the test's deadline")
	}
	l, _ := c.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
	if len(l.Items) != 2 {
		t.Errorf("%d pods, want the 2 there were", len(l.Items))
	}
}

// TestRunAttachNamesThePodFromTheEvent: when Run attaches to an earlier run's
// pod, the executor reports the adoption from within Submit, so the event can
// be handled before acquire notes the pod's name. The "attached" event and the
// log follower must still name the pod: before the fix the event said no pod
// and the follower, given no pod name, ended at once without streaming a
// line (TestRunAttachAfterKill, test/e2e/run, failed so once in CI).
func TestRunAttachNamesThePodFromTheEvent(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c := newFake(clk)
	tk := parseTask(t, `{"apiVersion":"kubetask.dev/v1alpha1","kind":"Task","metadata":{"name":"t"},
"spec":{"template":{"spec":{"containers":[{"name":"base","image":"busybox","command":["sh","-c","exit 5"]}]}}}}`)
	id := task.Identity{Namespace: "ns", Name: tk.Name, RunID: "cli-test", Executor: "cli-test", Nonce: "killedrun"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod, err := task.BuildPod(tk, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	started := metav1.NewTime(clk.Now())
	pod.Spec.NodeName = "node"
	pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, StartTime: &started, ContainerStatuses: []corev1.ContainerStatus{
		{Name: "base", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 5, Reason: "Error",
			StartedAt: started, FinishedAt: started}}},
	}}
	if _, err := c.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	events := make(chan Event, 100)
	handled := make(chan struct{})
	var once sync.Once
	testHookAfterSubmit = func() {
		// Hold acquire until the run has handled the adoption (or long enough
		// to show it does not before acquire goes on).
		select {
		case <-handled:
		case <-time.After(5 * time.Second):
		}
	}
	defer func() { testHookAfterSubmit = nil }()
	var (
		linesMu sync.Mutex
		lines   []string
	)
	out, err := Run(ctx, c, nil, tk, Options{Identity: task.Identity{Namespace: "ns", Name: tk.Name, RunID: "cli-test", Executor: "cli-test"},
		Clock: clk, Logs: LogsMain, Execer: noExec{}, Logger: testLogger(), AttachOnly: true,
		OnEvent: func(e Event) {
			events <- e
			if e.Type == "attached" {
				once.Do(func() { close(handled) })
			}
		},
		OnLog: func(l LogLine) {
			linesMu.Lock()
			lines = append(lines, l.Text)
			linesMu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	close(events)
	var attached *Event
	for e := range events {
		if e.Type == "attached" {
			attached = &e
			break
		}
	}
	if attached == nil || attached.Pod != "ns/"+pod.Name {
		t.Errorf("attached event %+v, want one naming ns/%s", attached, pod.Name)
	}
	if !out.Attached || out.Pod != pod.Name || out.ExitCode == nil || *out.ExitCode != 5 {
		t.Errorf("outcome %+v, want attached to %s, exit code 5", out, pod.Name)
	}
	linesMu.Lock()
	defer linesMu.Unlock()
	if len(lines) == 0 {
		t.Error("the attached run streamed no line of the main container's log")
	}
}
