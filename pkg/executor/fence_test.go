package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// The fence, as specified in docs/executor.md: a pod of attempt N is
// created only while the task's record wants it from the current term, it
// runs only once the record takes it by its UID, and a pod the record does
// not take never decides an outcome.

func TestClaimGone(t *testing.T) {
	base := store.Record{ID: "x", Executor: "ex", Attempt: 2, Nonce: "n1"}
	tests := map[string]struct {
		edit func(*store.Record)
		want bool // the claim is gone
	}{
		"wanted":             {func(*store.Record) {}, false},
		"another instance's": {func(r *store.Record) { r.Executor = "other" }, true},
		"finished":           {func(r *store.Record) { r.Terminal = true }, true},
		"cancelled":          {func(r *store.Record) { r.CancelledAt = time.Unix(1, 0) }, true},
		"at a later attempt": {func(r *store.Record) { r.Attempt = 3 }, true},
		"pod recorded":       {func(r *store.Record) { r.PodCreated = true }, true},
		// The ID used again after retention deleted the record the pod
		// was built from: the new record is another task's.
		"a later record of its ID":                {func(r *store.Record) { r.Nonce = "n2" }, true},
		"retry backoff is no matter of the claim": {func(r *store.Record) { r.NextAttemptAt = time.Unix(1, 0) }, false},
		// Placed on another cluster than the executor's (Config.Cluster "").
		"placed on another cluster": {func(r *store.Record) { r.Cluster = "east" }, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := base
			tc.edit(&r)
			if got := claimGone(r, 2, "ex", "", "n1"); (got != "") != tc.want {
				t.Errorf("claimGone = %q, want gone: %v", got, tc.want)
			}
		})
	}
}

