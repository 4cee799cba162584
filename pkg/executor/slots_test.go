package executor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// TestCreation: a new task's pod is created outside the sync pass (no API
// request from the worker), recorded as created once, and the slot it takes
// is counted until the cache shows the pod.
func TestCreation(t *testing.T) {
	f := newFx(t, func(c *Config) { c.Parallelism = 1 })
	f.submit("a", newTask())
	if _, verbs, err := f.sync("a"); err != nil || len(verbs) != 0 {
		t.Fatalf("first pass: err %v, requests %v (creation must not run on the worker)", err, verbs)
	}
	if s := f.state("a"); s != "Pending/Creating" {
		t.Errorf("state %s", s)
	}
	if got := f.drainCreations(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("creations %v", got)
	}
	name := task.PodName(identOf(f, "a"), 0)
	if f.serverPod(name) == nil {
		t.Fatal("pod not created")
	}
	// The cache has not shown the pod yet: still one slot in use.
	f.submit("b", newTask())
	if _, _, err := f.sync("b"); err != nil {
		t.Fatal(err)
	}
	if s := f.state("b"); s != "Pending/WaitingForSlot" {
		t.Errorf("b: state %s, want Pending/WaitingForSlot (a's creation holds the slot)", s)
	}
	if _, verbs, err := f.sync("a"); err != nil || len(verbs) != 0 {
		t.Fatalf("pass after creation: err %v, requests %v", err, verbs)
	}
	if r := f.record("a"); !r.PodCreated {
		t.Error("creation not recorded")
	}
	if got := f.eventTypes("a"); !slices.Equal(got, []string{"PodCreated"}) {
		t.Errorf("events %v", got)
	}
	// The cache shows it; the expectation is met and dropped; b still waits.
	f.cache(f.serverPod(name))
	f.ex.podEvent(compactPod(f.serverPod(name)), false)
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.ex.creationOf("a"); ok {
		t.Error("creation entry kept after the cache showed the pod")
	}
	if _, _, err := f.sync("b"); err != nil || f.state("b") != "Pending/WaitingForSlot" {
		t.Errorf("b: err %v, state %s", err, f.state("b"))
	}
	// a's pod leaves the cache: b takes the slot.
	f.uncache(f.serverPod(name))
	if _, _, err := f.sync("b"); err != nil || f.state("b") != "Pending/Creating" {
		t.Errorf("b after a's pod left: err %v, state %s", err, f.state("b"))
	}
}

// TestCreationAnswers: what a creation's answer from the API server means.
func TestCreationAnswers(t *testing.T) {
	cases := map[string]struct {
		setup  func(f *fx, pod *corev1.Pod)
		state  string
		events []string
		err    bool
	}{
		"AlreadyExists, the pod is the task's (created before a restart): adopted": {
			setup:  func(f *fx, pod *corev1.Pod) { f.server(pod) },
			state:  "Pending/Scheduling",
			events: []string{"PodAdopted"},
		},
		"AlreadyExists, the pod is another run's: the task fails, the pod is left alone": {
			setup: func(f *fx, pod *corev1.Pod) { f.server(foreign(pod)) },
			state: "Failed/ConfigError", events: []string{"AttemptFinished"},
		},
		"Invalid (the API server rejects the pod): the task fails with the server's reasons": {
			setup: func(f *fx, _ *corev1.Pod) {
				f.reactorError("create", "pods", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "p",
					field.ErrorList{field.Invalid(field.NewPath("spec", "containers").Index(0).Child("image"), "", "required")}))
			},
			state: "Failed/ConfigError", events: []string{"AttemptFinished"},
		},
		"429 / exceeded quota: shown in the state, retried after a backoff": {
			setup: func(f *fx, _ *corev1.Pod) {
				f.reactorError("create", "pods", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("exceeded quota: pods=10")))
			},
			state: "Pending/CreateFailed",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFx(t, nil)
			f.submit("a", newTask())
			pod := f.podOf("a", 0, created())
			tc.setup(f, pod)
			if _, _, err := f.sync("a"); err != nil {
				t.Fatal(err)
			}
			f.drainCreations()
			_, _, err := f.sync("a")
			if (err != nil) != tc.err {
				t.Errorf("err %v, want error %v", err, tc.err)
			}
			if s := f.state("a"); s != tc.state {
				t.Errorf("state %s, want %s (%s)", s, tc.state, f.record("a").Message)
			}
			if got := f.eventTypes("a"); !slices.Equal(got, tc.events) {
				t.Errorf("events %v, want %v", got, tc.events)
			}
			if _, ok := f.ex.creationOf("a"); ok && tc.state != "Pending/Scheduling" {
				t.Error("a failed creation still holds a slot")
			}
		})
	}
}

