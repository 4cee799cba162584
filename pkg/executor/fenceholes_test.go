package executor

// The fence's holes found from outside at 016ccbf (issue 31, items 1-4):
// each test failed there, with what went wrong.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// hookStore runs afterGet once, right after the next Get of an armed
// task ID has read the record and before that Get returns it: the worker
// that called Get is descheduled between its store read and its next step
// (a GC pause, a CPU-starved goroutine: go_sched_latencies p99 ~50 ms at
// the load docs/benchmarks.md measures) while other goroutines go on.
type hookStore struct {
	store.Store
	mu       sync.Mutex
	armed    string
	afterGet func()
}

func (s *hookStore) Get(ctx context.Context, id string) (store.Record, error) {
	rec, err := s.Store.Get(ctx, id)
	s.mu.Lock()
	hook := s.afterGet
	if s.armed != id {
		hook = nil
	} else {
		s.armed, s.afterGet = "", nil
	}
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	return rec, err
}

// arm runs fn once, after the next Get of task id.
func (s *hookStore) arm(id string, fn func()) {
	s.mu.Lock()
	s.armed, s.afterGet = id, fn
	s.mu.Unlock()
}

// armWhen runs fn once, after the first Get of task id at which when
// holds (asked after each Get of id).
func (s *hookStore) armWhen(id string, when func() bool, fn func()) {
	s.arm(id, func() {
		if !when() {
			s.armWhen(id, when, fn)
			return
		}
		fn()
	})
}

// A discard is decided only on a record read after the pod was seen. The
// normal sequence, with a worker descheduled for a moment: the creator's
// Create makes the cache's ADD event queue a sync of the task; that sync
// reads the record, and while it is paused the creator records the pod and
// removes its gate, and the cache shows it ungated. The pass must not take
// the term's own recorded, running pod for one whose gate was removed by
// hand (at 016ccbf it deleted it, and the attempt ended DeletedExternally).
func TestSyncKeepsItsOwnCreatorsRecordedPod(t *testing.T) {
	st := &hookStore{}
	f := newFx(t, func(c *Config) { st.Store = c.Store; c.Store = st })
	f.submit("x", newTask())
	if _, _, err := f.sync("x"); err != nil { // admits the creation
		t.Fatal(err)
	}
	name := task.PodName(identOf(f, "x"), 0)
	var shown *corev1.Pod
	st.arm("x", func() {
		// Meanwhile: the creator creates the pod gated, records it (fenced
		// write of this term), removes the gate; the watch delivers the
		// ungated pod to the cache.
		f.drainCreations()
		shown = f.serverPod(name)
		f.cache(shown)
	})
	f.client.ClearActions()
	if _, err := f.ex.sync(f.ctx, "x"); err != nil { // the sync whose first Get was before the record
		t.Fatalf("the pass failed: %v", err)
	}
	f.drainCleanups()
	rec := f.record("x")
	if !rec.PodCreated || rec.PodUID == "" {
		t.Fatalf("the creator did not record the pod: %+v", rec)
	}
	var deleted bool
	for _, a := range f.client.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok && d.GetName() == name {
			deleted = true
		}
	}
	if p := f.serverPod(name); deleted || p == nil || p.DeletionTimestamp != nil {
		// What follows: the attempt's recorded pod is gone.
		f.uncache(shown)
		for range 3 {
			_, _, _ = f.sync("x")
		}
		f.clk.Step(expectationTimeout + time.Second) // the creation's expectation runs out
		for range 3 {
			_, _, _ = f.sync("x")
		}
		t.Errorf("the term discarded its own recorded pod %s (uid %s) right after ungating it; the task is now %s: %s",
			name, rec.PodUID, f.state("x"), f.record("x").Message)
	}
	if s := f.state("x"); s != "Pending/Scheduling" {
		t.Errorf("state %s, want Pending/Scheduling (its pod created and recorded)", s)
	}
}