func TestFitOf(t *testing.T) {
	pod := func(uid string, epoch string, gated bool, nonce string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Annotations: map[string]string{}}}
		if epoch != "" {
			p.Annotations[task.AnnotationEpoch] = epoch
		}
		if nonce != "" {
			p.Annotations[task.AnnotationNonce] = nonce
		}
		if gated {
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: task.FenceGate}}
		}
		return p
	}
	const epoch = 7
	current := store.Record{Nonce: "n", Attempt: 1, Attempts: []store.AttemptOutcome{{Attempt: 0, PodUID: "u0"}}}
	recorded := current
	recorded.PodCreated, recorded.PodUID, recorded.PodEpoch = true, "u1", 5
	legacy := store.Record{Attempt: 0, PodCreated: true} // before the fence: no nonce, no UID
	tests := map[string]struct {
		rec     store.Record
		pod     *corev1.Pod
		n       int
		want    podFit
		foreign bool // created by an instance this one adopts from
	}{
		"a finished attempt's recorded pod":                {current, pod("u0", "3", false, "n"), 0, fitOwn, false},
		"another pod of a finished attempt (stale create)": {current, pod("u9", "6", true, "n"), 0, fitDiscard, false},
		"the recorded pod of the current attempt":          {recorded, pod("u1", "5", false, "n"), 1, fitOwn, false},
		"the recorded pod, its gate still on":              {recorded, pod("u1", "5", true, "n"), 1, fitOwn, false},
		"another pod than the recorded one, gated":         {recorded, pod("u2", "6", true, "n"), 1, fitDiscard, false},
		"another pod than the recorded one, running":       {recorded, pod("u2", "6", false, "n"), 1, fitDiscard, false},
		"this term's creation, not recorded yet":           {current, pod("u2", strconv.Itoa(epoch), true, "n"), 1, fitCreating, false},
		"an earlier term's unrecorded pod":                 {current, pod("u2", "6", true, "n"), 1, fitDiscard, false},
		"an unrecorded pod whose gate was removed by hand": {current, pod("u2", "6", false, "n"), 1, fitDiscard, false},
		// A newer term elsewhere (this one is stale and does not know yet)
		// may record its creation after this pass read the record: not
		// this term's to judge (TestSplitBrainCreatesNoDuplicate: a stale
		// term discarded 9 of 100 such pods after they were recorded).
		"a newer term's creation, not recorded yet":        {current, pod("u2", "8", true, "n"), 1, fitNewer, false},
		"a newer term's pod, ungated since this pass read": {current, pod("u2", "12", false, "n"), 1, fitNewer, false},
		"a newer term's pod beside the recorded one":       {recorded, pod("u2", "8", true, "n"), 1, fitDiscard, false},
		"a newer term's pod of a finished attempt":         {current, pod("u9", "8", true, "n"), 0, fitDiscard, false},
		"a newer term's pod of an earlier record (nonce)":  {current, pod("u2", "8", true, "old"), 1, fitDiscard, false},
		"an earlier record's pod (another nonce)":          {recorded, pod("u1", "5", false, "old"), 1, fitDiscard, false},
		// Another instance's terms (Config.AdoptFrom) count their own
		// epochs: its pod's epoch says nothing of this instance's terms.
		"an adopted instance's unrecorded gated pod, its epoch above this term's": {current, pod("u2", "12", true, "n"), 1, fitDiscard, true},
		"an adopted instance's unrecorded gated pod, its epoch this term's":       {current, pod("u2", strconv.Itoa(epoch), true, "n"), 1, fitDiscard, true},
		"an adopted instance's unrecorded pod, ungated":                           {current, pod("u2", "3", false, "n"), 1, fitDiscard, true},
		"an adopted instance's recorded pod":                                      {recorded, pod("u1", "12", false, "n"), 1, fitOwn, true},
		"an adopted instance's pod from before the fence":                         {store.Record{}, pod("u5", "", false, ""), 0, fitOwn, true},
		"a pod created before the fence, recorded":                                {legacy, pod("u5", "", false, ""), 0, fitOwn, false},
		"a pod created before the fence, not recorded":                            {store.Record{}, pod("u5", "", false, ""), 0, fitOwn, false},
		"an outcome recorded before the fence":                                    {store.Record{Attempt: 1, Attempts: []store.AttemptOutcome{{Attempt: 0}}}, pod("u5", "", false, ""), 0, fitOwn, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := fitOf(tc.rec, tc.pod, tc.n, epoch, tc.foreign, ""); got != tc.want {
				t.Errorf("fitOf = %d, want %d", got, tc.want)
			}
		})
	}

	// With clusters: a UID the record holds is the pod's only when the
	// record (or the attempt's outcome) names the executor's cluster.
	onEast := recorded
	onEast.Cluster = "east"
	onEast.Attempts = []store.AttemptOutcome{{Attempt: 0, PodUID: "u0", Cluster: "east"}}
	lostOnWest := onEast
	lostOnWest.Attempts = []store.AttemptOutcome{{Attempt: 0, PodUID: "u0", Cluster: "west"}}
	creatingOnEast := current
	creatingOnEast.Cluster = "east"
	for name, tc := range map[string]struct {
		rec     store.Record
		pod     *corev1.Pod
		n       int
		cluster string
		want    podFit
	}{
		"the recorded pod, on the record's cluster":                    {onEast, pod("u1", "5", false, "n"), 1, "east", fitOwn},
		"a pod of the recorded UID on another cluster":                 {onEast, pod("u1", "5", false, "n"), 1, "west", fitDiscard},
		"a pod of the recorded UID, the executor of no cluster":        {onEast, pod("u1", "5", false, "n"), 1, "", fitDiscard},
		"a finished attempt's pod, on its outcome's cluster":           {onEast, pod("u0", "3", false, "n"), 0, "east", fitOwn},
		"a finished attempt's UID on another cluster than its outcome": {lostOnWest, pod("u0", "3", false, "n"), 0, "east", fitDiscard},
		"the lost attempt's pod on the lost cluster":                   {lostOnWest, pod("u0", "3", false, "n"), 0, "west", fitOwn},
		"this term's creation, the record placed on this cluster":      {creatingOnEast, pod("u2", strconv.Itoa(epoch), true, "n"), 1, "east", fitCreating},
		"this term's creation, the record placed on another cluster":   {creatingOnEast, pod("u2", strconv.Itoa(epoch), true, "n"), 1, "west", fitDiscard},
	} {
		t.Run("cluster/"+name, func(t *testing.T) {
			if got := fitOf(tc.rec, tc.pod, tc.n, epoch, false, tc.cluster); got != tc.want {
				t.Errorf("fitOf = %d, want %d", got, tc.want)
			}
		})
	}
}