// TestParallelismIsFIFOAndCountsPods (defect f): slots are counted from the
// pods that exist, never by hand; waiting tasks start in submission order,
// whoever syncs first; a cancelled waiter passes its turn at once.
func TestParallelismIsFIFOAndCountsPods(t *testing.T) {
	f := newFx(t, func(c *Config) { c.Parallelism = 2 })
	for _, id := range []string{"a", "b", "c", "d"} {
		f.submit(id, newTask())
		f.clk.Step(time.Second) // distinct submission times
	}
	// A pod of another task of this instance exists (say, kept from before):
	// it holds a slot.
	f.submit("old", newTask())
	f.update("old", func(r *store.Record) { r.PodCreated = true })
	f.both(f.podOf("old", 0, running()))
	// Newest first: d, c, b, a. Only a (the oldest) may take the free slot.
	for _, id := range []string{"d", "c", "b", "a"} {
		if _, _, err := f.sync(id); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{"a": "Pending/Creating", "b": "Pending/WaitingForSlot", "c": "Pending/WaitingForSlot", "d": "Pending/WaitingForSlot"}
	for id, s := range want {
		if got := f.state(id); got != s {
			t.Errorf("%s: %s, want %s", id, got, s)
		}
	}
	// b is cancelled while waiting: c is next, not d.
	if err := f.ex.Cancel(f.ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.sync("b"); err != nil || f.state("b") != "Failed/Cancelled" {
		t.Fatalf("b: %v %s", err, f.state("b"))
	}
	f.uncache(f.podOf("old", 0, running())) // the old pod is gone
	for _, id := range []string{"d", "c"} {
		if _, _, err := f.sync(id); err != nil {
			t.Fatal(err)
		}
	}
	if f.state("c") != "Pending/Creating" || f.state("d") != "Pending/WaitingForSlot" {
		t.Errorf("c %s, d %s: want c admitted before d", f.state("c"), f.state("d"))
	}
}

// TestNextAttemptWaitsForThePreviousPodToStop (defect b): a retry is not
// created while the previous attempt's pod may still run.
func TestNextAttemptWaitsForThePreviousPodToStop(t *testing.T) {
	f := newFx(t, nil)
	f.submit("a", newTask(retryOn("Infrastructure")))
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	// Evicted; the kubelet has stopped main (143) but envoy still runs its grace period... and then
	// the pod ends. First the eviction while everything runs: no decision.
	old := f.podOf("a", 0, running().DisruptionTarget("EvictionByEvictionAPI", "drain").Deleted(30*time.Second))
	f.both(old)
	if _, _, err := f.sync("a"); err != nil || f.state("a") != "Running/Stopping" {
		t.Fatalf("%v %s", err, f.state("a"))
	}
	// main is killed; envoy has not stopped yet: still no decision.
	w := running().DisruptionTarget("EvictionByEvictionAPI", "drain").Deleted(30 * time.Second).After(time.Second).On("main").Terminated(143)
	f.both(f.podOf("a", 0, w))
	f.clk.SetTime(w.Now())
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	// main terminated by the signal: the outcome is known (Evicted, retryable)
	// and recorded; the retry waits for the backoff and for the pod to stop.
	if r := f.record("a"); len(r.Attempts) != 1 || r.Attempts[0].Reason != "Evicted" || r.Attempt != 1 {
		t.Fatalf("record %+v", r.Attempts)
	}
	f.clk.Step(time.Minute) // past the backoff
	if _, verbs, err := f.sync("a"); err != nil || f.state("a") != "Pending/WaitingForPreviousPod" || len(verbs) != 0 {
		t.Fatalf("%v %s %v", err, f.state("a"), verbs)
	}
	if _, ok := f.ex.creationOf("a"); ok {
		t.Fatal("attempt 1 admitted while attempt 0's pod runs")
	}
	// The kubelet is done: the pod ends, attempt 0's pod is released, attempt 1 starts.
	f.both(f.podOf("a", 0, w.On("envoy").Terminated(143).Phase(corev1.PodFailed)))
	if _, _, err := f.sync("a"); err != nil || f.state("a") != "Pending/Creating" {
		t.Fatalf("%v %s", err, f.state("a"))
	}
	if p := f.serverPod(task.PodName(identOf(f, "a"), 0)); hasFinalizer(p) {
		t.Error("attempt 0's pod not released")
	}
}

// TestNextAttemptWaitsForAPreviousPodTheCacheDoesNotShow (simulation seed
// 110000675): the outcome of a Keep task's attempt is decided on a fresh
// read while the watch lags, so the cache has never shown the pod, whose
// sidecar still runs. The retry waits for it as for a pod the cache shows,
// and the pod is stopped meanwhile; once this process saw it stopped, a
// later start asks the API server no more.
func TestNextAttemptWaitsForAPreviousPodTheCacheDoesNotShow(t *testing.T) {
	f := newFx(t, nil)
	f.submit("a", newTask(keep, retryOn("ExitCode")))
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	w := mainExited(1)
	old := f.podOf("a", 0, w)
	old.UID = "u-0"
	f.server(old) // the cache shows nothing of it
	f.update("a", func(r *store.Record) { r.PodUID = "u-0" })
	f.clk.SetTime(w.Now())
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	if r := f.record("a"); len(r.Attempts) != 1 || r.Attempts[0].PodUID != "u-0" || r.Attempt != 1 {
		t.Fatalf("record %+v", r.Attempts)
	}
	f.clk.Step(time.Hour) // past the backoff; the watch still shows nothing
	if _, _, err := f.sync("a"); err != nil || f.state("a") != "Pending/WaitingForPreviousPod" {
		t.Fatalf("%v %s", err, f.state("a"))
	}
	if _, ok := f.ex.creationOf("a"); ok {
		t.Fatal("attempt 1 admitted while attempt 0's pod, which the cache does not show, runs")
	}
	if p := f.serverPod(old.Name); p == nil || p.Spec.ActiveDeadlineSeconds == nil {
		t.Errorf("attempt 0's kept pod is not being stopped: %+v", p)
	}
	// The kubelet is done with it: attempt 1 starts.
	stopped := f.podOf("a", 0, w.On("envoy").Terminated(0).Phase(corev1.PodFailed))
	stopped.UID = "u-0"
	f.server(stopped)
	if _, _, err := f.sync("a"); err != nil || f.state("a") != "Pending/Creating" {
		t.Fatalf("%v %s", err, f.state("a"))
	}
	// Seen stopped: the next pass asks the API server nothing about it.
	f.ex.dropCreation("a")
	if _, verbs, err := f.sync("a"); err != nil || slices.Contains(verbs, "get pods") {
		t.Fatalf("%v %v", err, verbs)
	}
}

// TestNextAttemptAfterAPodReleasedWithItsDeleteAsksNothing: a finished pod
// with nothing left to read is deleted and released in one call and never
// seen again; it was seen stopped then, so the next attempt starts without
// reading it from the API server (test/costs' retry path counts requests).
func TestNextAttemptAfterAPodReleasedWithItsDeleteAsksNothing(t *testing.T) {
	f := newFx(t, nil)
	f.submit("a", newTask(retryOn("ExitCode")))
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	w := mainExited(3).On("envoy").Terminated(0).Phase(corev1.PodFailed)
	old := f.podOf("a", 0, w)
	f.both(old)
	f.update("a", func(r *store.Record) { r.PodUID = string(old.UID) })
	f.clk.SetTime(w.Now())
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	if f.serverPod(old.Name) != nil {
		t.Fatalf("attempt 0's finished pod was not deleted and released at once: %+v", f.serverPod(old.Name).ObjectMeta)
	}
	f.reflect(old.Name)
	f.clk.Step(time.Hour)
	_, verbs, err := f.sync("a")
	if err != nil || f.state("a") != "Pending/Creating" {
		t.Fatalf("%v %s", err, f.state("a"))
	}
	if slices.Contains(verbs, "get pods") {
		t.Errorf("requests %v: attempt 0's pod, seen stopped, was read again", verbs)
	}
}

// TestUnknownTaskPodsAreReleasedAndDeleted: a pod of this instance whose
// task the store does not know is released and deleted (nobody could report
// it); a pod of another instance is left alone.
func TestUnknownTaskPodsAreReleasedAndDeleted(t *testing.T) {
	f := newFx(t, nil)
	f.submit("gone", newTask())
	pod := f.podOf("gone", 0, running())
	other := foreign(pod)
	other.Name, other.Labels[task.LabelExecutor] = "other", "another-instance"
	f.both(pod)
	f.both(other)
	st := store.NewMemory() // a fresh store: the task is unknown
	f.ex.store = st
	_, verbs, err := f.sync("gone")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(verbs, []string{"patch pods", "delete pods"}) {
		t.Errorf("requests %v", verbs)
	}
	if f.serverPod("other") == nil {
		t.Error("another instance's pod was touched")
	}
}

// TestHoldTimeout: an embedding that never lets go of a decided pod delays
// its clean-up by HoldTimeout at most.
func TestHoldTimeout(t *testing.T) {
	f := newFx(t, func(c *Config) {
		c.Hold = func(string, int) bool { return true }
		c.HoldTimeout = time.Minute
	})
	f.submit("a", newTask())
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	w := mainExited(0)
	f.both(f.podOf("a", 0, w))
	f.clk.SetTime(w.Now())
	if d, verbs, err := f.sync("a"); err != nil || len(verbs) != 0 || d != time.Minute {
		t.Fatalf("held: %s %v %v", d, err, verbs)
	}
	f.clk.Step(time.Minute)
	if _, verbs, err := f.sync("a"); err != nil || !slices.Equal(verbs, []string{"delete pods"}) {
		t.Fatalf("after the hold timeout: %v %v", err, verbs)
	}
}

// TestScheduleTimeoutCountsFromUngating (defect j): the schedule timeout
// counts from when the executor saw the pod's scheduling gates removed.
func TestScheduleTimeoutCountsFromUngating(t *testing.T) {
	f := newFx(t, nil)
	f.submit("a", newTask())
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	gated := podtest.MakePod("p", "ns").Main("main").Sidecar("envoy").SchedulingGated()
	f.both(f.podOf("a", 0, gated))
	f.clk.SetTime(podtest.T0.Add(time.Hour))
	if _, _, err := f.sync("a"); err != nil || f.state("a") != "Pending/Scheduling" {
		t.Fatalf("%v %s", err, f.state("a"))
	}
	// Admitted by the queue after an hour; unschedulable for 9 minutes: waiting.
	f.both(f.podOf("a", 0, podtest.MakePod("p", "ns").Main("main").Sidecar("envoy").SchedulingGated().Ungated().Unschedulable("0/1 nodes")))
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	f.clk.Step(9 * time.Minute)
	if _, _, err := f.sync("a"); err != nil || f.state("a") != "Pending/Unschedulable" {
		t.Fatalf("9 minutes after ungating: %v %s", err, f.state("a"))
	}
	f.clk.Step(2 * time.Minute)
	if _, _, err := f.sync("a"); err != nil || f.state("a") != "Pending/Stopping" {
		t.Fatalf("11 minutes after ungating: %v %s, want the pod, never bound, deleted first", err, f.state("a"))
	}
	f.reflect(task.PodName(identOf(f, "a"), 0))
	if _, _, err := f.sync("a"); err != nil || f.state("a") != "Failed/ScheduleTimeout" {
		t.Fatalf("11 minutes after ungating, the deletion shown: %v %s", err, f.state("a"))
	}
}

// TestAdoptedTaskLeavesTheLine: a task whose pod exists when it is first
// synced (created before a restart, or attached) holds its slot through the
// cache and never blocks the line.
func TestAdoptedTaskLeavesTheLine(t *testing.T) {
	f := newFx(t, func(c *Config) { c.Parallelism = 1 })
	f.submit("x", newTask())
	pod := f.podOf("x", 0, running())
	f.both(pod)
	if _, verbs, err := f.sync("x"); err != nil || len(verbs) != 0 || f.state("x") != "Running/Running" {
		t.Fatalf("x: %v %v %s", err, verbs, f.state("x"))
	}
	if got := f.eventTypes("x"); !slices.Equal(got, []string{"PodAdopted"}) {
		t.Errorf("events %v", got)
	}
	f.clk.Step(time.Second)
	f.submit("y", newTask())
	f.uncache(pod)
	if _, _, err := f.sync("y"); err != nil || f.state("y") != "Pending/Creating" {
		t.Fatalf("y: %v %s", err, f.state("y"))
	}
}

// TestCleanupRunsOffTheWorkers: the pass that records an outcome makes no
// API request itself; the clean-up it decides runs on a cleaner (for a pod
// that has finished, the delete and the release in one action), and the
// release is reported once, by the next pass, also when the pod is gone.
// The delete goes first and the release after it returns: sent at once,
// the two writes of one pod race inside the API server, which then reads
// and writes again (test/costs bounds it against the real one).
func TestCleanupRunsOffTheWorkers(t *testing.T) {
	f := newFx(t, nil)
	f.submit("a", newTask())
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	w := mainExited(0).On("envoy").Terminated(0).Phase(corev1.PodSucceeded)
	f.both(f.podOf("a", 0, w))
	f.clk.SetTime(w.Now())
	f.client.ClearActions()
	if _, err := f.ex.sync(f.ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if n := len(f.client.Actions()); n != 0 {
		t.Fatalf("the recording pass made %d API requests: %v", n, f.client.Actions())
	}
	if r := f.record("a"); !r.Terminal {
		t.Fatal("outcome not recorded")
	}
	f.drainCleanups() // the delete, then the release (actDeleteRelease)
	if got := f.actionVerbs(); !slices.Equal(got, []string{"delete pods", "patch pods"}) {
		t.Fatalf("clean-up requests %v, want the delete, then the release", got)
	}
	name := task.PodName(identOf(f, "a"), 0)
	if p := f.serverPod(name); p != nil && hasFinalizer(p) {
		t.Fatal("not released")
	}
	f.uncache(f.podOf("a", 0, w)) // gone
	for range 2 {
		if _, _, err := f.sync("a"); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.eventTypes("a"); !slices.Equal(got, []string{"AttemptFinished", "PodDeleting", "PodReleased"}) {
		t.Errorf("events %v", got)
	}
}

// TestFinalizerStaysUntilLogsAreArchived: with CaptureLogs, a capture runs
// per kept container from the time the pod exists, and the pod's finalizer
// is released only after every capture of the attempt returned.
func TestFinalizerStaysUntilLogsAreArchived(t *testing.T) {
	release := make(chan struct{})
	started := make(chan LogCapture, 4)
	f := newFx(t, func(c *Config) {
		c.CaptureLogs = func(ctx context.Context, lc LogCapture) error {
			started <- lc
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	f.submit("a", newTask(func(tk *task.Task) { tk.Spec.Logs.Containers = []string{"main", "envoy"} }))
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	f.both(f.podOf("a", 0, running()))
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for range 2 {
		select {
		case lc := <-started:
			got[lc.Container] = true
		case <-time.After(5 * time.Second):
			t.Fatal("captures not started while the attempt runs")
		}
	}
	if !got["main"] || !got["envoy"] {
		t.Errorf("captures %v", got)
	}
	w := mainExited(0).On("envoy").Terminated(0).Phase(corev1.PodSucceeded)
	f.both(f.podOf("a", 0, w))
	f.clk.SetTime(w.Now())
	if _, _, err := f.sync("a"); err != nil { // records, deletes
		t.Fatal(err)
	}
	deleting := f.podOf("a", 0, w.Deleted(0))
	f.both(deleting)
	if _, verbs, err := f.sync("a"); err != nil || len(verbs) != 0 {
		t.Fatalf("released before the logs were archived: %v %v", verbs, err)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, verbs, err := f.sync("a")
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(verbs, []string{"patch pods"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not released after the captures returned (last requests %v)", verbs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestForcedDeletionEndsTheLogCapture: a pod deleted with grace period 0
// while its containers' statuses still say Running (an eviction on a node
// that does not stop containers, like kwok's; a forced deletion on a lost
// node) runs nothing any more. Its capture, told so by LogCapture.Progress,
// ends, and the finalizer is released: before, Progress kept saying the
// main container ran, the capture waited for ever and the pod stayed
// Terminating with the finalizer (found by TestChaosTiny: invariants 5, 6).
func TestForcedDeletionEndsTheLogCapture(t *testing.T) {
	f := newFx(t, func(c *Config) {
		c.CaptureLogs = func(ctx context.Context, lc LogCapture) error {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for !lc.Progress().Terminated { // what podlog.Follower waits for
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-lc.Changed:
				case <-tick.C:
				}
			}
			return nil
		}
	})
	f.submit("a", newTask(retryOn("Evicted")))
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	w := running()
	f.both(f.podOf("a", 0, w))
	f.clk.SetTime(w.Now())
	if _, _, err := f.sync("a"); err != nil { // starts the capture
		t.Fatal(err)
	}
	w = w.DisruptionTarget("EvictionByEvictionAPI", "Eviction API: evicting").Deleted(0)
	f.both(f.podOf("a", 0, w))
	// A live kubelet would report the containers' final states now: the
	// outcome waits for that report, at most finalReportSettle.
	if d, verbs, err := f.sync("a"); err != nil || d != finalReportSettle || len(verbs) != 0 || f.state("a") != "Running/Stopping" {
		t.Fatalf("before the final report: requeue %s, requests %v, state %s, err %v; want %s, none, Running/Stopping",
			d, verbs, f.state("a"), err, finalReportSettle)
	}
	f.clk.Step(finalReportSettle)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, verbs, err := f.sync("a")
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(verbs, "patch pods") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the evicted pod's finalizer is not released (state %s, last requests %v)", f.state("a"), verbs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec := f.record("a")
	if len(rec.Attempts) != 1 || rec.Attempts[0].Reason != "Evicted" || rec.Terminal {
		t.Errorf("record: attempts %+v, terminal %v; want attempt 0 Evicted and another attempt", rec.Attempts, rec.Terminal)
	}
	if p := f.serverPod(task.PodName(identOf(f, "a"), 0)); p != nil && hasFinalizer(p) {
		t.Error("the finalizer is still on the pod")
	}
}

// TestCreationBackoff: a creation that keeps failing (here: the namespace
// does not exist) is retried after a backoff of its own that grows (the work
// queue's is reset by every pass that hands the pod to a creator), no
// creation is tried before it passes, and the schedule timeout, from the
// first failure, ends the task.
func TestCreationBackoff(t *testing.T) {
	f := newFx(t, nil)
	f.submit("a", newTask(func(t *task.Task) { t.Spec.Timeouts.Schedule = task.Duration("1m") }))
	f.reactorError("create", "pods", apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "ns"))
	var delays []time.Duration
	for f.state("a") != "Failed/ScheduleTimeout" {
		if len(delays) > 20 {
			t.Fatalf("no ScheduleTimeout after %d failed creations: delays %v", len(delays), delays)
		}
		if _, _, err := f.sync("a"); err != nil { // hands the pod to a creator
			t.Fatal(err)
		}
		if n := len(f.drainCreations()); n != 1 {
			t.Fatalf("%d creations, want 1", n)
		}
		d, _, err := f.sync("a") // the creation's answer
		if err != nil {
			t.Fatal(err)
		}
		if f.state("a") == "Failed/ScheduleTimeout" {
			break
		}
		delays = append(delays, d)
		// Before the backoff passes, no creation is tried.
		f.clk.Step(d / 2)
		if again, _, err := f.sync("a"); err != nil || again <= 0 || len(f.drainCreations()) != 0 {
			t.Fatalf("a pass within the backoff: requeue %v, err %v, or a creation was tried", again, err)
		}
		f.clk.Step(d - d/2)
	}
	if len(delays) < 3 || delays[0] != createBackoffFirst || delays[1] != 2*createBackoffFirst || delays[len(delays)-1] > createBackoffCap {
		t.Errorf("delays %v: want from %s, doubling, at most %s", delays, createBackoffFirst, createBackoffCap)
	}
	if msg := f.record("a").Message; !strings.Contains(msg, "could not be created for 1m0s") || !strings.Contains(msg, "not found") {
		t.Errorf("message %q", msg)
	}
}

// TestCleanupOfAFinishedPod: a pod whose phase is final (every container
// terminated for good) is deleted and released by one clean-up action; a
// pod that may still run something (a sidecar) is deleted only, and
// released once the cache shows it stopped.
func TestCleanupOfAFinishedPod(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *podtest.PodWrapper
		want []string
	}{
		{"succeeded", mainExited(0).On("envoy").Terminated(0).Phase(corev1.PodSucceeded), []string{"delete pods", "patch pods"}},
		{"failed", mainExited(3).On("envoy").Terminated(0).Phase(corev1.PodFailed), []string{"delete pods", "patch pods"}},
		{"sidecar still running", mainExited(0), []string{"delete pods"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, nil)
			f.submit("a", newTask())
			f.update("a", func(r *store.Record) { r.PodCreated = true })
			f.both(f.podOf("a", 0, tc.pod))
			f.clk.SetTime(tc.pod.Now())
			if _, err := f.ex.sync(f.ctx, "a"); err != nil {
				t.Fatal(err)
			}
			if !f.record("a").Terminal {
				t.Fatal("outcome not recorded")
			}
			f.client.ClearActions()
			f.drainCleanups()
			if got := slices.Sorted(slices.Values(f.actionVerbs())); !slices.Equal(got, tc.want) {
				t.Errorf("clean-up requests %v, want %v", got, tc.want)
			}
		})
	}
}

// TestReleaseWaitsForTheDelete: a finished pod's release is sent once its
// deletion has been answered, never beside it: two writes of one pod at
// once race inside the API server, which reads and writes the loser again
// (test/costs counts it in etcd's requests of the real one). The stand-in
// API server holds the DELETE's answer for a while, long enough for a
// release sent beside it to arrive meanwhile; a fake clientset cannot show
// it: it serialises requests.
func TestReleaseWaitsForTheDelete(t *testing.T) {
	f := newFx(t, nil)
	f.submit("a", newTask())
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	pod := mainExited(0).On("envoy").Terminated(0).Phase(corev1.PodSucceeded)
	p := f.podOf("a", 0, pod)
	f.both(p)
	f.clk.SetTime(pod.Now())
	if _, err := f.ex.sync(f.ctx, "a"); err != nil {
		t.Fatal(err)
	}
	patched := make(chan struct{})
	var (
		once     sync.Once
		mu       sync.Mutex
		deleting bool // a DELETE arrived and is not answered yet
		order    []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if r.Method == http.MethodPatch && deleting {
			order = append(order, "PATCH while the DELETE was unanswered")
		} else {
			order = append(order, r.Method)
		}
		deleting = deleting || r.Method == http.MethodDelete
		mu.Unlock()
		switch r.Method {
		case http.MethodPatch:
			once.Do(func() { close(patched) })
		case http.MethodDelete:
			select {
			case <-patched:
			case <-time.After(300 * time.Millisecond): // no release came beside it
			}
			mu.Lock()
			deleting = false
			mu.Unlock()
		default:
			http.Error(w, r.Method, http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(p)
	}))
	defer srv.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	f.ex.client = client
	f.drainCleanups()
	if a, ok := f.ex.actionOf(p.Namespace + "/" + p.Name); !ok || !a.done || a.err != nil {
		t.Errorf("clean-up action done %v, err %v (found %v), want done without error", a.done, a.err, ok)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(order, []string{http.MethodDelete, http.MethodPatch}) {
		t.Errorf("requests %q, want the DELETE, then the release's PATCH", order)
	}
}

// failingUpdates is a store whose record updates fail while fail is set.
type failingUpdates struct {
	store.Store
	fail atomic.Bool
}

func (s *failingUpdates) Update(ctx context.Context, rec store.Record) (store.Record, error) {
	if s.fail.Load() {
		return store.Record{}, errors.New("connection reset by peer")
	}
	return s.Store.Update(ctx, rec)
}

// TestProgressIsStoredBeforeItIsShown: a pod's new state reaches Get and the
// State event only once the record has it, so a client that saw it in Get
// (or a watch) and then lists finds it there too. Before, Get showed the
// state at once and the record was written after: TestServePendingSaysWhy
// listed "Starting" for a task Get had just shown as ConfigError.
func TestProgressIsStoredBeforeItIsShown(t *testing.T) {
	var st *failingUpdates
	f := newFx(t, func(c *Config) {
		st = &failingUpdates{Store: c.Store}
		c.Store = st
	})
	f.submit("a", newTask())
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	w := running()
	f.both(f.podOf("a", 0, w))
	f.clk.SetTime(w.Now())
	st.fail.Store(true)
	if _, _, err := f.sync("a"); err == nil {
		t.Fatal("the pass succeeded though the record could not be written")
	}
	got, err := f.ex.Get(f.ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.Reason == "Running" || slices.Contains(f.eventTypes("a"), "State") {
		t.Errorf("Get says %s/%s and events %v before the record has the state", got.Phase, got.Reason, f.eventTypes("a"))
	}
	st.fail.Store(false)
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	if got, stored := f.state("a"), f.record("a"); got != "Running/Running" || stored.Reason != "Running" {
		t.Errorf("after the write: Get %s, record %s/%s", got, stored.Phase, stored.Reason)
	}
}

// TestAReleaseIsReportedWhenItsCallFailedButTookEffect: a finished pod's
// delete and release (one action) whose answer is an error, while the
// finalizer did go, is still reported PodReleased once: when the pod is
// gone (a DELETE the API server applied and answered with a timeout), and
// when the cache shows it without the finalizer (a DELETE that failed
// beside a release that did not); then the pod is deleted. A release that
// failed and left the finalizer on is not reported, and is sent again.
// Before, the error dropped the action and the release was never reported
// (test/bench/executor's fair run waited for its PodReleased for good).
func TestAReleaseIsReportedWhenItsCallFailedButTookEffect(t *testing.T) {
	timeout := apierrors.NewTimeoutError("request did not complete within the allotted timeout", 0)
	for name, c := range map[string]struct {
		verb     string // the request that fails: delete (default) or patch
		reactor  func(f *fx) k8stesting.ReactionFunc
		released bool // the finalizer went
		gone     bool // and the pod with it
		deletes  bool // the DELETE marks the pod deleted, as the API server does a pod with a finalizer
	}{
		"the DELETE applied, answered with a timeout": {
			reactor: func(f *fx) k8stesting.ReactionFunc {
				return func(a k8stesting.Action) (bool, runtime.Object, error) {
					d := a.(k8stesting.DeleteAction)
					_ = f.client.Tracker().Delete(d.GetResource(), d.GetNamespace(), d.GetName())
					return true, nil, timeout
				}
			},
			released: true, gone: true,
		},
		"the DELETE failed, the release did not": {
			reactor: func(*fx) k8stesting.ReactionFunc {
				return func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, timeout }
			},
			released: true,
		},
		"the DELETE applied, the release failed": {
			verb: "patch",
			reactor: func(*fx) k8stesting.ReactionFunc {
				return func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, timeout }
			},
			deletes: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFx(t, nil)
			f.submit("a", newTask())
			f.update("a", func(r *store.Record) { r.PodCreated = true })
			w := mainExited(0).Phase(corev1.PodSucceeded)
			pod := f.podOf("a", 0, w)
			f.both(pod)
			f.clk.SetTime(w.Now())
			verb := cmp.Or(c.verb, "delete")
			f.client.PrependReactor(verb, "pods", c.reactor(f))
			if c.deletes {
				f.client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
					d := a.(k8stesting.DeleteAction) // the tracker, not the client: the reaction holds the client's lock
					obj, err := f.client.Tracker().Get(d.GetResource(), d.GetNamespace(), d.GetName())
					if err != nil {
						return true, nil, err
					}
					p := obj.(*corev1.Pod).DeepCopy()
					now := metav1.NewTime(f.clk.Now())
					p.DeletionTimestamp = &now
					return true, nil, f.client.Tracker().Update(d.GetResource(), p, d.GetNamespace())
				})
			}
			if _, _, err := f.sync("a"); err != nil { // records the outcome; the cleaner's action fails
				t.Fatal(err)
			}
			if f.record("a").Terminal != true {
				t.Fatal("outcome not recorded")
			}
			f.reflect(pod.Name)
			live := f.serverPod(pod.Name)
			if gone := live == nil; gone != c.gone || live != nil && hasFinalizer(live) == c.released {
				t.Fatalf("after the action: gone %v, pod %v; want gone %v, released %v", gone, live, c.gone, c.released)
			}
			if !c.released {
				if _, _, err := f.sync("a"); err == nil {
					t.Error("a pass after the failed release: no error")
				}
				if got := f.eventTypes("a"); slices.Contains(got, "PodReleased") {
					t.Fatalf("events %v: PodReleased while the finalizer is on", got)
				}
			}
			if c.deletes {
				f.client.ReactionChain = f.client.ReactionChain[1:]
			}
			f.client.ReactionChain = f.client.ReactionChain[1:] // the API server answers again
			for range 3 {
				_, _, err := f.sync("a")
				if err != nil {
					t.Logf("pass: %v", err)
				}
				f.reflect(pod.Name)
			}
			if got := f.eventTypes("a"); strings.Count(strings.Join(got, ","), "PodReleased") != 1 {
				t.Errorf("events %v: want PodReleased once", got)
			}
			if p := f.serverPod(pod.Name); p != nil && (p.DeletionTimestamp == nil || hasFinalizer(p)) {
				t.Error("the pod was neither deleted nor released") // the fake API server keeps a deleted pod once released
			}
		})
	}
}