// A task cancelled while its recorded pod still has the fence's gate (its
// removal failed, or the creator is between its record and its removal)
// never runs: the gate is not removed for a cancelled task, and the pod is
// deleted before the outcome is recorded, so that a removal still on its
// way finds a pod kube-apiserver no longer binds. At 016ccbf the sync that
// recorded Cancelled removed the gate: the main container ran after the
// outcome.
func TestCancelledTasksGatedPodNeverRuns(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask(keep))
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	var failPatch atomic.Bool
	failPatch.Store(true)
	f.client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failPatch.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	f.drainCreations() // created gated and recorded; the gate's removal failed
	name := task.PodName(identOf(f, "x"), 0)
	p := f.serverPod(name)
	if p == nil || !attempt.Fenced(p) || f.record("x").PodUID != string(p.UID) {
		t.Fatalf("want the pod recorded and still gated: %v", p)
	}
	if err := f.ex.Cancel(f.ctx, "x"); err != nil {
		t.Fatal(err)
	}
	failPatch.Store(false)
	var deleted, recordedFirst atomic.Bool
	f.client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.DeleteAction).GetName() == name && !deleted.Swap(true) && f.record("x").Terminal {
			recordedFirst.Store(true)
		}
		return false, nil, nil
	})
	f.cache(p)
	f.client.ClearActions()
	for range 3 {
		_, _ = f.ex.sync(f.ctx, "x")
		f.drainCleanups()
		if live := f.serverPod(name); live != nil {
			f.cache(live)
		} else {
			f.uncache(p)
		}
	}
	if s := f.state("x"); s != "Failed/Cancelled" {
		t.Errorf("state %s, want Failed/Cancelled", s)
	}
	if !deleted.Load() {
		t.Errorf("the gated pod was never deleted")
	}
	if recordedFirst.Load() {
		t.Errorf("the outcome was recorded before the gated pod was deleted")
	}
	var ungated bool
	for _, a := range f.client.Actions() {
		if pa, ok := a.(k8stesting.PatchAction); ok && bytes.Contains(pa.GetPatch(), []byte("/spec/schedulingGates/")) {
			ungated = true
		}
	}
	rec := f.record("x")
	if live := f.serverPod(name); ungated && live != nil && !attempt.Fenced(live) {
		t.Errorf("the pod of cancelled task x (outcome %s/%s recorded) had its fence gate removed: it is scheduled and runs after the cancellation (deleted %v, finalizers %v, released label %q, activeDeadlineSeconds %v)",
			rec.Phase, rec.Reason, live.DeletionTimestamp != nil, live.Finalizers, live.Labels[task.LabelReleased], live.Spec.ActiveDeadlineSeconds)
	}
}

// A task whose template pins its pod to a node (spec.nodeName, documented
// as allowed) runs, fenced like every other: kube-apiserver refuses a pod
// with both nodeName and scheduling gates (ValidatePodCreate, reproduced by
// the reactor below), so the pod is created with a required node affinity
// on the node's name instead, as the DaemonSet controller does. At 016ccbf
// such a task always ended Failed/ConfigError.
func TestNodeNameTaskRunsThroughTheFence(t *testing.T) {
	f := newFx(t, nil)
	f.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		if p.Spec.NodeName != "" && len(p.Spec.SchedulingGates) != 0 {
			return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, p.Name, field.ErrorList{
				field.Forbidden(field.NewPath("spec", "nodeName"), "cannot be set until all schedulingGates have been cleared")})
		}
		return false, nil, nil
	})
	tk := newTask(func(t *task.Task) { t.Spec.Template.Spec.NodeName = "node-1" })
	tk.Namespace = "ns"
	tk.Default()
	if err := tk.Validate(); err != nil {
		t.Fatalf("the task is refused by Validate already: %v", err)
	}
	f.submit("x", tk)
	for range 3 {
		_, _, _ = f.sync("x")
		f.drainCreations()
	}
	if s := f.state("x"); s == "Failed/ConfigError" {
		t.Errorf("a task with spec.nodeName ends %s: %s", s, f.record("x").Message)
	}
	p := f.serverPod(task.PodName(identOf(f, "x"), 0))
	if p == nil {
		t.Fatalf("no pod created; the task is %s", f.state("x"))
	}
	terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if p.Spec.NodeName != "" || len(terms) != 1 || len(terms[0].MatchFields) != 1 ||
		terms[0].MatchFields[0].Key != "metadata.name" || !slices.Equal(terms[0].MatchFields[0].Values, []string{"node-1"}) {
		t.Errorf("the pod is not pinned to node-1 by affinity: nodeName %q, affinity %+v", p.Spec.NodeName, p.Spec.Affinity)
	}
}