// finishElsewhere records x's attempt 0 as another process would that took
// the instance over (a newer term) and ran it: pod created, finished,
// outcome recorded, pod deleted.
func (f *fx) finishElsewhere(id string) {
	f.t.Helper()
	epoch, err := f.ex.store.BeginTerm(f.ctx, f.ex.cfg.InstanceID)
	if err != nil {
		f.t.Fatal(err)
	}
	rec := f.record(id)
	zero := int32(0)
	name := task.PodName(identOf(f, id), 0)
	rec.PodCreated, rec.PodUID, rec.PodEpoch = true, "uid-elsewhere", epoch
	rec.Terminal, rec.Phase, rec.Reason, rec.ExitCode = true, "Succeeded", "Completed", &zero
	rec.Attempts = []store.AttemptOutcome{{Attempt: 0, Pod: name, PodUID: "uid-elsewhere", Phase: "Succeeded", Reason: "Completed",
		ExitCode: &zero, FinishedAt: f.clk.Now(), ObservedAt: f.clk.Now()}}
	rec.Epoch = epoch
	if _, err := f.ex.store.Update(f.ctx, rec); err != nil {
		f.t.Fatal(err)
	}
}

// A creation admitted in this term and still queued when another process
// took the instance over and ran the attempt to its end is never sent: the
// claim is checked against the record and the instance's epoch.
func TestStaleCreationIsNotSent(t *testing.T) {
	for name, retake := range map[string]bool{"this process still in its term": false, "this process in a later term": true} {
		t.Run(name, func(t *testing.T) {
			f := newFx(t, nil)
			f.submit("x", newTask())
			if _, _, err := f.sync("x"); err != nil { // admits the creation
				t.Fatal(err)
			}
			f.finishElsewhere("x")
			if retake {
				f.beginTerm()
			}
			f.client.ClearActions()
			f.drainCreations()
			if verbs := f.actionVerbs(); len(verbs) != 0 {
				t.Errorf("requests %v, want none: the creation of a finished attempt went out", verbs)
			}
			if rec := f.record("x"); rec.PodUID != "uid-elsewhere" || rec.Phase != "Succeeded" {
				t.Errorf("the other process's record changed: %+v", rec)
			}
		})
	}
}

// The pause the issue found: the claim is checked, then the process stops;
// meanwhile another process takes the instance over, runs the attempt and
// deletes its pod; then the paused creation goes out. Its pod is created
// gated, the record does not take it, and it is discarded: it never ran.
func TestCreationAfterATakeoverNeverRuns(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask())
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	var once atomic.Bool
	f.client.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if once.CompareAndSwap(false, true) {
			f.finishElsewhere("x") // between the check and the request's arrival
		}
		return false, nil, nil
	})
	f.client.ClearActions()
	f.drainCreations()
	name := task.PodName(identOf(f, "x"), 0)
	var ungated bool
	for _, a := range f.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && bytes.Contains(p.GetPatch(), []byte("/spec/schedulingGates/")) {
			ungated = true
		}
	}
	if ungated {
		t.Error("the fence's gate was removed from a pod the record does not take")
	}
	if p := f.serverPod(name); p != nil && (p.DeletionTimestamp == nil || !attempt.Fenced(p)) {
		t.Errorf("pod %s left: deletion %v, gated %v; want it discarded, gated", name, p.DeletionTimestamp, attempt.Fenced(p))
	}
	if rec := f.record("x"); rec.PodUID != "uid-elsewhere" {
		t.Errorf("the record took the stale pod: %+v", rec)
	}
	if c, ok := f.ex.creationOf("x"); !ok || !errors.Is(c.err, errNotClaimed) {
		t.Errorf("creation %+v, want it ended with errNotClaimed", c)
	}
	// The next pass decides from the record: finished, nothing to do.
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	if got := f.eventTypes("x"); slices.Contains(got, "PodCreated") {
		t.Errorf("events %v: a stale pod reported as created", got)
	}
}

// A creation the record takes: created gated, recorded by UID and epoch,
// then ungated, and reported once.
func TestCreationIsRecordedThenUngated(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask())
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	f.client.ClearActions()
	f.drainCreations()
	if got := f.actionVerbs(); !slices.Equal(got, []string{"create pods", "patch pods"}) {
		t.Errorf("requests %v, want a create and the gate's removal", got)
	}
	name := task.PodName(identOf(f, "x"), 0)
	p := f.serverPod(name)
	if p == nil || attempt.Fenced(p) {
		t.Fatalf("pod %v: want it created and ungated", p)
	}
	rec := f.record("x")
	if !rec.PodCreated || rec.PodUID != string(p.UID) || rec.PodEpoch != f.ex.epoch.Load() || rec.Epoch != f.ex.epoch.Load() {
		t.Errorf("record %+v, want the pod's UID %s and epoch %d", rec, p.UID, f.ex.epoch.Load())
	}
	if p.Annotations[task.AnnotationEpoch] != strconv.FormatInt(f.ex.epoch.Load(), 10) || p.Annotations[task.AnnotationNonce] != rec.Nonce || rec.Nonce == "" {
		t.Errorf("pod annotations %v, record nonce %q", p.Annotations, rec.Nonce)
	}
	// The cache shows the gated pod first (its creation's event): no second
	// removal of the gate.
	gated := p.DeepCopy()
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: task.FenceGate}}
	f.cache(gated)
	if _, verbs, err := f.sync("x"); err != nil || len(verbs) != 0 {
		t.Errorf("pass on the cache's gated copy: requests %v, err %v", verbs, err)
	}
	if got := f.eventTypes("x"); !slices.Equal(got, []string{"PodCreated"}) {
		t.Errorf("events %v", got)
	}
}

// A recorded pod whose gate is still on (the process ended between the
// record and the gate's removal) is ungated by the next process's sync; an
// earlier term's unrecorded pod is discarded and the attempt's pod created
// anew.
func TestAfterACrashInTheMiddleOfACreation(t *testing.T) {
	t.Run("recorded, gated", func(t *testing.T) {
		f := newFx(t, nil)
		f.submit("x", newTask())
		p := f.podOf("x", 0, created())
		p.Annotations[task.AnnotationEpoch] = "1"
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: task.FenceGate}}
		f.both(p)
		f.update("x", func(r *store.Record) { r.PodCreated, r.PodUID, r.PodEpoch = true, string(p.UID), 1 })
		f.beginTerm() // a new process
		if _, _, err := f.sync("x"); err != nil {
			t.Fatal(err)
		}
		if live := f.serverPod(p.Name); live == nil || attempt.Fenced(live) {
			t.Errorf("pod %v: want it ungated", live)
		}
	})
	t.Run("not recorded, gated", func(t *testing.T) {
		f := newFx(t, nil)
		f.submit("x", newTask())
		p := f.podOf("x", 0, created())
		p.Annotations[task.AnnotationEpoch] = "1"
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: task.FenceGate}}
		f.both(p)
		f.beginTerm()
		if _, _, err := f.sync("x"); err != nil {
			t.Fatal(err)
		}
		if live := f.serverPod(p.Name); live != nil && live.DeletionTimestamp == nil {
			t.Errorf("the earlier term's pod is still there: %v", live.ObjectMeta)
		}
		f.uncache(p)
		f.drainCreations()
		if live := f.serverPod(p.Name); live == nil || live.UID == p.UID || attempt.Fenced(live) {
			t.Fatalf("want a new pod, ungated; got %v", live)
		} else if rec := f.record("x"); rec.PodUID != string(live.UID) {
			t.Errorf("record's pod %s, want %s", rec.PodUID, live.UID)
		}
	})
}