// A task adopted from a gone instance (Config.AdoptFrom) whose last term
// crashed between creating the attempt's pod (gated) and recording it: the
// pod's epoch is the old instance's, a count of its own terms that says
// nothing of this instance's. The pod is discarded, never having run, and
// the attempt gets a pod of its own. At 016ccbf the old epoch, higher than
// this instance's, read as a newer term's (fitNewer): the task never
// finished and the gated pod kept its finalizer.
func TestAdoptedInstancesGatedPodIsDiscarded(t *testing.T) {
	f := newFx(t, func(c *Config) { c.AdoptFrom = []string{"old"} })
	old := newFx(t, func(c *Config) { c.InstanceID = "old"; c.RecordOnly = true; c.Store = f.ex.store })
	var oldEpoch int64
	for range 8 { // the old instance's terms: restarts, Lease losses
		e, err := f.ex.store.BeginTerm(f.ctx, "old")
		if err != nil {
			t.Fatal(err)
		}
		oldEpoch = e
	}
	rec := old.submit("x", newTask())
	tkp := newTask()
	tkp.Namespace = "ns"
	tkp.Default()
	pod, err := task.BuildPod(tkp, task.Identity{Namespace: "ns", Name: rec.Name, RunID: "x", Executor: "old", Nonce: rec.Nonce}, 0)
	if err != nil {
		t.Fatal(err)
	}
	pod.UID = types.UID("uid-old-gated")
	pod = fencedPod(pod, oldEpoch)
	f.both(pod)
	if err := f.ex.adopt(f.ctx); err != nil {
		t.Fatal(err)
	}
	if r := f.record("x"); r.Executor != "ex" {
		t.Fatalf("not adopted: executor %s", r.Executor)
	}
	for range 5 {
		_, _, _ = f.sync("x")
		f.drainCleanups()
		f.drainCreations()
		if live := f.serverPod(pod.Name); live != nil {
			f.cache(live)
		} else {
			f.uncache(pod)
		}
	}
	live := f.serverPod(pod.Name)
	r := f.record("x")
	if !r.Terminal && !r.PodCreated && live != nil && live.UID == pod.UID && attempt.Fenced(live) {
		t.Errorf("adopted task x is stuck: the old instance's gated pod (epoch %s; this term's epoch %d) is neither discarded nor recorded, no pod of its own is created, record %s/%s, pod finalizers %v",
			live.Annotations[task.AnnotationEpoch], f.ex.epoch.Load(), r.Phase, r.Reason, live.Finalizers)
	}
	if !r.PodCreated || r.PodUID == string(pod.UID) || live == nil || string(live.UID) != r.PodUID || attempt.Fenced(live) {
		t.Errorf("want the old instance's pod discarded and a pod of this instance recorded and ungated: record pod %v uid %s, live %v", r.PodCreated, r.PodUID, live)
	}
}

// A task that an instance this one adopts from finished, whose pod it did
// not release before it stopped (the outcome recorded, the pod deleted and
// still held by kubetask's finalizer), is not adopted (its record is
// final), but its pod is released by the adopter: nobody else ever would
// (the simulator's seed 1004 left the finalizer for good).
func TestAdoptedInstancesFinishedTaskHasItsPodReleased(t *testing.T) {
	f := newFx(t, func(c *Config) { c.AdoptFrom = []string{"old"} })
	old := newFx(t, func(c *Config) { c.InstanceID = "old"; c.RecordOnly = true; c.Store = f.ex.store })
	old.submit("x", newTask())
	w := running().After(time.Minute).On("main").Terminated(0).On("envoy").Terminated(0).Phase(corev1.PodSucceeded).Deleted(30 * time.Second)
	pod := old.podOf("x", 0, w)
	pod.UID = "uid-old"
	zero := int32(0)
	old.update("x", func(r *store.Record) {
		r.PodCreated, r.PodUID, r.Terminal, r.Phase, r.Reason, r.ExitCode = true, "uid-old", true, "Succeeded", "Completed", &zero
		r.Attempts = []store.AttemptOutcome{{Attempt: 0, Pod: pod.Name, PodUID: "uid-old", Phase: "Succeeded", Reason: "Completed", ExitCode: &zero}}
	})
	f.both(pod)
	f.clk.SetTime(w.Now())
	if err := f.ex.adopt(f.ctx); err != nil {
		t.Fatal(err)
	}
	if r := f.record("x"); r.Executor != "old" {
		t.Fatalf("a finished task was adopted: executor %s", r.Executor)
	}
	for range 3 {
		if _, _, err := f.sync("x"); err != nil {
			t.Fatal(err)
		}
		f.reflect(pod.Name)
	}
	if p := f.serverPod(pod.Name); p != nil && hasFinalizer(p) {
		t.Errorf("the finished task's pod keeps kubetask's finalizer: %v", p.Finalizers)
	}
	if r := f.record("x"); r.Executor != "old" || r.Phase != "Succeeded" {
		t.Errorf("the record was written: executor %s, %s", r.Executor, r.Phase)
	}
}

// beforeUpdateStore runs beforeUpdate once, just before the next Update.
type beforeUpdateStore struct {
	store.Store
	once         sync.Once
	beforeUpdate func()
}

func (s *beforeUpdateStore) Update(ctx context.Context, rec store.Record) (store.Record, error) {
	s.once.Do(s.beforeUpdate)
	return s.Store.Update(ctx, rec)
}

// A task of an instance this one adopts from that is cancelled between the
// adoption's list and its write is adopted all the same (the write's
// conflict is read again, not skipped): a task left to a gone instance is
// never run by anyone (the simulator's seed 1323 left one Pending for
// good).
func TestAdoptionRacingACancellationAdoptsTheTask(t *testing.T) {
	st := &beforeUpdateStore{}
	f := newFx(t, func(c *Config) { c.AdoptFrom = []string{"old"}; st.Store = c.Store; c.Store = st })
	old := newFx(t, func(c *Config) { c.InstanceID = "old"; c.RecordOnly = true; c.Store = st.Store })
	old.submit("x", newTask())
	st.beforeUpdate = func() {
		if err := old.ex.Cancel(f.ctx, "x"); err != nil {
			t.Errorf("cancel: %v", err)
		}
	}
	if err := f.ex.adopt(f.ctx); err != nil {
		t.Fatal(err)
	}
	r := f.record("x")
	if r.Executor != "ex" || r.CancelledAt.IsZero() {
		t.Errorf("record after the adoption: executor %s, cancelled %v; want ex, cancelled", r.Executor, !r.CancelledAt.IsZero())
	}
	if _, _, err := f.sync("x"); err != nil || f.state("x") != "Failed/Cancelled" {
		t.Errorf("after a sync: %v %s, want Failed/Cancelled", err, f.state("x"))
	}
}