// An ID submitted again after its record went (retention deleted it, a
// memory store restarted) names other pods than the earlier record's: a
// kept pod of the old run is neither adopted nor allowed to decide the new
// run's outcome; the new run gets a pod of its own.
func TestReusedIDRunsItsOwnPod(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask(keep))
	old := f.podOf("x", 0, mainExited(3).On("envoy").Terminated(0).Phase(corev1.PodFailed))
	old.Annotations[task.AnnotationNonce] = "the-old-record"
	old.Name = task.PodName(task.Identity{Namespace: "ns", Name: "job", RunID: "x", Executor: "ex", Nonce: "the-old-record"}, 0)
	old.Finalizers = nil
	old.Labels[task.LabelReleased] = "true"
	old.CreationTimestamp = metav1.NewTime(f.clk.Now().Add(-40 * 24 * time.Hour))
	f.server(old)
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	f.drainCreations()
	for range 3 {
		if _, _, err := f.sync("x"); err != nil {
			t.Fatal(err)
		}
	}
	if rec := f.record("x"); rec.Terminal {
		t.Errorf("the new run ended %s/%s from the old run's kept pod", rec.Phase, rec.Reason)
	}
	mine := task.PodName(identOf(f, "x"), 0)
	if mine == old.Name || f.serverPod(mine) == nil {
		t.Errorf("the new run's pod %s was not created (the old one is %s)", mine, old.Name)
	}
	if p := f.serverPod(old.Name); p == nil || p.DeletionTimestamp != nil {
		t.Errorf("the old run's kept pod was touched: %v", p)
	}
}

// A task cancelled after its creation was admitted and before a creator
// reached it gets no pod.
func TestCancelledAfterAdmissionGetsNoPod(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask())
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	if err := f.ex.Cancel(f.ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	f.client.ClearActions()
	f.drainCreations()
	if verbs := f.actionVerbs(); len(verbs) != 0 {
		t.Errorf("requests %v after Cancel returned, want none", verbs)
	}
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	if s := f.state("x"); s != "Failed/Cancelled" {
		t.Errorf("state %s, want Failed/Cancelled", s)
	}
}

// endedFenced reports whether the term of ctx has ended, and fails t when
// it ended for another reason than errFenced.
func endedFenced(ctx context.Context, t *testing.T) bool {
	t.Helper()
	select {
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), errFenced) {
			t.Errorf("term ended by %v, want errFenced", context.Cause(ctx))
		}
		return true
	default:
		return false
	}
}

// A write of this term refused as fenced (another process began a newer
// term of the instance) ends the term at once.
func TestFencedWriteEndsTheTerm(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask())
	p := f.podOf("x", 0, running())
	f.both(p)
	ctx := f.ex.termContext()
	if _, err := f.ex.store.BeginTerm(f.ctx, "ex"); err != nil { // another process
		t.Fatal(err)
	}
	if _, _, err := f.sync("x"); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("sync: err %v, want ErrFenced", err)
	}
	if !endedFenced(ctx, t) {
		t.Error("the term goes on after a fenced write")
	}
	if rec := f.record("x"); rec.PodCreated {
		t.Error("the fenced write was applied")
	}
}

// A claim check that finds a newer term of the instance ends this term, as
// a fenced write does. The chaos suite's full run: a replica paused past its
// Lease got the Lease back by its own renewal once the replica that had
// taken the shard meanwhile (and begun a newer term) handed it back, so its
// old term went on; every creation of the term then failed its claim check
// ("term 15 of the instance began (this one is 14)"), was admitted again and
// failed again, and nothing wrote, so nothing ended the term: 77 tasks of
// the replica's shards waited 16 minutes behind a Lease it renewed.
func TestNewerTermSeenByAClaimCheckEndsTheTerm(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask())
	if _, _, err := f.sync("x"); err != nil { // admits the creation
		t.Fatal(err)
	}
	ctx := f.ex.termContext()
	if _, err := f.ex.store.BeginTerm(f.ctx, "ex"); err != nil { // another process, which then left
		t.Fatal(err)
	}
	f.client.ClearActions()
	f.drainCreations()
	if verbs := f.actionVerbs(); len(verbs) != 0 {
		t.Errorf("requests %v, want none", verbs)
	}
	if !endedFenced(ctx, t) {
		t.Error("the term goes on after its claim check found a newer term")
	}
}

// A pod of a newer term of the instance ends this term, as a fenced write
// does (simulation seed 100036257): the newer term's replica created the
// gated pod, lost the answer of its record's write and handed the shard
// back; this replica renewed the Lease it held, and every pass of the task
// saw the newer term's pod, acted on nothing and wrote nothing, so nothing
// ended the stale term and the pod stayed gated with the finalizer for good.
func TestNewerTermsPodEndsTheStaleTerm(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask())
	ctx := f.ex.termContext()
	newer, err := f.ex.store.BeginTerm(f.ctx, "ex") // another process, which then left
	if err != nil {
		t.Fatal(err)
	}
	p := fencedPod(f.podOf("x", 0, created()), newer)
	p.UID = "u-newer"
	f.both(p)
	_, verbs, err := f.sync("x")
	if err != nil {
		t.Fatal(err)
	}
	if len(verbs) != 0 {
		t.Errorf("requests %v, want none (the stale term acts on nothing)", verbs)
	}
	if !endedFenced(ctx, t) {
		t.Fatal("the stale term goes on beside a newer term's pod")
	}
	// The next term is newer than the pod's: the pod, never recorded, is
	// discarded and the attempt created again.
	f.beginTerm()
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	if live := f.serverPod(p.Name); live != nil && live.DeletionTimestamp == nil {
		t.Errorf("the earlier term's pod is kept: %+v", live.ObjectMeta)
	}
}

// flakyStore fails its first calls of BeginTerm and List.
type flakyStore struct {
	store.Store
	beginFails, listFails atomic.Int32
}

func (s *flakyStore) BeginTerm(ctx context.Context, inst string) (int64, error) {
	if s.beginFails.Add(-1) >= 0 {
		return 0, errors.New("connection reset by peer")
	}
	return s.Store.BeginTerm(ctx, inst)
}

func (s *flakyStore) List(ctx context.Context, o store.ListOptions) ([]store.Record, error) {
	if s.listFails.Add(-1) >= 0 {
		return nil, errors.New("connection reset by peer")
	}
	return s.Store.List(ctx, o)
}

// A store that fails at the start of a term delays the term; it does not
// end the executor (Start returned for good after one failed List).
func TestStoreErrorsAtTermStartAreRetried(t *testing.T) {
	st := &flakyStore{Store: store.NewMemory()}
	st.beginFails.Store(2)
	st.listFails.Store(2)
	ex, err := New(Config{Client: fake.NewClientset(), Execer: &fakeExec{}, InstanceID: "ex", Namespaces: []string{"ns"}, Store: st,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Start(ctx) }()
	waitFor(t, "the executor to act on pods", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Start returned %v after store errors at the start of its term", err)
		default:
		}
		return ex.Ready()
	})
	if st.beginFails.Load() >= 0 || st.listFails.Load() >= 0 {
		t.Errorf("the failures were not all met: BeginTerm %d, List %d left", st.beginFails.Load()+1, st.listFails.Load()+1)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}
}