// An outcome decided on a pod bound to no node is recorded only once the
// pod's deletion shows, even when the pod meanwhile shows ungated (a
// retried removal of its gate that was on its way landed before the
// deletion was sent): recorded at that pass, the pod was bound after the
// outcome and its kept sidecar ran for ever (the simulator's seed 2799).
func TestSealedOutcomeWaitsForTheDeletion(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask(keep))
	f.update("x", func(r *store.Record) { r.PodCreated = true })
	p := f.podOf("x", 0, created())
	p.UID = "uid-x"
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: task.FenceGate}}
	f.both(p)
	f.update("x", func(r *store.Record) { r.PodUID = "uid-x" })
	if err := f.ex.Cancel(f.ctx, "x"); err != nil {
		t.Fatal(err)
	}
	// The passes run without the cleaners: the deletion is handed over,
	// not sent yet.
	if _, err := f.ex.sync(f.ctx, "x"); err != nil || f.state("x") != "Pending/Stopping" {
		t.Fatalf("first pass: %v %s, want the pod's deletion handed over (Pending/Stopping)", err, f.state("x"))
	}
	// The removal of its gate lands before the deletion is sent.
	ungated := p.DeepCopy()
	ungated.Spec.SchedulingGates = nil
	f.both(ungated)
	if _, err := f.ex.sync(f.ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if r := f.record("x"); r.Terminal {
		t.Fatalf("the outcome %s/%s was recorded before the pod's deletion showed", r.Phase, r.Reason)
	}
	f.reflect(p.Name) // the deletion is sent, and shows
	if _, _, err := f.sync("x"); err != nil || f.state("x") != "Failed/Cancelled" {
		t.Errorf("once the deletion shows: %v %s, want Failed/Cancelled", err, f.state("x"))
	}
}

// The ungate of an attempt's recorded pod is sent even when the done
// discard of an earlier pod of the same name (an earlier term's, created
// gated and never recorded) is still kept: actions are kept by the pod's
// name, and the done one on another UID gives way (the simulator's seed
// 1796533340373355390: the recorded pod stayed gated for ever).
func TestUngateAfterTheDiscardOfAnEarlierPodOfTheName(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask())
	f.update("x", func(r *store.Record) { r.PodCreated, r.PodUID = true, "uid-new" })
	p := f.podOf("x", 0, created())
	p.UID = "uid-new"
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: task.FenceGate}}
	f.both(p)
	earlier := p.DeepCopy()
	earlier.UID = "uid-earlier"
	f.ex.mu.Lock()
	f.ex.actions[p.Namespace+"/"+p.Name] = &podAction{kind: actDiscard, id: "x", pod: earlier, done: true, doneAt: f.clk.Now()}
	f.ex.mu.Unlock()
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	f.drainCleanups()
	if live := f.serverPod(p.Name); live == nil || attempt.Fenced(live) {
		t.Errorf("the recorded pod was not ungated: %v", live)
	}
}

// A Keep task's attempt whose outcome names no pod (its creator's record of
// the pod failed, and the task was cancelled before a retry took it) leaves
// a pod of the attempt that is gated and bound to no node: nothing of it ran
// and nothing of it is worth keeping. It is deleted and let go whatever the
// cleanup; kept, it stayed gated with kubetask's finalizer for good (the
// simulator's seed 7211, once it captured logs: a capture of a container
// that never starts, of a pod nobody deletes, never ends).
func TestKeptTasksPodThatNeverRanIsDeleted(t *testing.T) {
	f := newFx(t, nil)
	epoch := f.beginTerm()
	f.submit("k", newTask(keep))
	pod := fencedPod(f.podOf("k", 0, created()), epoch)
	pod.UID = "u-orphan"
	f.both(pod)
	f.update("k", func(r *store.Record) {
		r.PodCreated, r.CancelledAt = false, f.clk.Now()
		r.Terminal, r.Phase, r.Reason = true, "Failed", "Cancelled"
		r.Attempts = []store.AttemptOutcome{{Attempt: 0, Phase: "Failed", Reason: "Cancelled"}}
	})
	if _, verbs, err := f.sync("k"); err != nil || !slices.Contains(verbs, "delete pods") {
		t.Fatalf("sync: %v, requests %v; want the pod, which never ran, deleted", err, verbs)
	}
	for range 3 {
		f.reflect(pod.Name)
		if _, _, err := f.sync("k"); err != nil {
			t.Fatal(err)
		}
	}
	if p := f.serverPod(pod.Name); p != nil {
		t.Errorf("the pod is still there (finalizers %v, deleting %v); want it deleted and let go", p.Finalizers, p.DeletionTimestamp != nil)
	}
}

// A capture follows the pod it was started for, by UID: an earlier pod of
// the same name (a discarded pod of another instance, deleted with grace 0
// and never started) that the cache still shows is not it. Read by name,
// the capture took it for the attempt's pod, judged that "it never ran and
// never will", and marked the attempt's log complete and empty; the
// attempt's real pod ran and its log was lost (the simulator's seed
// 20000175, adoption, once it captured logs).
func TestCaptureFollowsItsPodByUID(t *testing.T) {
	got := make(chan LogCapture, 1)
	f := newFx(t, func(c *Config) {
		c.CaptureLogs = func(ctx context.Context, lc LogCapture) error {
			got <- lc
			<-ctx.Done()
			return ctx.Err()
		}
	})
	f.submit("t", newTask())
	zero := int64(0)
	now := metav1.NewTime(f.clk.Now())
	old := f.podOf("t", 0, created())
	old.UID, old.DeletionTimestamp, old.DeletionGracePeriodSeconds = "u-old", &now, &zero
	f.cache(old) // the cache still shows the earlier pod of the name
	ours := f.podOf("t", 0, running())
	ours.UID = "u-ours"
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	f.ex.startCapture(ctx, captureKey{id: "t", attempt: 0, container: "main"}, ours, &captureRun{done: make(chan struct{}), changed: make(chan struct{}, 1)})
	lc := <-got
	if p := lc.Progress(); p.Terminated || p.Gone {
		t.Fatalf("progress %+v while the cache shows only an earlier pod of the name; want not started, not ended (ours is not in the cache yet)", p)
	}
	f.cache(ours)
	if p := lc.Progress(); !p.Started || p.Terminated {
		t.Fatalf("progress %+v of the pod itself, running; want started", p)
	}
	later := ours.DeepCopy()
	later.UID = "u-later"
	f.cache(later)
	if p := lc.Progress(); !p.Gone {
		t.Fatalf("progress %+v once another pod of the name replaced ours in the cache; want gone", p)
	}
	if lc.UID != "u-ours" {
		t.Errorf("the capture names pod UID %q, want u-ours", lc.UID)
	}
}

// A creation sent by a term whose request arrived after a newer term of
// the instance created the pod of the same name (the request held on its
// way past the newer term's beginning) finds that pod (AlreadyExists): it
// is the newer term's, to record, not this term's to discard as "an
// earlier term's". Discarded, the newer term recorded a deleted pod and the
// task ended Failed/DeletedExternally although kubetask deleted it (the
// simulator's seed 80149096).
func TestCreateLeavesANewerTermsPod(t *testing.T) {
	f := newFx(t, nil)
	epoch := f.beginTerm()
	f.submit("t", newTask())
	mine := fencedPod(f.podOf("t", 0, created()), epoch)
	newer := fencedPod(f.podOf("t", 0, created()), epoch+1)
	newer.UID = "u-newer"
	f.server(newer)
	f.client.ClearActions()
	_, _, err := f.ex.create(f.ctx, mine, epoch)
	if !errors.Is(err, errNotClaimed) {
		t.Errorf("create: %v, want errNotClaimed (a newer term's pod)", err)
	}
	if slices.Contains(f.actionVerbs(), "delete pods") || f.serverPod(newer.Name) == nil {
		t.Errorf("the newer term's pod was deleted (requests %v)", f.actionVerbs())
	}
	// An earlier term's pod of the name is still discarded.
	earlier := fencedPod(f.podOf("t", 0, created()), epoch-1)
	earlier.UID = "u-earlier"
	f.server(earlier)
	if _, _, err := f.ex.create(f.ctx, mine, epoch); err == nil || errors.Is(err, errNotClaimed) {
		t.Errorf("create beside an earlier term's pod: %v, want it discarded and created again", err)
	}
	if f.serverPod(earlier.Name) != nil {
		t.Error("an earlier term's pod of the name was not discarded")
	}
}