// End to end through Start: a creation queued when the instance Lease is
// lost is not performed after the Lease is held again when another holder
// ran the attempt meanwhile.
func TestQueuedCreationAfterTheLeaseIsHeldAgain(t *testing.T) {
	pods, leases := fake.NewClientset(), fake.NewClientset()
	var failing atomic.Bool
	leases.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failing.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	block := make(chan struct{})
	var creates atomic.Int32
	pods.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		if p.Labels[task.LabelRun] == "y" {
			<-block // a slow creation: the one creator is busy
		} else {
			creates.Add(1)
		}
		return false, nil, nil
	})
	st := store.NewMemory()
	ex, err := New(Config{Client: pods, LeaseClient: leases, Execer: &fakeExec{}, InstanceID: "ex", Namespaces: []string{"ns"},
		Store: st, CreateConcurrency: 1,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Start(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "gate open", func() bool { return ex.Ready() })
	tk := newTask()
	tk.Namespace = "ns"
	if _, err := ex.Submit(ctx, "y", tk); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "y's creation in flight", func() bool { c, ok := ex.creationOf("y"); return ok && !c.done })
	if _, err := ex.Submit(ctx, "x", tk); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "x admitted and queued", func() bool { _, ok := ex.creationOf("x"); return ok })
	failing.Store(true) // the Lease cannot be renewed
	waitFor(t, "gate closed", func() bool { return !ex.Ready() })
	// Another holder of the instance ran x meanwhile.
	epoch, err := st.BeginTerm(ctx, "ex")
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := st.Get(ctx, "x")
	zero := int32(0)
	rec.PodCreated, rec.PodUID, rec.Terminal, rec.Phase, rec.Reason, rec.ExitCode, rec.Epoch = true, "elsewhere", true, "Succeeded", "Completed", &zero, epoch
	rec.Attempts = []store.AttemptOutcome{{Attempt: 0, PodUID: "elsewhere", Phase: "Succeeded", Reason: "Completed", ExitCode: &zero}}
	if _, err := st.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	close(block)
	failing.Store(false) // the Lease is held again
	waitFor(t, "gate open again", func() bool { return ex.Ready() })
	// y's slot and x's queued creation are looked at again by the new term;
	// y's pod is created (its record wants it), x's is not.
	waitFor(t, "y recorded", func() bool { r, _ := st.Get(ctx, "y"); return r.PodCreated })
	if n := creates.Load(); n != 0 {
		t.Errorf("%d creations of x's pod after the Lease was held again; its attempt has its outcome", n)
	}
}

// A gate whose removal failed (the API server restarting) is removed by a
// later pass: the failed action does not stay in the way (four tasks of
// TestAPIServerRestartedTwiceWith200Tasks stayed gated for good).
func TestFailedUngateIsRetried(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask())
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	var fails atomic.Int32
	fails.Store(2) // the creator's removal and the first pass's
	f.client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fails.Add(-1) >= 0 {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	f.drainCreations()
	name := task.PodName(identOf(f, "x"), 0)
	if p := f.serverPod(name); p == nil || !attempt.Fenced(p) || f.record("x").PodUID != string(p.UID) {
		t.Fatalf("want the pod recorded and still gated: %v", p)
	}
	for i := 0; i < 5 && attempt.Fenced(f.serverPod(name)); i++ {
		f.cache(f.serverPod(name)) // as the cache shows it: still gated
		_, _, _ = f.sync("x")      // a failed pass is retried by the work queue
	}
	if attempt.Fenced(f.serverPod(name)) {
		t.Error("the recorded pod is still gated after its gate's removal failed")
	}
}

// Two attempts' finished pods deleted in the same pass: each is reported
// deleting and released once, though the cache shows one deletion before
// the other (the first pod's finish forgot the second's done deletion,
// which was then decided, reported and done again).
func TestTwoCleanupsReportedOnceEach(t *testing.T) {
	f := newFx(t, nil)
	f.submit("a", newTask(func(t *task.Task) {
		one := int32(1)
		t.Spec.Retries.Limit, t.Spec.Retries.RetryOn = &one, []string{"ExitCode"}
	}))
	p0 := f.podOf("a", 0, mainExited(3).On("envoy").Terminated(0).Phase(corev1.PodFailed))
	p1 := f.podOf("a", 1, mainExited(0).On("envoy").Terminated(0).Phase(corev1.PodSucceeded))
	p1.UID = "uid-p1"
	zero, three := int32(0), int32(3)
	f.update("a", func(r *store.Record) {
		r.Attempt, r.Terminal, r.Phase, r.Reason, r.ExitCode = 1, true, "Succeeded", "Completed", &zero
		r.PodCreated, r.PodUID = true, string(p1.UID)
		r.Attempts = []store.AttemptOutcome{
			{Attempt: 0, Pod: p0.Name, PodUID: string(p0.UID), Phase: "Failed", Reason: "ExitCode", ExitCode: &three, Retryable: true},
			{Attempt: 1, Pod: p1.Name, PodUID: string(p1.UID), Phase: "Succeeded", Reason: "Completed", ExitCode: &zero},
		}
	})
	f.both(p0)
	f.both(p1)
	f.clk.SetTime(mainExited(0).Now())
	if _, _, err := f.sync("a"); err != nil { // deletes and releases both
		t.Fatal(err)
	}
	// The cache shows p0 deleted and released; p1 not yet.
	gone := p0.DeepCopy()
	now := metav1.NewTime(f.clk.Now())
	gone.DeletionTimestamp, gone.Finalizers = &now, nil
	f.cache(gone)
	for range 3 {
		if _, _, err := f.sync("a"); err != nil {
			t.Fatal(err)
		}
	}
	count := map[string]int{}
	for _, ev := range f.events {
		if ev.Type == EventPodDeleting || ev.Type == EventPodReleased {
			count[fmt.Sprintf("%s %d", ev.Type, ev.Attempt)]++
		}
	}
	for _, k := range []string{"PodDeleting 0", "PodDeleting 1", "PodReleased 0", "PodReleased 1"} {
		if count[k] != 1 {
			t.Errorf("%s reported %d times, want once: %v", k, count[k], count)
		}
	}
}