// An adopted pod is relabelled once: a pass that runs before the cache
// shows the new label (another change of the task brought it back) waits
// for it instead of sending the relabel again (1.33 relabels per task in
// test/costs's adoption path once its tasks ran long enough).
func TestAnAdoptedPodIsRelabelledOnce(t *testing.T) {
	f := newFx(t, func(c *Config) { c.AdoptFrom = []string{"old"} })
	old := newFx(t, func(c *Config) { c.InstanceID = "old"; c.RecordOnly = true; c.Store = f.ex.store })
	rec := old.submit("x", newTask())
	pod := old.podOf("x", 0, running())
	pod.UID = "uid-old"
	old.update("x", func(r *store.Record) {
		r.PodCreated, r.PodUID, r.Phase, r.Reason = true, "uid-old", "Running", "Running"
	})
	f.both(pod)
	if err := f.ex.adopt(f.ctx); err != nil {
		t.Fatal(err)
	}
	if r := f.record("x"); r.Executor != "ex" || r.Nonce != rec.Nonce {
		t.Fatalf("not adopted: executor %s", r.Executor)
	}
	relabels := func(verbs []string) int { return strings.Count(strings.Join(verbs, ","), "patch pods") }
	total := 0
	for range 3 { // the cache still shows old's label
		_, verbs, err := f.sync("x")
		if err != nil {
			t.Fatal(err)
		}
		total += relabels(verbs)
	}
	if total != 1 {
		t.Errorf("%d relabels in 3 passes while the cache showed the earlier label; want 1", total)
	}
	f.reflect(pod.Name)
	if p := f.serverPod(pod.Name); p.Labels[task.LabelExecutor] != "ex" {
		t.Fatalf("pod labelled %q, want this instance's", p.Labels[task.LabelExecutor])
	}
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	if f.ex.relabelSent("x", pod.UID) {
		t.Error("the relabel is remembered after the cache showed it")
	}
}

// A task moved to another cluster and back while this instance's creator
// was between its pod's creation and its claim (simulation seed
// 2600191794). The pass that ran while the task was away found the gated
// pod of an attempt placed elsewhere and discarded it; the task came back
// before the creator's claim, whose compare-and-swap then recorded the
// pod the pass had deleted, and the attempt ended DeletedExternally
// although nobody but kubetask deleted its pod. A pod of this process's
// creation in flight is the creator's to record or discard.
func TestACreationInFlightIsLeftToItsCreator(t *testing.T) {
	st := &hookStore{}
	f := newFx(t, func(c *Config) { c.Cluster = "west"; st.Store = c.Store; c.Store = st })
	f.submit("x", newTask())
	if _, _, err := f.sync("x"); err != nil { // admits the creation
		t.Fatal(err)
	}
	name := task.PodName(identOf(f, "x"), 0)
	var passErr error
	var hooked bool
	// Not at the creator's claim check: the pod is not there yet.
	st.armWhen("x", func() bool { return f.serverPod(name) != nil }, func() {
		// The creator has created the gated pod and read the record for
		// its claim. Meanwhile the router moves the task to east, this
		// instance's pass runs on what its cache shows, and the router
		// moves the task back to west.
		hooked = true
		c := st.Store.(store.Clusters)
		rec, err := st.Store.Get(f.ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if rec, err = c.Move(f.ctx, rec, "ex-east", "east"); err != nil {
			t.Fatal(err)
		}
		f.cache(f.serverPod(name))
		_, passErr = f.ex.sync(f.ctx, "x")
		f.drainCleanups()
		if _, err := c.Move(f.ctx, rec, "ex", "west"); err != nil {
			t.Fatal(err)
		}
	})
	f.drainCreations()
	if !hooked {
		t.Fatal("the creator never read the record after creating the pod")
	}
	if passErr != nil {
		t.Fatalf("the pass while the task was on east failed: %v", passErr)
	}
	rec := f.record("x")
	pod := f.serverPod(name)
	if !rec.PodCreated || pod == nil || string(pod.UID) != rec.PodUID || pod.DeletionTimestamp != nil {
		t.Fatalf("the record takes pod %q, but the pod is %v: the pass deleted the creator's pod, which the creator then recorded", rec.PodUID, pod)
	}
	f.cache(pod)
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	if s := f.state("x"); s != "Pending/Scheduling" {
		t.Errorf("state %s, want Pending/Scheduling (its pod recorded and ungated)", s)
	}
}

// staleGetStore answers the next Get of task id with stale, as a read
// sent before retention deleted the record and the ID was used again
// would have answered; then it reads the store.
type staleGetStore struct {
	store.Store
	mu    sync.Mutex
	id    string
	stale *store.Record
}

func (s *staleGetStore) Get(ctx context.Context, id string) (store.Record, error) {
	s.mu.Lock()
	stale := s.stale
	if id != s.id {
		stale = nil
	} else {
		s.stale = nil
	}
	s.mu.Unlock()
	if stale != nil {
		return *stale, nil
	}
	return s.Store.Get(ctx, id)
}

// A pass that read the earlier record of a task ID, before retention
// deleted it and a user used the ID again, found the new record's running
// pod (another nonce) and discarded it: the record read again before the
// discard had the same version, because a new record's versions start
// again at 1 (simulation seed 2600199020: a stale term's pass deleted the
// pod the new term had just started; the attempt ended DeletedExternally).
// A record read again is the same only with the same version and nonce.
func TestADiscardReadsTheSameRecordAgain(t *testing.T) {
	st := &staleGetStore{}
	f := newFx(t, func(c *Config) { st.Store = c.Store; c.Store = st })
	f.submit("x", newTask())
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	f.drainCreations()
	name := task.PodName(identOf(f, "x"), 0)
	pod := f.serverPod(name)
	if pod == nil {
		t.Fatal("no pod created")
	}
	f.cache(pod)
	rec := f.record("x")
	if !rec.PodCreated {
		t.Fatalf("the pod is not recorded: %+v", rec)
	}
	earlier := rec
	earlier.Nonce, earlier.PodCreated, earlier.PodUID = "earlier", false, ""
	earlier.Terminal, earlier.Phase, earlier.Reason = true, "Succeeded", "Completed"
	st.mu.Lock()
	st.id, st.stale = "x", &earlier
	st.mu.Unlock()
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	for _, a := range f.client.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok && d.GetName() == name {
			t.Fatalf("the pass deleted pod %s, which the record of the ID's new use takes (uid %s), on the earlier record's read", name, rec.PodUID)
		}
	}
	if p := f.serverPod(name); p == nil || p.DeletionTimestamp != nil {
		t.Fatalf("pod %s is gone or deleted", name)
	}
}

// A creation retried after this term discarded its own gated pod, whose
// deletion had landed (its answer lost) while the pod's finalizer kept it:
// the retry's AlreadyExists found the term's own pod and took it for an
// earlier try's, and the claim recorded a pod that was being deleted
// (simulation seed 2600198083: a claim that found the task moved to east
// discarded the pod; the task came back to west; the attempt ended
// DeletedExternally). A pod being deleted is never recorded.
func TestARetriedCreationLeavesItsDiscardedPod(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask())
	if _, _, err := f.sync("x"); err != nil { // admits the creation
		t.Fatal(err)
	}
	rec := f.record("x")
	var tk task.Task
	if err := json.Unmarshal(rec.Task, &tk); err != nil {
		t.Fatal(err)
	}
	built, err := task.BuildPod(&tk, task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Executor: f.ex.cfg.InstanceID, Nonce: rec.Nonce}, 0)
	if err != nil {
		t.Fatal(err)
	}
	discarded := fencedPod(built, f.ex.epoch.Load())
	discarded.UID = "discarded"
	discarded.Finalizers = append(discarded.Finalizers, task.Finalizer)
	discarded.DeletionTimestamp = &metav1.Time{Time: f.clk.Now()}
	f.server(discarded)
	f.drainCreations()
	if rec := f.record("x"); rec.PodCreated && rec.PodUID == "discarded" {
		t.Fatalf("the creation recorded pod %s, which was being deleted", discarded.Name)
	}
	if p := f.serverPod(discarded.Name); p != nil && p.UID == "discarded" && slices.Contains(p.Finalizers, task.Finalizer) {
		t.Errorf("the discarded pod keeps kubetask's finalizer: %v", p.Finalizers)
	}
}

// queuedDiscardAfterAMove sets up what simulation seed 2600352580 found:
// the creator's claim of its gated pod lost its store write's answer, so
// the creation ended with a store error (a creation done: leftToCreator no
// longer protects it); the task was moved to east, and a pass of west
// queued a discard of the pod (not yet sent); the task came back to west.
// It returns the fixture, its store's hook and the pod.
func queuedDiscardAfterAMove(t *testing.T) (*fx, *hookStore, *corev1.Pod) {
	var (
		st   *failingUpdates
		hook *hookStore
	)
	f := newFx(t, func(c *Config) {
		c.Cluster = "west"
		st = &failingUpdates{Store: c.Store}
		hook = &hookStore{Store: st}
		c.Store = hook
	})
	f.submit("x", newTask())
	if _, _, err := f.sync("x"); err != nil { // admits the creation
		t.Fatal(err)
	}
	name := task.PodName(identOf(f, "x"), 0)
	st.fail.Store(true)
	f.drainCreations() // creates the gated pod; the claim's write fails
	st.fail.Store(false)
	created := f.serverPod(name)
	if created == nil || f.record("x").PodCreated {
		t.Fatalf("want the pod created and not recorded, got pod %v, record %+v", created, f.record("x"))
	}
	c := st.Store.(store.Clusters)
	moved, err := c.Move(f.ctx, f.record("x"), "ex-east", "east")
	if err != nil {
		t.Fatal(err)
	}
	f.cache(created)
	if _, err := f.ex.sync(f.ctx, "x"); err != nil { // queues the discard, not yet sent
		t.Fatal(err)
	}
	if a, ok := f.ex.actionOf(created.Namespace + "/" + name); !ok || a.kind != actDiscard || a.done {
		t.Fatalf("the pass while the task was on east queued no discard of its pod: %+v", a)
	}
	if _, err := c.Move(f.ctx, moved, "ex", "west"); err != nil {
		t.Fatal(err)
	}
	return f, hook, created
}