// The fence's gate is kubetask's own: a pod that still has it (its removal
// failed) is waiting for the scheduler as far as its task goes, and its
// schedule timeout counts from its creation; a gate of the task's (a queue's)
// still holds the timeout back.
func TestFenceGateIsNotTheTasks(t *testing.T) {
	for name, tc := range map[string]struct {
		gates []corev1.PodSchedulingGate
		want  string
	}{
		"the fence's gate alone":   {[]corev1.PodSchedulingGate{{Name: task.FenceGate}}, "Failed/ScheduleTimeout"},
		"a queue's gate beside it": {[]corev1.PodSchedulingGate{{Name: "example.com/queue"}, {Name: task.FenceGate}}, "Pending/Scheduling"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFx(t, nil)
			f.submit("a", newTask())
			p := f.podOf("a", 0, created())
			p.Annotations[task.AnnotationEpoch] = strconv.FormatInt(f.ex.epoch.Load(), 10)
			p.Spec.SchedulingGates = tc.gates
			f.both(p)
			f.update("a", func(r *store.Record) { r.PodCreated, r.PodUID, r.PodEpoch = true, string(p.UID), f.ex.epoch.Load() })
			f.reactorError("patch", "pods", errors.New("connection refused")) // the gate stays
			f.clk.SetTime(podtest.T0.Add(11 * time.Minute))                   // past the default schedule timeout (10m)
			_, _, _ = f.sync("a")
			_, _, _ = f.sync("a")
			f.drainCleanups()
			// The pod, which never ran, is deleted before the outcome is
			// recorded; the outcome follows once the cache shows that.
			if live := f.serverPod(p.Name); live != nil {
				f.cache(live)
			} else {
				f.uncache(p)
			}
			_, _, _ = f.sync("a")
			if s := f.state("a"); s != tc.want {
				t.Errorf("state %s, want %s", s, tc.want)
			}
		})
	}
}

// TestCancelAfterATakeover: a cancellation is the user's write, not a
// term's: it is applied whatever term last wrote the record (a replica's
// API cancelled a task last written by the previous owner's term and got
// ErrFenced, a 500, in TestGroupSettingsMustAgree), and it fences no term.
func TestCancelAfterATakeover(t *testing.T) {
	f := newFx(t, nil)
	f.submit("x", newTask())
	rec := f.record("x")
	rec.Message = "written by this term"
	if _, err := f.ex.update(f.ctx, rec); err != nil {
		t.Fatal(err)
	}
	newer, err := f.ex.store.BeginTerm(f.ctx, "ex") // another process took the instance over
	if err != nil {
		t.Fatal(err)
	}
	api := newFx(t, func(c *Config) { c.RecordOnly = true; c.Store = f.ex.store })
	if err := api.ex.Cancel(f.ctx, "x"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if f.record("x").CancelledAt.IsZero() {
		t.Fatal("CancelledAt not written")
	}
	if e, err := f.ex.store.Epoch(f.ctx, "ex"); err != nil || e != newer+1 {
		// api's fixture began a term of its own (newer+1): the cancel did
		// not begin or end any.
		t.Fatalf("epoch %d (%v), want %d", e, err, newer+1)
	}
}