// readmit runs passes of task id, the clock stepping past the failed
// creation's back-off, until one admits a new creation.
func (f *fx) readmit(id string) {
	f.t.Helper()
	for range 5 {
		if _, err := f.ex.sync(f.ctx, id); err != nil {
			f.t.Fatal(err)
		}
		if len(f.ex.creates) > 0 {
			return
		}
		f.clk.Step(time.Second)
	}
	f.t.Fatal("no pass admitted the creation again")
}

// A discard queued while the task was away is not sent once the record
// takes its pod: the task came back, the retried creation found the
// term's own gated pod (AlreadyExists) and recorded it, and the cleaner
// then came to the queued discard (seed 2600352580: it deleted the
// recorded pod, and the attempt ended DeletedExternally).
func TestAQueuedDiscardLeavesAPodTheRecordTook(t *testing.T) {
	f, _, created := queuedDiscardAfterAMove(t)
	f.readmit("x")
	f.drainCreations()
	rec := f.record("x")
	if !rec.PodCreated || rec.PodUID != string(created.UID) {
		t.Fatalf("the retried creation did not record pod %s (record %+v)", created.UID, rec)
	}
	f.drainCleanups() // the cleaner comes to the queued discard
	pod := f.serverPod(created.Name)
	if pod == nil || pod.UID != created.UID || pod.DeletionTimestamp != nil {
		t.Fatalf("the record takes pod %s, but the queued discard deleted it: %v", rec.PodUID, pod)
	}
	f.cache(pod)
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	if s := f.state("x"); s != "Pending/Scheduling" {
		t.Errorf("state %s, want Pending/Scheduling (its pod recorded and ungated)", s)
	}
}

// The other order: the cleaner is sending the discard (it read the record,
// which did not take the pod) when the retried creation's claim comes to
// the pod. The claim must not record it: the DELETE lands after.
func TestAClaimLeavesAPodWhoseDiscardIsOnItsWay(t *testing.T) {
	f, hook, created := queuedDiscardAfterAMove(t)
	f.readmit("x")
	var claimed bool
	hook.arm("x", func() { // the cleaner's read of the record: the creator runs now
		claimed = true
		f.drainCreations()
	})
	f.drainCleanups()
	if !claimed {
		t.Fatal("the cleaner read no record before its discard")
	}
	if p := f.serverPod(created.Name); p != nil && p.UID == created.UID && p.DeletionTimestamp == nil {
		t.Fatalf("the discard was not sent: %v", p)
	}
	if rec := f.record("x"); rec.PodCreated && rec.PodUID == string(created.UID) {
		t.Fatalf("the claim recorded pod %s while its discard was on its way", created.UID)
	}
	// The creation is retried, and creates the attempt's pod anew.
	for i := 0; i < 10 && !f.record("x").PodCreated; i++ {
		if p := f.serverPod(created.Name); p != nil {
			f.cache(p)
		} else {
			f.uncache(created)
		}
		if _, _, err := f.sync("x"); err != nil {
			t.Fatal(err)
		}
		f.drainCreations()
		f.clk.Step(time.Second)
	}
	rec := f.record("x")
	pod := f.serverPod(created.Name)
	if !rec.PodCreated || pod == nil || string(pod.UID) != rec.PodUID || pod.UID == created.UID || pod.DeletionTimestamp != nil {
		t.Fatalf("want a new pod recorded, got record pod %q, pod %v", rec.PodUID, pod)
	}
}

// And the order between: the claim has checked the pod's discard and is
// recording the pod when the cleaner comes to the queued discard. The
// cleaner's read of the record may come before the claim's write: the
// discard waits for the creation, and is decided again after it.
func TestADiscardWaitsForTheClaimOfItsPod(t *testing.T) {
	f, hook, created := queuedDiscardAfterAMove(t)
	f.readmit("x")
	var cleaned bool
	claiming := func() bool { // not at the creator's claim checks: not yet recording
		f.ex.mu.Lock()
		defer f.ex.mu.Unlock()
		c := f.ex.creations["x"]
		return c != nil && c.claiming == created.UID
	}
	hook.armWhen("x", claiming, func() {
		cleaned = true
		f.drainCleanups()
	})
	f.drainCreations()
	if !cleaned {
		t.Fatal("the claim never read the record")
	}
	rec := f.record("x")
	pod := f.serverPod(created.Name)
	if !rec.PodCreated || rec.PodUID != string(created.UID) || pod == nil || pod.UID != created.UID || pod.DeletionTimestamp != nil {
		t.Fatalf("the record takes pod %q, and the pod is %v: the discard went out during the claim", rec.PodUID, pod)
	}
	f.cache(pod)
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	if a, ok := f.ex.actionOf(created.Namespace + "/" + created.Name); ok && a.kind == actDiscard {
		t.Errorf("a discard of the recorded pod is still kept: %+v", a)
	}
}
