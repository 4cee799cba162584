package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Reasons of a task's state that only the executor sets (besides podstate's).
const (
	reasonSubmitted      = "Submitted"
	reasonWaitingForSlot = "WaitingForSlot"
	reasonWaitingForStop = "WaitingForPreviousPod"
	reasonCreating       = "Creating"
	reasonCreateFailed   = "CreateFailed"
	reasonRetryBackoff   = "RetryBackoff"
	reasonReadingResult  = "ReadingResult"
)

// stopRecheck is how often a task whose pod someone else is stopping, or
// whose kept pod kubetask stopped, is looked at when no pod event comes: a
// safety net; the pod's events normally bring the task back at once.
const stopRecheck = 30 * time.Second

// resultRetry is the delay before reading a File result again after a
// passing failure.
const resultRetry = 2 * time.Second

// progress is the latest derived state of an unfinished task. It is kept in
// memory and delivered as events, not written to the Store: recovery derives
// it again from the pod.
type progress struct {
	attempt                int
	phase, reason, message string
	exitCode               *int32
}

// taskMemo is what the executor remembers of one task between its passes,
// kept in one map entry per task: a map entry costs about as much as what
// most of these hold, and a tracked pod's task has all three.
type taskMemo struct {
	// live is the latest derived state of an unfinished task (not
	// persisted), when hasLive.
	live progress
	// nonce is that of the record the memory of the task is of, when
	// nonceKnown (recordOf; syncView).
	nonce string
	// ungated is the pod whose fence gate this process removed (noteUngated).
	ungated types.UID
	// phase is the task's latest class (taskClass: namespace, phase and
	// reason), when hasPhase (observe): its phase is the one counted in the
	// kubetask_tasks gauge, and the scrape-time gauges count it
	// (queueCollector). A task that forget drops keeps it.
	phase                         interned
	hasLive, nonceKnown, hasPhase bool // 112 B in all, a size class of Go's allocator
}

// memoLocked returns task id's memo, a new one when it has none; e.mu is
// held.
func (e *Executor) memoLocked(id string) *taskMemo {
	m := e.memos[id]
	if m == nil {
		m = &taskMemo{}
		e.memos[id] = m
	}
	return m
}

// dropLiveLocked forgets task id's derived state, and its memo once that
// holds nothing; e.mu is held.
func (e *Executor) dropLiveLocked(id string) {
	m := e.memos[id]
	if m == nil {
		return
	}
	m.live, m.hasLive = progress{}, false
	e.tidyMemoLocked(id, m)
}

// tidyMemoLocked drops m, task id's memo, when it holds nothing; e.mu is
// held.
func (e *Executor) tidyMemoLocked(id string, m *taskMemo) {
	if *m == (taskMemo{}) {
		delete(e.memos, id)
		e.memos = emptied(e.memos)
	}
}

// gateMemo remembers whether the pod of a task's attempt was seen with
// scheduling gates and when it was first seen without them
// (podstate.Policy.UngatedAt).
type gateMemo struct {
	attempt   int
	sawGated  bool
	ungatedAt time.Time
}

// sync brings task id one step closer to its goal from the current state of
// its record and its pods, and returns when it wants to look again (0: when
// something changes). It is idempotent: every pass decides from the record
// and the pods as they are now. Every requeue is in its return value.
func (e *Executor) sync(ctx context.Context, id string) (time.Duration, error) {
	for range viewTries {
		d, err := e.syncView(ctx, id)
		if !errors.Is(err, errViewMoved) {
			return d, err
		}
	}
	return e.cfg.RetryPeriod, nil // the record keeps changing under the pass: look again soon
}

// viewTries bounds the passes of one sync whose record changed between the
// read it decided from and the read that confirms a discard.
const viewTries = 3

// errViewMoved ends a pass that was about to discard a pod on a record read
// before the pod was seen, and found on a second read that the record had
// changed since: the pass starts again from the record as it is now.
var errViewMoved = errors.New("the task's record changed since this pass read it")

// syncView is one pass of sync over one view: the record, then the pods
// the cache shows. A discard (a pod the record does not take) is decided
// only on a record read after the pods were seen: the record is written
// before a pod's gate is removed, so a pod this process's own creator
// recorded and ungated after the pass's first read is never taken for one
// whose gate was removed by hand.
func (e *Executor) syncView(ctx context.Context, id string) (time.Duration, error) {
	rec, err := e.store.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return 0, e.releaseUnknown(ctx, id)
	}
	if err != nil {
		return 0, fmt.Errorf("reading task %s: %w", id, err)
	}
	// lostOnly: the task is another instance's now, placed on another
	// cluster (or on none), but this instance's cache shows pods of it: of
	// attempts declared lost on this cluster (LoseAttempt), back in view (a
	// returning cluster), or of an attempt moved away before its pod was
	// recorded (a creation on its way when the move was written, its pod
	// still gated). They are stopped and released here, as finished
	// attempts' pods are, or discarded (fitOf: a pod of an attempt placed on
	// another cluster), and nothing else of the task is this instance's to
	// do.
	lostOnly := false
	if rec.Executor != e.cfg.InstanceID && (!rec.Terminal || !slices.Contains(e.cfg.AdoptFrom, rec.Executor)) {
		if !e.strandedHere(rec) {
			// Another instance's task: moved away while it waited in
			// this one's line, it leaves the line (a move would otherwise
			// leave it at the line's head for good, holding a free slot in
			// every plan).
			e.unwait(id)
			e.disown(id)
			return 0, nil
		}
		lostOnly = true
	}
	if !lostOnly && !rec.Terminal && rec.Cluster != e.cfg.Cluster {
		// Placed on another cluster (a move sets the instance and the
		// cluster together; this is a record no move of kubetask's writes):
		// none of its attempts is this instance's to run.
		e.cfg.Logger.Warn("a task of this instance is placed on another cluster; leaving it", "task", id, "cluster", rec.Cluster, "executor cluster", e.cfg.Cluster)
		e.unwait(id)
		e.disown(id)
		return 0, nil
	}
	e.recordOf(id, rec.Nonce)
	// A finished task of an instance this one adopts from is not adopted
	// (adopt moves unfinished ones), but its pods are: the gone instance may
	// have recorded the outcome and stopped before releasing them, and
	// nobody else ever would (simulation seed 1004: a finalizer left for
	// good). Only finishPod's actions follow: the record is not written.
	var t task.Task
	if err := json.Unmarshal(rec.Task, &t); err != nil {
		return 0, fmt.Errorf("decoding task %s: %w", id, err)
	}
	e.cfg.Tracer.see(rec, &t)
	ident := task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Executor: e.cfg.InstanceID, Nonce: rec.Nonce}
	now := e.cfg.Clock.Now()
	pods, discard, newer := e.fitPods(rec, ident)
	discard = e.leftToCreator(rec.ID, discard)
	if len(discard) > 0 && !newer {
		again, err := e.store.Get(ctx, id)
		if err != nil {
			return 0, fmt.Errorf("reading task %s again before a discard: %w", id, err)
		}
		if again.Version != rec.Version || again.Nonce != rec.Nonce {
			// Changed, or another record: a record of an ID used again
			// (after retention deleted the earlier one) starts its
			// versions again (simulation seed 2600199020).
			return 0, errViewMoved
		}
	}
	if newer {
		// A newer term of this instance began elsewhere: this one is stale.
		// Act on nothing. The store tells whether that term is still the
		// newest: then this one ends now, as a fenced write would end it.
		// Nothing else might end it: this process may hold the Lease again
		// (the newer term's process handed it back), and a pass that acts on
		// nothing writes nothing (simulation seed 100036257: the shard's
		// next replica kept its stale term and left a task's pod gated for
		// good). A newer term of its own then discards that pod.
		epoch := e.epoch.Load()
		cur, err := e.store.Epoch(ctx, e.cfg.InstanceID)
		if err != nil {
			return 0, fmt.Errorf("reading the instance's term (task %s shows a newer term's pod): %w", id, err)
		}
		if cur > epoch {
			e.endFencedTerm(epoch, "a pod of a newer term showed", "task", id, "term", cur)
		}
		return e.cfg.RetryPeriod, nil
	}
	var errs []error
	for _, p := range discard {
		errs = append(errs, e.retryAction(&podAction{kind: actDiscard, id: rec.ID, attempt: rec.Attempt, pod: p, at: now}))
	}
	for _, p := range pods {
		if p.Labels[task.LabelExecutor] != e.cfg.InstanceID {
			// Adopted from a gone instance: move it to this one first (the
			// update brings the task back). Once: a pass before the cache
			// shows the new label (another change of the task brought it
			// back) waits for it rather than send it again (1.33 relabels
			// per task in test/costs).
			if e.relabelSent(rec.ID, p.UID) {
				return 0, nil
			}
			return 0, e.relabel(ctx, rec.ID, p)
		}
	}
	if len(e.cfg.AdoptFrom) > 0 { // only an adopter relabels: no lock on other executors' passes
		e.relabelShown(rec.ID)
	}

	var next requeue
	// Pods of attempts whose outcome is recorded: stop, release, delete.
	for n, p := range pods {
		if out, ok := outcomeOf(rec, n); ok {
			if end, ok := e.discardedEnd(&t, out, p, now); ok {
				// Recorded before the pod may go (finishPod releases it).
				r, err := e.recordDiscarded(ctx, rec, n, end)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				rec = r
			}
			d, err := e.finishPod(&t, rec.ID, out, p, now)
			next.after(d)
			errs = append(errs, err)
		}
	}
	e.reportReleases(rec.ID, pods, discard)
	if lostOnly {
		return next.d, errors.Join(errs...)
	}
	if rec.Terminal {
		e.unwait(rec.ID)
		if len(pods) == 0 && len(discard) == 0 { // a done discard is kept while its pod shows
			e.forget(rec.ID)
		}
		return next.d, errors.Join(errs...)
	}
	d, err := e.syncAttempt(ctx, &t, rec, ident, pods, now)
	next.after(d)
	return next.d, errors.Join(append(errs, err)...)
}

// discardedEnd returns how pod, of an attempt declared lost on this
// executor's cluster (out, ClusterLost, its UID), ended, once its main
// container terminated and while no end is recorded for it.
func (e *Executor) discardedEnd(t *task.Task, out store.AttemptOutcome, pod *corev1.Pod, now time.Time) (store.DiscardedEnd, bool) {
	if out.Reason != string(podstate.ReasonClusterLost) || out.Cluster != e.cfg.Cluster || out.Discarded != nil || out.PodUID != string(pod.UID) {
		return store.DiscardedEnd{}, false
	}
	term := mainTerminated(pod, t.Spec.MainContainer)
	if term == nil {
		return store.DiscardedEnd{}, false
	}
	code := term.ExitCode
	return store.DiscardedEnd{ExitCode: &code, Reason: term.Reason, FinishedAt: term.FinishedAt.Time, ObservedAt: now}, true
}

// recordDiscarded writes end as what the pod of lost attempt n of rec did:
// a compare-and-swap at rec's version, unfenced (the record may be another
// instance's, and the write changes nothing that instance decides on: not
// its attempt, instance, pod or phase; a write of its own at that version
// is refused and retried from the record as it then is). It returns the
// record as stored.
func (e *Executor) recordDiscarded(ctx context.Context, rec store.Record, n int, end store.DiscardedEnd) (store.Record, error) {
	rec.Attempts = slices.Clone(rec.Attempts)
	for i := range rec.Attempts {
		if rec.Attempts[i].Attempt == n {
			rec.Attempts[i].Discarded = &end
		}
	}
	rec.Epoch = 0
	out, err := e.store.Update(ctx, rec)
	if err != nil {
		return rec, fmt.Errorf("recording how the pod of lost attempt %d of task %s ended: %w", n, rec.ID, err)
	}
	e.cfg.Logger.Info("the pod of an attempt lost with its cluster ended; recorded as discarded, not the task's", "task", rec.ID, "attempt", n, "exit code", *end.ExitCode, "reason", end.Reason)
	return out, nil
}

// leftToCreator drops from discard the pod of this process's creation of
// task id that is in flight: its creator records it or discards it itself
// (claimPod). A pass must not: the task may be moved away and back between
// the pass's reads and the creator's claim, whose compare-and-swap then
// records the pod the pass deleted (simulation seed 2600191794: the attempt
// ended DeletedExternally). Checked before the record is read again for
// the discard: a creation done by then has written what it claimed, and
// that read sees it.
func (e *Executor) leftToCreator(id string, discard []*corev1.Pod) []*corev1.Pod {
	if len(discard) == 0 {
		return discard
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.creations[id]
	if c == nil || c.done {
		return discard
	}
	return slices.DeleteFunc(discard, func(p *corev1.Pod) bool { return p.Name == c.name })
}

// strandedHere reports whether rec, another instance's, is placed on
// another cluster than this executor's (or on none) while this instance's
// cache shows pods of the task: pods of attempts lost here, or of an
// attempt moved away, which syncView stops, releases or discards.
// Instances of one cluster never hand records to each other by a move, so
// a record of this cluster that is another instance's is left alone.
func (e *Executor) strandedHere(rec store.Record) bool {
	return e.cfg.Cluster != "" && rec.Cluster != e.cfg.Cluster && len(e.podsOfRun(rec.ID)) > 0
}

// syncAttempt moves the current attempt on: create its pod, follow its
// state, decide and record its outcome.
func (e *Executor) syncAttempt(ctx context.Context, t *task.Task, rec store.Record, ident task.Identity, pods map[int]*corev1.Pod, now time.Time) (time.Duration, error) {
	n := rec.Attempt
	// stale: the pod may be older than the API server's (the cache, or the
	// copy a creation returned); fresh: just read from the API server.
	pod, stale := pods[n], true
	cr, creating := e.creationOf(rec.ID)
	if creating && (cr.attempt != n || cr.done && !cr.seen && now.Sub(cr.doneAt) >= expectationTimeout ||
		cr.done && (errors.Is(cr.err, errNotClaimed) || errors.Is(cr.err, store.ErrFenced))) {
		// An older attempt's, one the cache never showed, or one the fence
		// kept from running: decide from the record as it is now.
		e.dropCreation(rec.ID)
		creating = false
	}
	if creating && !cr.done {
		// Queued or in flight: the creator records the pod and removes its
		// gate, and brings the task back. A pass that acted on the pod the
		// cache shows meanwhile would write the record and send the ungate
		// a second time (one of the two ungates refused, then a GET: 0.2-1
		// per task in test/costs).
		return 0, nil
	}
	if pod == nil && creating {
		switch {
		case cr.err != nil:
			return e.createFailed(ctx, t, rec, cr, now)
		case cr.obj != nil:
			pod = cr.obj.pod() // created; the cache has not shown it yet
		}
	}
	if pod == nil && rec.PodCreated && !creating {
		// The cache may lag, or the pod is gone: ask the API server.
		live, err := e.readPod(ctx, rec, ident, n)
		if err != nil {
			return 0, err
		}
		pod, stale = live, false
	}
	if pod == nil && !rec.PodCreated {
		return e.startAttempt(ctx, t, rec, ident, pods, now)
	}
	if pod != nil && !rec.PodCreated {
		var err error
		if rec, err = e.markCreated(ctx, rec, pod, !creating || cr.adopted, now); err != nil {
			return 0, err
		}
	}
	if creating && (cr.seen || pod == nil) {
		e.dropCreation(rec.ID)
	}
	e.unwait(rec.ID) // the attempt has (or had) its pod: no slot to wait for

	e.capturesDone(e.captureCtx(), t, rec.ID, n, pod) // follow the logs while the attempt runs

	policy := t.Policy()
	policy.CancelledAt = rec.CancelledAt
	policy.UngatedAt = e.ungatedAt(rec.ID, n, pod, now)
	st := podstate.Derive(withoutFenceGate(pod), policy, now)
	if st.Terminal() && st.Timed && stale {
		// The clock decided: confirm on a fresh read, so that a stalled watch
		// never turns a running or finished pod into a timeout.
		live, err := e.readPod(ctx, rec, ident, n)
		if err != nil {
			return 0, err
		}
		pod = live
		policy.UngatedAt = e.ungatedAt(rec.ID, n, pod, now)
		st = podstate.Derive(withoutFenceGate(pod), policy, now)
	}
	if !st.Terminal() {
		if pod != nil && attempt.Fenced(pod) && rec.PodUID == string(pod.UID) && !e.ungatedBy(rec.ID, pod.UID) &&
			rec.CancelledAt.IsZero() && pod.DeletionTimestamp == nil {
			// Recorded, and its gate left on (the creator's removal failed,
			// or its process ended in between): it may run now, unless this
			// pass decides its outcome (then it is deleted, never run).
			if err := e.retryAction(&podAction{kind: actUngate, id: rec.ID, attempt: n, pod: pod, at: now}); err != nil {
				return 0, err
			}
		}
		// The record first, then Get and the events: an answer of Get, or an
		// event a watcher acts on, is never ahead of what lists and the
		// other replicas read from the store.
		if err := e.persistProgress(ctx, rec, st); err != nil {
			return 0, err
		}
		from := e.setProgress(rec, string(st.Phase), string(st.Reason), st.Message, nil)
		e.noteStart(rec, t, pod, from)
		return untilRecheck(st, now), nil
	}
	if wait := e.stoppedByOthersWait(rec, t, pod, st, now); wait > 0 {
		return wait, nil
	}
	if st.ExitCode == nil && stoppedByOthers(st.Reason) && stale && pod != nil {
		// About to decide from a stop by someone else, not from the main
		// container: confirm on a view at least as new as what the kubelet
		// has reported, so that an exit reported just before is never lost.
		live, err := e.readPod(ctx, rec, ident, n)
		if err != nil {
			return 0, err
		}
		pod, stale = live, false
		policy.UngatedAt = e.ungatedAt(rec.ID, n, pod, now)
		st = podstate.Derive(withoutFenceGate(pod), policy, now)
		if !st.Terminal() {
			if err := e.persistProgress(ctx, rec, st); err != nil {
				return 0, err
			}
			e.setProgress(rec, string(st.Phase), string(st.Reason), st.Message, nil)
			return untilRecheck(st, now), nil
		}
		if wait := e.stoppedByOthersWait(rec, t, pod, st, now); wait > 0 {
			return wait, nil
		}
	}
	decided := pod // the pod the outcome names
	if s, ok := e.sealedOutcome(rec.ID, n, pod); ok {
		if pod != nil && pod.DeletionTimestamp == nil && stale {
			// What the cache (or the creation's answer) shows may be
			// older than the deletion: ask the API server.
			live, err := e.readPod(ctx, rec, ident, n)
			if err != nil {
				return 0, err
			}
			pod = live
		}
		if pod != nil && pod.DeletionTimestamp == nil {
			// Decided while the pod was bound to no node; its deletion has
			// not shown yet (a removal of its gate that was on its way may
			// have landed meanwhile: the simulator's seed 2799). The
			// outcome waits for the deletion, whatever the pod shows now.
			if err := e.retryAction(&podAction{kind: actDelete, id: rec.ID, attempt: n, pod: pod, at: now}); err != nil {
				return 0, err
			}
			return 0, nil // the deletion's event brings the task back
		}
		st = s.st
		if pod == nil {
			decided = s.pod // gone since: the outcome still names it
		}
	} else if pod != nil && pod.Spec.NodeName == "" {
		// Not bound to a node (its fence gate still on, or waiting for the
		// scheduler): nothing of it ran as far as this view shows, and
		// nothing of it is worth keeping. It is deleted before the outcome
		// is recorded, so that neither the scheduler (binding it a moment
		// later: a Keep task's pod released unbound ran on after its
		// Cancelled outcome, simulation seed 1796531263076793643) nor a
		// removal of its gate still on its way (its creator's, between
		// recording and ungating, or a retried one) lets it run after the
		// outcome: kube-apiserver refuses to bind a pod that is being
		// deleted. The outcome decided now is the one recorded once the
		// deletion shows (the deletion itself would read as someone else's).
		if pod.DeletionTimestamp == nil {
			if err := e.retryAction(&podAction{kind: actDelete, id: rec.ID, attempt: n, pod: pod, at: now}); err != nil {
				return 0, err
			}
			e.seal(rec.ID, sealing{attempt: n, uid: pod.UID, st: st, pod: pod.DeepCopy()})
			e.setProgress(rec, string(podstate.Pending), string(podstate.ReasonStopping),
				"deleting pod "+pod.Name+", which never ran, before recording the outcome: "+st.Message, nil)
			return 0, nil // the deletion's event brings the task back
		}
	}
	var result []byte
	if pod != nil && st.Phase == podstate.Succeeded && t.Spec.Result != nil {
		res, retry, failed := e.readResult(ctx, t, pod, now)
		if retry > 0 {
			from := e.setProgress(rec, string(podstate.Running), reasonReadingResult, failed.Message, st.ExitCode)
			e.noteStart(rec, t, pod, from)
			return retry, nil
		}
		if failed.Phase != "" {
			st = failed
		}
		result = res
	}
	rec, retry, err := e.record(ctx, t, rec, decided, st, result, now)
	if err != nil {
		return 0, err
	}
	var next requeue
	if pod != nil {
		out, _ := outcomeOf(rec, n)
		d, err := e.finishPod(t, rec.ID, out, pod, now)
		if err != nil {
			return 0, err
		}
		next.after(d)
	}
	if retry {
		next.after(max(rec.NextAttemptAt.Sub(now), time.Millisecond))
	}
	return next.d, nil
}

// startAttempt creates the current attempt's pod once nothing stands in the
// way: a cancellation, the retry backoff, a previous attempt's pod that may
// still run, or a parallelism limit (the slot plan: allot).
func (e *Executor) startAttempt(ctx context.Context, t *task.Task, rec store.Record, ident task.Identity, pods map[int]*corev1.Pod, now time.Time) (time.Duration, error) {
	n := rec.Attempt
	if !rec.CancelledAt.IsZero() {
		e.unwait(rec.ID)
		st := podstate.State{Phase: podstate.Failed, Reason: podstate.ReasonCancelled, Message: "the task was cancelled before its pod was created"}
		_, _, err := e.record(ctx, t, rec, nil, st, nil, now)
		return 0, err
	}
	if wait := rec.NextAttemptAt.Sub(now); wait > 0 {
		return wait, nil
	}
	for m, p := range pods {
		if m < n && !podstate.Stopped(p) {
			e.waitForPrevious(rec, p, m)
			return stopRecheck, nil
		}
	}
	if p, err := e.previousUnseen(ctx, rec, ident, pods); err != nil {
		return 0, err
	} else if p != nil {
		// The cache has not shown it yet (its watch lags: the outcome was
		// decided on a fresh read), and it runs: it is stopped or deleted
		// as the cache's copy would be, and the attempt waits for it.
		out, _ := outcomeOf(rec, n-1)
		d, err := e.finishPod(t, rec.ID, out, p, now)
		if err != nil {
			return 0, err
		}
		e.waitForPrevious(rec, p, n-1)
		return min(max(d, time.Millisecond), stopRecheck), nil
	}
	pod, err := task.BuildPod(t, ident, n)
	if err != nil {
		return 0, fmt.Errorf("building pod of task %s: %w", rec.ID, err)
	}
	e.cfg.Tracer.stampPod(t, pod, n)
	if by := rec.SubmittedBy.String(); by != "" {
		pod.Annotations[task.AnnotationSubmittedBy] = by
	}
	if wait := e.createRetryAt(rec.ID, n).Sub(now); wait > 0 {
		return wait, nil // the previous creation failed: its backoff
	}
	if ok, why := e.admit(rec, n, pod, t.Spec.Priority); !ok {
		if why == "" {
			return 0, nil // a creation of this task is under way
		}
		if recordPending(rec, reasonWaitingForSlot, why) {
			if err := e.persistPending(ctx, rec, reasonWaitingForSlot, why); err != nil {
				return 0, err
			}
		}
		e.setProgress(rec, string(podstate.Pending), reasonWaitingForSlot, why, nil)
		return 0, nil // woken when a slot frees
	}
	e.setProgress(rec, string(podstate.Pending), reasonCreating, "creating pod "+pod.Name, nil)
	return 0, nil
}

// waitForPrevious shows that rec's current attempt waits for pod, of
// attempt m, to stop.
func (e *Executor) waitForPrevious(rec store.Record, pod *corev1.Pod, m int) {
	e.setProgress(rec, string(podstate.Pending), reasonWaitingForStop,
		fmt.Sprintf("attempt %d starts once no container of pod %s (attempt %d) runs any more", rec.Attempt, pod.Name, m), nil)
}

// previousUnseen returns the pod of the previous attempt when the cache does
// not show it and it may still run; nil when it stopped or is gone. Attempt
// n starts only once no container of attempt n-1's pod runs (and n-1 started
// only once n-2's stopped): pods of recorded attempts leave the cache when
// they are gone or released, which happens only after they stopped, but a
// lagging watch may also not have shown one yet while it runs on (a Keep
// task's sidecar still stopping: simulation seed 110000675). So a pod the
// cache does not show is read from the API server, unless this process saw
// it stopped (noteStopped): one GET per retry after a restart, none else.
func (e *Executor) previousUnseen(ctx context.Context, rec store.Record, ident task.Identity, pods map[int]*corev1.Pod) (*corev1.Pod, error) {
	m := rec.Attempt - 1
	if m < 0 || pods[m] != nil {
		return nil, nil
	}
	out, ok := outcomeOf(rec, m)
	if !ok || out.PodUID == "" {
		return nil, nil // no pod was created
	}
	if out.Cluster != e.cfg.Cluster {
		// On another cluster, declared lost (LoseAttempt): the attempt
		// that follows a loss does not wait for a pod nobody can see.
		return nil, nil
	}
	e.mu.Lock()
	seen := e.stopped[rec.ID] == types.UID(out.PodUID)
	e.mu.Unlock()
	if seen {
		return nil, nil
	}
	name := task.PodName(ident, m)
	live, err := e.client.CoreV1().Pods(ident.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading pod %s/%s of attempt %d: %w", ident.Namespace, name, m, err)
	case live.UID != types.UID(out.PodUID):
		return nil, nil // gone; the name is someone else's now
	}
	pod := compactPod(live).pod()
	if podstate.Stopped(pod) {
		e.noteStopped(rec.ID, pod)
		return nil, nil
	}
	return pod, nil
}

// noteStopped remembers that pod, of a recorded attempt of task id, was
// seen with nothing running: for good, unless it was never bound to a node
// and is not being deleted (a stale copy of a pod bound since).
func (e *Executor) noteStopped(id string, pod *corev1.Pod) {
	if pod.Spec.NodeName == "" && pod.DeletionTimestamp == nil {
		return
	}
	e.mu.Lock()
	e.stopped[id] = pod.UID
	e.mu.Unlock()
}

// createFail counts the failed creations of one attempt's pod.
type createFail struct {
	attempt int
	count   int
	first   time.Time // the first failure
	retryAt time.Time // no creation before
}

// Backoff of failed creations: from createBackoffFirst, doubling, at most
// createBackoffCap.
const (
	createBackoffFirst = 200 * time.Millisecond
	createBackoffCap   = 30 * time.Second
)

// createFailed decides what a failed creation means: the API server rejected
// the pod (Invalid) or its name is taken by a pod that is not the task's:
// the task fails; anything else (429, 5xx, exceeded quota, a webhook, a
// namespace not yet created) is retried with a backoff of its own (from
// 200 ms, doubling up to 30 s: the work queue's resets at every pass that
// hands the pod to a creator) and shown in the task's state, until the
// attempt's schedule timeout, counted from the first failure, ends the task
// with ScheduleTimeout.
func (e *Executor) createFailed(ctx context.Context, t *task.Task, rec store.Record, cr creation, now time.Time) (time.Duration, error) {
	e.dropCreation(rec.ID)
	if apierrors.IsInvalid(cr.err) || errors.Is(cr.err, errNameTaken) {
		st := podstate.State{Phase: podstate.Failed, Reason: podstate.ReasonConfigError,
			Message: fmt.Sprintf("pod %s cannot be created: %v", cr.name, cr.err)}
		_, _, err := e.record(ctx, t, rec, nil, st, nil, now)
		return 0, err
	}
	e.mu.Lock()
	f := e.failures[rec.ID]
	if f.attempt != rec.Attempt || f.count == 0 {
		f = createFail{attempt: rec.Attempt, first: now}
	}
	f.count++
	delay := createBackoffCap
	if f.count <= 8 {
		delay = min(createBackoffFirst<<(f.count-1), createBackoffCap)
	}
	f.retryAt = now.Add(delay)
	e.failures[rec.ID] = f
	e.mu.Unlock()
	if limit := t.Spec.Timeouts.Schedule.Get(); limit > 0 && now.Sub(f.first) >= limit {
		st := podstate.State{Phase: podstate.Failed, Reason: podstate.ReasonScheduleTimeout,
			Message: fmt.Sprintf("pod %s could not be created for %s (schedule timeout): %v", cr.name, limit, cr.err)}
		_, _, err := e.record(ctx, t, rec, nil, st, nil, now)
		return 0, err
	}
	msg := fmt.Sprintf("creating pod %s failed %d times since %s, retrying in %s: %v", cr.name, f.count, f.first.UTC().Format(time.RFC3339), delay, cr.err)
	if recordPending(rec, reasonCreateFailed, msg) {
		// A failed write leaves the failure counted: the next failure's
		// pass writes it.
		if err := e.persistPending(ctx, rec, reasonCreateFailed, msg); err != nil {
			return 0, err
		}
	}
	e.setProgress(rec, string(podstate.Pending), reasonCreateFailed, msg, nil)
	return delay, nil
}

// createRetryAt is when the current attempt's pod may be created again
// after a failed creation (zero: now).
func (e *Executor) createRetryAt(id string, attempt int) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.failures[id]; f.attempt == attempt {
		return f.retryAt
	}
	return time.Time{}
}

// markCreated records that the current attempt's pod exists (a milestone:
// after a restart a missing pod then means it is gone).
func (e *Executor) markCreated(ctx context.Context, rec store.Record, pod *corev1.Pod, adopted bool, now time.Time) (store.Record, error) {
	rec.PodCreated = true
	rec.PodUID = string(pod.UID)
	rec.PodEpoch, _ = strconv.ParseInt(pod.Annotations[task.AnnotationEpoch], 10, 64) // 0: created before the fence
	rec.Phase, rec.Reason, rec.Message = string(podstate.Pending), string(podstate.ReasonScheduling), "pod "+pod.Name+" created"
	rec.ExitCode = nil
	updated, err := e.update(ctx, rec)
	if err != nil {
		return rec, fmt.Errorf("recording pod creation of task %s: %w", rec.ID, err)
	}
	e.mu.Lock()
	delete(e.failures, rec.ID)
	e.mu.Unlock()
	typ := EventPodCreated
	if adopted {
		typ = EventPodAdopted
	}
	e.emit(Event{ID: rec.ID, Attempt: rec.Attempt, Type: typ, Pod: pod.Namespace + "/" + pod.Name, PodUID: pod.UID,
		Phase: updated.Phase, Reason: updated.Reason, Message: updated.Message, Time: now})
	e.mu.Lock()
	m := e.memoLocked(rec.ID)
	m.live, m.hasLive = progress{attempt: updated.Attempt, phase: updated.Phase, reason: updated.Reason, message: updated.Message}, true
	e.mu.Unlock()
	e.observe(rec.ID, updated.Namespace, updated.Phase, updated.Reason, false)
	if !adopted {
		// Once per attempt: the write above succeeds once (compare-and-swap).
		e.metrics.admissionWait.WithLabelValues(rec.Namespace).Observe(admissionWait(rec, now).Seconds())
	}
	return updated, nil
}

// readResult reads a Succeeded attempt's result. It returns the result, or a
// delay after which to try again (a passing failure, within ResultTimeout of
// the main container's exit), or the failed state the attempt ends with.
func (e *Executor) readResult(ctx context.Context, t *task.Task, pod *corev1.Pod, now time.Time) ([]byte, time.Duration, podstate.State) {
	rctx, cancel := context.WithTimeout(ctx, e.cfg.ExecTimeout)
	res, err := attempt.ReadResult(rctx, e.execer, pod, t)
	cancel()
	if err == nil {
		return res, 0, podstate.State{}
	}
	code := int32(0)
	failed := podstate.State{Phase: podstate.Failed, Reason: podstate.ReasonResultFailed, ExitCode: &code,
		Message: fmt.Sprintf("main container %q exited with code 0 but its result could not be read: %v", t.Spec.MainContainer, err)}
	if attempt.ResultRetryable(err, pod) {
		since := mainFinishedAt(pod, t.Spec.MainContainer)
		if since.IsZero() || now.Before(since.Add(e.cfg.ResultTimeout)) {
			failed.Message = fmt.Sprintf("reading the result failed, retrying: %v", err)
			return nil, resultRetry, failed
		}
		failed.Message += fmt.Sprintf(" (still failing %s after the main container exited)", e.cfg.ResultTimeout)
	}
	return nil, 0, failed
}

// record writes the end of the current attempt exactly once (a stale pass
// finds it recorded and changes nothing) with the next step: another attempt
// after its backoff, or the task's final outcome. The AttemptFinished event
// follows the write.
func (e *Executor) record(ctx context.Context, t *task.Task, rec store.Record, pod *corev1.Pod, st podstate.State, result []byte, now time.Time) (store.Record, bool, error) {
	n := rec.Attempt
	if _, ok := outcomeOf(rec, n); ok {
		return rec, false, nil
	}
	e.mu.Lock()
	from := e.liveFromLocked(rec) // before rec moves on to the next attempt
	e.mu.Unlock()
	podName, podUID, finishedAt := "", "", now
	if pod != nil {
		podName, podUID = pod.Name, string(pod.UID)
		if ft := mainFinishedAt(pod, t.Spec.MainContainer); !ft.IsZero() {
			finishedAt = ft
		}
	}
	rec.Attempts = append(rec.Attempts, store.AttemptOutcome{
		Attempt: n, Pod: podName, PodUID: podUID, Phase: string(st.Phase), Reason: string(st.Reason),
		Message: st.Message, ExitCode: st.ExitCode, Retryable: st.Retryable, Cluster: e.cfg.Cluster, FinishedAt: finishedAt, ObservedAt: now,
		PodStopped: podstate.Stopped(pod), // nil: no pod, or gone
	})
	retry := rec.CancelledAt.IsZero() && t.ShouldRetry(st, n)
	if retry {
		delay := t.RetryDelay(n)
		rec.Attempt++
		rec.PodCreated, rec.PodUID, rec.PodEpoch = false, "", 0
		rec.NextAttemptAt = now.Add(delay)
		rec.Phase, rec.Reason = string(podstate.Pending), reasonRetryBackoff
		rec.Message = fmt.Sprintf("attempt %d ended %s; attempt %d starts in %s", n, st, rec.Attempt, delay)
		rec.ExitCode, rec.Retryable = nil, false
	} else {
		rec.Terminal = true
		rec.Phase, rec.Reason, rec.Message = string(st.Phase), string(st.Reason), st.Message
		rec.ExitCode, rec.Retryable, rec.Result = st.ExitCode, st.Retryable, result
	}
	updated, err := e.update(ctx, rec)
	if err != nil {
		return rec, false, fmt.Errorf("recording outcome of task %s: %w", rec.ID, err) // re-read and re-decide
	}
	e.metrics.outcomes.WithLabelValues(string(st.Phase), string(st.Reason)).Inc()
	if pod != nil {
		e.metrics.outcomeLag.Observe(now.Sub(finishedAt).Seconds())
	}
	if updated.Terminal {
		e.metrics.taskDuration.WithLabelValues(rec.Namespace, string(st.Phase)).Observe(max(now.Sub(rec.CreatedAt), 0).Seconds())
	}
	ev := Event{ID: rec.ID, Attempt: n, Type: EventAttemptFinished, Phase: string(st.Phase), Reason: string(st.Reason),
		Message: st.Message, ExitCode: st.ExitCode, Terminal: updated.Terminal, Result: result, Time: now,
		// A pod bound to no node is deleted whatever the cleanup (sealing).
		Delete: attempt.ShouldDelete(t.Spec.Cleanup, st) || pod != nil && pod.Spec.NodeName == ""}
	if pod != nil {
		ev.Pod, ev.PodUID = pod.Namespace+"/"+pod.Name, pod.UID
	}
	e.emit(ev)
	e.cfg.Tracer.recorded(t, updated, n, pod, now)
	e.mu.Lock()
	e.dropLiveLocked(rec.ID)
	delete(e.sealed, rec.ID)
	e.sealed = emptied(e.sealed)
	e.mu.Unlock()
	// A start the passes never saw (the main container started and ended
	// between two of them) is counted as the attempt ends.
	e.noteStart(rec, t, pod, from)
	e.observe(rec.ID, updated.Namespace, updated.Phase, updated.Reason, updated.Terminal)
	if retry {
		e.emit(Event{ID: rec.ID, Attempt: updated.Attempt, Type: EventState, Phase: updated.Phase, Reason: updated.Reason, Message: updated.Message, Time: now})
	}
	return updated, retry, nil
}

// finishPod acts on the pod of attempt out.Attempt, whose outcome is
// recorded: after the embedding's Hold, it deletes the pod or, when kept,
// stops what still runs in it; once no container runs it releases the
// finalizer (a kept pod is also labelled released, so it leaves the cache).
// The calls run on the cleaners (actions.go); finishPod decides the next one
// from the pod as it is now and returns when to look again while it waits.
func (e *Executor) finishPod(t *task.Task, id string, out store.AttemptOutcome, pod *corev1.Pod, now time.Time) (time.Duration, error) {
	if e.cfg.Hold != nil && e.cfg.Hold(id, out.Attempt) {
		if wait := out.ObservedAt.Add(e.cfg.HoldTimeout).Sub(now); wait > 0 {
			return wait, nil
		}
	}
	if podstate.Stopped(pod) {
		e.noteStopped(id, pod) // before any branch: a pod released with its delete is not seen again
	}
	key := pod.Namespace + "/" + pod.Name
	if a, ok := e.actionOf(key); ok {
		switch {
		case !a.done:
			return 0, nil // in flight: the cleaner brings the task back
		case a.err != nil:
			if !a.releases() || hasFinalizer(pod) {
				e.clearAction(key)
				return 0, a.err // rate-limited retry of the pass
			}
			// The call failed, yet the pod shows the finalizer gone: the
			// release took effect (beside a DELETE that did not, say). It
			// is reported now; what is left is decided below.
		case !a.reflected(pod) && now.Sub(a.doneAt) < actionSettle:
			return 0, nil // the cache will show it
		}
		e.reportDone(id, func(k string) bool { return k == key }) // this pod's done release is reported before it is forgotten
	}
	phase := podstate.Phase(out.Phase)
	// A pod bound to no node never ran: nothing of it is worth keeping,
	// whatever the cleanup (kept, a gated one waited for ever with the
	// finalizer on: simulation seed 7211), and deleted it cannot be bound
	// any more.
	del := attempt.ShouldDelete(t.Spec.Cleanup, podstate.State{Phase: phase}) || pod.Spec.NodeName == ""
	name := key
	switch {
	case del && pod.DeletionTimestamp == nil:
		e.emit(Event{ID: id, Attempt: out.Attempt, Type: EventPodDeleting, Pod: name, PodUID: pod.UID, Time: now})
		a := &podAction{kind: actDelete, id: id, attempt: out.Attempt, pod: pod, at: now}
		if podFinished(pod) && hasFinalizer(pod) && e.capturesDone(e.captureCtx(), t, id, out.Attempt, pod) {
			a.kind, a.held = actDeleteRelease, true // nothing runs, nothing left to read: released with the delete
		}
		e.startAction(a)
		return 0, nil
	case !del && pod.DeletionTimestamp == nil && !podstate.Stopped(pod):
		policy := t.Policy()
		if !podstate.Derive(pod, policy, now).StopPod {
			break // it ends by itself
		}
		if secs, ok := podstate.StopDeadlineSeconds(pod, now); ok && pod.Spec.ActiveDeadlineSeconds != nil && *pod.Spec.ActiveDeadlineSeconds <= secs {
			break // already stopping
		}
		e.emit(Event{ID: id, Attempt: out.Attempt, Type: EventPodStopping, Pod: name, PodUID: pod.UID, Time: now})
		e.startAction(&podAction{kind: actStop, id: id, attempt: out.Attempt, pod: pod, at: now})
		return 0, nil
	}
	if !podstate.Stopped(pod) {
		return stopRecheck, nil
	}
	held := hasFinalizer(pod)
	if held && !e.capturesDone(e.captureCtx(), t, id, out.Attempt, pod) {
		return 0, nil // the finalizer stays until the logs are archived; a capture's end brings the task back
	}
	if held || (!del && pod.Labels[task.LabelReleased] != "true") {
		e.startAction(&podAction{kind: actRelease, id: id, attempt: out.Attempt, pod: pod, mark: !del, held: held, at: now})
	}
	return 0, nil
}

// podFinished reports whether pod's phase is Succeeded or Failed, which the
// kubelet sets only once every container has terminated for good.
func podFinished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// reportReleases emits PodReleased for the releases of task id that are
// done, once, whether or not the pod is still there (a deleted pod goes as
// soon as its finalizer is off), and forgets the actions on pods that are
// gone. A done action on a pod the pass discards is kept while the cache
// shows that pod: forgotten, the next pass would send the discard again,
// and the cleaner's answer bring the task back to one more, with no pause
// for as long as the watch lags (simulation seed 1400056336).
func (e *Executor) reportReleases(id string, pods map[int]*corev1.Pod, discard []*corev1.Pod) {
	present := map[string]bool{}
	for _, p := range pods {
		present[p.Namespace+"/"+p.Name] = true
	}
	for _, p := range discard {
		present[p.Namespace+"/"+p.Name] = true
	}
	e.reportDone(id, func(key string) bool { return !present[key] })
}

// reportDone emits PodReleased for the done releases of task id not yet
// reported, and forgets the done actions on the pods forget names (and only
// those: an action forgotten while its pod is still there is decided again,
// and reported again). A release whose call failed is reported too when
// forget names its pod: forget names pods that are gone, which a pod held
// by the finalizer cannot be, or (finishPod) a pod the cache shows
// without the finalizer. The call's error does not say that nothing was
// done: an API server that answers a timeout may have written (the
// DELETE of actDeleteRelease timed out while its release took effect, and
// the pod went with no PodReleased: test/bench/executor's fair run
// waited for it for good).
func (e *Executor) reportDone(id string, forget func(key string) bool) {
	type report struct {
		key string
		a   podAction
	}
	var reports []report
	e.mu.Lock()
	for key, a := range e.actions {
		if a.id != id || !a.done {
			continue
		}
		if a.releases() && !a.reported && (a.err == nil || forget(key)) {
			a.reported = true
			reports = append(reports, report{key, *a})
		}
		if forget(key) {
			delete(e.actions, key)
		}
	}
	e.actions = emptied(e.actions)
	e.mu.Unlock()
	for _, r := range reports {
		ev := Event{ID: id, Attempt: r.a.attempt, Type: EventPodReleased, Pod: r.key, Time: r.a.doneAt}
		if r.a.pod != nil {
			ev.PodUID = r.a.pod.UID
		}
		e.emit(ev)
	}
}

// releaseUnknown handles pods of a task the store does not know (an
// in-memory store after a restart, a record removed by hand): nobody will
// report them, so they are released and deleted rather than left running or
// stuck Terminating. Only the holder of the instance Lease runs this.
func (e *Executor) releaseUnknown(ctx context.Context, id string) error {
	var errs []error
	for _, p := range e.podsOfRun(id) {
		if p.Labels[task.LabelExecutor] != e.cfg.InstanceID {
			continue
		}
		e.cfg.Logger.Info("releasing pod of unknown task", "task", id, "pod", p.Namespace+"/"+p.Name)
		if err := attempt.ReleaseSeen(ctx, e.client, p, false); err != nil {
			errs = append(errs, err)
			continue
		}
		if p.DeletionTimestamp == nil {
			if err := attempt.Delete(ctx, e.client, p.Namespace, p.Name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// relabel moves an adopted pod of task id to this instance, and notes
// that it did (relabelSent) until the cache shows it (relabelShown).
func (e *Executor) relabel(ctx context.Context, id string, pod *corev1.Pod) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q},"annotations":{%q:%q}}}`,
		task.LabelExecutor, e.cfg.InstanceID, task.AnnotationExecutor, e.cfg.InstanceID)
	_, err := e.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("adopting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	e.mu.Lock()
	e.relabelled[id] = pod.UID
	e.mu.Unlock()
	return nil
}

// relabelSent reports whether this process relabelled task id's pod uid
// already, the cache not showing it yet.
func (e *Executor) relabelSent(id string, uid types.UID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	sent, ok := e.relabelled[id]
	return ok && sent == uid
}

// relabelShown forgets task id's relabel: the cache shows every pod of the
// task with this instance's label.
func (e *Executor) relabelShown(id string) {
	e.mu.Lock()
	delete(e.relabelled, id)
	e.mu.Unlock()
}

// podFit is what a pod of a task's run is to the task's record.
type podFit int

const (
	// fitOwn: the pod of a recorded attempt, or of the current one (also a
	// pod created before the fence existed): the executor acts on it.
	fitOwn podFit = iota
	// fitCreating: the current attempt's pod, created by this term and not
	// recorded yet: its creator records it or discards it.
	fitCreating
	// fitDiscard: a pod the record does not take, which never ran (still
	// gated): created by a stale term, or of an earlier record with the same
	// ID. It is discarded and never decides an outcome.
	fitDiscard
	// fitNewer: the current attempt's pod, not recorded, created by a newer
	// term than this one: this term is stale (another process took the
	// instance over) and the record it read may be older than that term's
	// record of the pod. It neither acts on the pod nor discards it.
	fitNewer
)

// fitOf says what pod, of attempt n of rec's run, is to rec while the
// executor's current term has epoch. A pod whose nonce or UID does not match
// what rec records is never the task's: a stale term's pod (gated, never
// run) is discarded; one that runs although no record takes it (its gate
// removed by hand) is discarded too, so that it never decides an outcome.
// foreign says that pod was created by another instance (one this executor
// adopts from, Config.AdoptFrom): its epoch is of that instance's terms, not
// comparable with epoch. The record is this instance's since the adoption,
// which no write of that instance's terms can follow (the adoption changed
// the record's version), so a foreign pod the record does not take is
// discarded whatever its epoch. cluster is the executor's (Config.Cluster):
// the pod is in it, and a UID the record holds is compared with the pod's
// only when the record (or the attempt's outcome) names that cluster, so a
// pod is never taken for another cluster's with the same UID.
func fitOf(rec store.Record, pod *corev1.Pod, n int, epoch int64, foreign bool, cluster string) podFit {
	uid := string(pod.UID)
	if pod.Annotations[task.AnnotationNonce] != rec.Nonce {
		return fitDiscard // an earlier record's, with the same ID
	}
	if out, ok := outcomeOf(rec, n); ok {
		if out.Cluster == cluster && (out.PodUID == "" || out.PodUID == uid) {
			return fitOwn
		}
		return fitDiscard // not the pod whose outcome is recorded
	}
	if n != rec.Attempt {
		return fitOwn
	}
	fenced, stamped := attempt.Fenced(pod), pod.Annotations[task.AnnotationEpoch] != ""
	podEpoch, _ := strconv.ParseInt(pod.Annotations[task.AnnotationEpoch], 10, 64)
	switch {
	case rec.Cluster != cluster:
		return fitDiscard // the attempt is placed on another cluster
	case rec.PodCreated && (rec.PodUID == "" || rec.PodUID == uid):
		return fitOwn // recorded (before the fence: by identity)
	case rec.PodCreated:
		return fitDiscard
	case foreign && stamped:
		return fitDiscard
	case fenced && podEpoch == epoch:
		return fitCreating
	case stamped && podEpoch > epoch:
		// A newer term records its pod before it removes the gate, and its
		// beginning fenced this term's writes; but this pass may have read
		// the record before that term recorded the pod.
		return fitNewer
	case !stamped && !fenced:
		return fitOwn // created before the fence existed, not recorded yet: adopted
	}
	return fitDiscard
}

// fitPods returns the cached pods of rec's run by attempt that the
// executor acts on, and those to discard (fitOf); newer is true when a
// pod shows that a newer term of the instance runs elsewhere. Only pods whose identity
// is the task's count (a pod of an instance in AdoptFrom is relabelled to
// this one first); pods of the current term's creation in flight are in
// neither.
func (e *Executor) fitPods(rec store.Record, ident task.Identity) (own map[int]*corev1.Pod, discard []*corev1.Pod, newer bool) {
	own = map[int]*corev1.Pod{}
	epoch := e.epoch.Load()
	for _, p := range e.podsOfRun(ident.RunID) {
		id, n, err := task.IdentityFromPod(p)
		if err != nil || id.Namespace != ident.Namespace || id.Name != ident.Name || !e.ownsPod(p, task.Identity{
			Namespace: ident.Namespace, Name: ident.Name, RunID: ident.RunID, Nonce: id.Nonce}, n) {
			continue
		}
		switch fitOf(rec, p, n, epoch, id.Executor != e.cfg.InstanceID, e.cfg.Cluster) {
		case fitOwn:
			own[n] = p
		case fitDiscard:
			if p.DeletionTimestamp == nil || hasFinalizer(p) {
				e.cfg.Logger.Info("discarding a pod its task's record does not take", "task", rec.ID, "pod", p.Namespace+"/"+p.Name,
					"attempt", n, "uid", p.UID, "epoch", p.Annotations[task.AnnotationEpoch])
				discard = append(discard, p)
			}
		case fitNewer:
			newer = true
		}
	}
	return own, discard, newer
}

// readPod reads the pod of attempt n of rec (ident) from the API server:
// nil when it is gone, or when the name is taken by a pod that is not the
// attempt's recorded one. It returns what the cache would keep of it
// (cachedPod), so that a decision on a fresh read sees what one on the cache
// sees.
func (e *Executor) readPod(ctx context.Context, rec store.Record, ident task.Identity, n int) (*corev1.Pod, error) {
	name := task.PodName(ident, n)
	live, err := e.client.CoreV1().Pods(ident.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading pod %s/%s: %w", ident.Namespace, name, err)
	case !e.ownsPod(live, ident, n) || fitOf(rec, live, n, e.epoch.Load(), live.Annotations[task.AnnotationExecutor] != e.cfg.InstanceID, e.cfg.Cluster) != fitOwn:
		e.cfg.Logger.Warn("pod with the attempt's name is not the attempt's; ignoring it", "pod", ident.Namespace+"/"+name, "task", ident.RunID, "uid", live.UID)
		return nil, nil
	}
	return compactPod(live).pod(), nil
}

// persistProgress writes the pod's derived state to the task's record when
// its phase or reason differs from the stored one (a change of the message
// alone is not written): so that lists and their phase and reason filters
// show a task Running, or Pending and why (Unschedulable, ConfigError, ...),
// without a write at every pod update. A conflict is returned, and the sync
// retried.
func (e *Executor) persistProgress(ctx context.Context, rec store.Record, st podstate.State) error {
	if rec.Phase == string(st.Phase) && rec.Reason == string(st.Reason) {
		return nil
	}
	rec.Phase, rec.Reason, rec.Message, rec.ExitCode = string(st.Phase), string(st.Reason), st.Message, nil
	if _, err := e.update(ctx, rec); err != nil {
		return fmt.Errorf("recording the state %s/%s of task %s: %w", st.Phase, st.Reason, rec.ID, err)
	}
	return nil
}

// recordPending decides whether a pass that found task rec without its
// pod, Pending for reason (WaitingForSlot, CreateFailed) with message, writes
// that to the record: when the record says another phase or reason (it was
// Submitted, RetryBackoff, WaitingForSlot...); for WaitingForSlot also when
// the message names another limit (waitMessage names a limit, never a
// count); never for a change of a CreateFailed message alone (it counts the
// failures). So a task is written once as it starts waiting, and again only
// when another limit or a failed creation holds it at one of its passes (a
// waiting task is synced when it is submitted, when the slot plan may give
// it a slot, at a resync): never at every pass, nor as the slots in use
// change. The pod's creation ends it (markCreated writes Scheduling).
func recordPending(rec store.Record, reason, message string) bool {
	if message == "" || rec.Terminal || rec.PodCreated {
		return false
	}
	if rec.Phase != string(podstate.Pending) || rec.Reason != reason {
		return true
	}
	return reason == reasonWaitingForSlot && rec.Message != message
}

// persistPending writes that task rec, without its pod, is Pending for
// reason with message, so that lists, their reason filter and every replica
// show it, not only this one's Get (recordPending says when). The write is
// fenced by the term's epoch and a compare-and-swap on rec's version: a
// conflict is returned, and the sync retried from the record as it then is.
func (e *Executor) persistPending(ctx context.Context, rec store.Record, reason, message string) error {
	rec.Phase, rec.Reason, rec.Message, rec.ExitCode = string(podstate.Pending), reason, message, nil
	if i := len(rec.Attempts) - 1; i >= 0 && !rec.Attempts[i].PodStopped && rec.Attempts[i].Cluster == e.cfg.Cluster {
		// A pass that waits for a slot has seen the previous attempt's pod
		// stopped (startAttempt waits for it first): said in the same
		// write, so that the task may move to another cluster from here.
		rec.Attempts = slices.Clone(rec.Attempts)
		rec.Attempts[i].PodStopped = true
	}
	if _, err := e.update(ctx, rec); err != nil {
		return fmt.Errorf("recording the state Pending/%s of task %s: %w", reason, rec.ID, err)
	}
	return nil
}

// setProgress records the latest derived state of an unfinished task in
// memory and emits it when it changed. It returns the phase the current
// attempt had before (liveFromLocked).
func (e *Executor) setProgress(rec store.Record, phase, reason, message string, exit *int32) (from string) {
	p := progress{attempt: rec.Attempt, phase: phase, reason: reason, message: message, exitCode: exit}
	e.mu.Lock()
	m := e.memoLocked(rec.ID)
	from = e.liveFromLocked(rec)
	cur := m.live
	if !m.hasLive {
		cur = progress{attempt: rec.Attempt, phase: rec.Phase, reason: rec.Reason, message: rec.Message, exitCode: rec.ExitCode}
	}
	same := cur.attempt == p.attempt && cur.phase == p.phase && cur.reason == p.reason && cur.message == p.message
	m.live, m.hasLive = p, true
	e.mu.Unlock()
	if same {
		return from
	}
	e.observe(rec.ID, rec.Namespace, phase, reason, false)
	e.emit(Event{ID: rec.ID, Attempt: rec.Attempt, Type: EventState, Phase: phase, Reason: reason, Message: message, ExitCode: exit})
	return from
}

// liveFromLocked is the phase of rec's current attempt as this process
// last knew it: its derived state, else the record's (written before the
// state is set: persistProgress), "" when it knows only an earlier
// attempt's; e.mu is held.
func (e *Executor) liveFromLocked(rec store.Record) string {
	if m := e.memos[rec.ID]; m != nil && m.hasLive {
		if m.live.attempt != rec.Attempt {
			return ""
		}
		return m.live.phase
	}
	return rec.Phase
}

// noteStart observes kubetask_time_to_start_seconds for rec's current
// attempt when its main container has started in pod and the attempt was
// not Running before (from, liveFromLocked): once per attempt in this
// process, and not again in the next one (the record says Running then).
// The time is the pod's own (creationTimestamp to the main container's
// startedAt), so a start seen late measures the same.
func (e *Executor) noteStart(rec store.Record, t *task.Task, pod *corev1.Pod, from string) {
	if from == string(podstate.Running) || pod == nil {
		return
	}
	if d, ok := timeToStart(pod, t.Spec.MainContainer); ok {
		e.metrics.timeToStart.WithLabelValues(rec.Namespace).Observe(d.Seconds())
	}
}

// timeToStart is the time from pod's creation to its main container's
// start (running, or terminated since), false while the container has not
// started or the pod lacks either time.
func timeToStart(pod *corev1.Pod, main string) (time.Duration, bool) {
	created := pod.CreationTimestamp.Time
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name != main {
			continue
		}
		started := podstate.StartedAt(st.State)
		if started.IsZero() || created.IsZero() {
			return 0, false
		}
		return max(started.Sub(created), 0), true
	}
	return 0, false
}

// admissionWait is the time from when rec's current attempt asked for its
// pod (the submission; for a retry or a delayed start, NextAttemptAt) to
// now, when its pod was created.
func admissionWait(rec store.Record, now time.Time) time.Duration {
	since := rec.CreatedAt
	if rec.NextAttemptAt.After(since) {
		since = rec.NextAttemptAt
	}
	return max(now.Sub(since), 0)
}

// ungatedAt keeps what podstate.Policy.UngatedAt needs: when this process
// first saw the attempt's pod without the scheduling gates it had (or, for a
// pod first seen ungated with the stale SchedulingGated condition, when it
// first saw it). After a restart the earlier observations are lost and the
// schedule timeout counts from the pod's creation or the first sighting.
// The fence's gate (task.FenceGate), which kubetask removes a moment after
// the creation, is not one: it delays no schedule timeout. Nor is the
// SchedulingGated condition a sign of other gates on a pod the fence
// created (every one was gated).
func (e *Executor) ungatedAt(id string, attempt int, pod *corev1.Pod, now time.Time) time.Time {
	if pod == nil {
		return time.Time{}
	}
	fenced := pod.Annotations[task.AnnotationEpoch] != ""
	pod = withoutFenceGate(pod)
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.gates[id]
	if m.attempt != attempt {
		m = gateMemo{attempt: attempt}
	}
	switch {
	case len(pod.Spec.SchedulingGates) > 0:
		m.sawGated = true
	case m.ungatedAt.IsZero() && (m.sawGated || !fenced && gatedCondition(pod)):
		m.ungatedAt = now
	}
	if m.sawGated || !m.ungatedAt.IsZero() {
		e.gates[id] = m
	}
	return m.ungatedAt
}

// withoutFenceGate is pod as its task sees it: without the fence's gate
// (a copy when it has it), which is kubetask's and says nothing of the
// task's progress.
func withoutFenceGate(pod *corev1.Pod) *corev1.Pod {
	if pod == nil || !attempt.Fenced(pod) {
		return pod
	}
	p := *pod
	p.Spec.SchedulingGates = slices.DeleteFunc(slices.Clone(pod.Spec.SchedulingGates), func(g corev1.PodSchedulingGate) bool { return g.Name == task.FenceGate })
	if len(p.Spec.SchedulingGates) == 0 {
		p.Spec.SchedulingGates = nil
	}
	return &p
}

func gatedCondition(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonSchedulingGated {
			return true
		}
	}
	return false
}

// sealing is an outcome decided on the attempt's pod while it was bound to
// no node: it is recorded once the pod's deletion shows.
type sealing struct {
	attempt int
	uid     types.UID
	st      podstate.State
	pod     *corev1.Pod // as it was when decided
}

func (e *Executor) seal(id string, s sealing) {
	e.mu.Lock()
	e.sealed[id] = s
	e.mu.Unlock()
}

// sealedOutcome returns the outcome decided for attempt n of task id while
// its pod (nil: gone since) was bound to no node, if any.
func (e *Executor) sealedOutcome(id string, n int, pod *corev1.Pod) (sealing, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.sealed[id]
	if !ok || s.attempt != n || pod != nil && s.uid != pod.UID {
		return sealing{}, false
	}
	return s, true
}

// forget drops what the executor remembers of a finished task whose pods
// are gone or released.
func (e *Executor) forget(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m := e.memos[id]; m != nil { // all but its phase in the tasks gauge
		*m = taskMemo{phase: m.phase, hasPhase: m.hasPhase}
		e.tidyMemoLocked(id, m)
	}
	e.deleteCreationLocked(id)
	delete(e.gates, id)
	delete(e.failures, id)
	delete(e.sealed, id)
	delete(e.stopped, id)
	delete(e.relabelled, id)
	e.gates, e.failures, e.sealed = emptied(e.gates), emptied(e.failures), emptied(e.sealed)
	e.stopped, e.relabelled = emptied(e.stopped), emptied(e.relabelled)
	go e.forgetCaptures(id)
	e.cfg.Tracer.forget(id)
	for key, a := range e.actions {
		if a.id == id && a.done {
			delete(e.actions, key)
		}
	}
	e.actions = emptied(e.actions)
}

// recordOf notes that task id's record has nonce: when that is not the
// record the executor's memory of id is of (the ID was used again after
// retention deleted the earlier record, before a pass saw that one end),
// that memory is forgotten first, so that nothing the executor learnt of
// the earlier record (a creation's failures and its schedule timeout, a
// sealed outcome, a pod seen stopped) is taken for the new one's.
func (e *Executor) recordOf(id, nonce string) {
	e.mu.Lock()
	m := e.memoLocked(id)
	if !m.nonceKnown || m.nonce == nonce {
		m.nonceKnown, m.nonce = true, nonce // every pass: one lock
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	e.forget(id)
	e.mu.Lock()
	m = e.memoLocked(id)
	m.nonceKnown, m.nonce = true, nonce
	e.mu.Unlock()
}

// stoppedByOthers reports whether reason is a pod-level stop by someone else
// (not a decision of kubetask's: timeouts, configuration errors and
// cancellations are decided at once).
func stoppedByOthers(r podstate.Reason) bool {
	switch r {
	case podstate.ReasonDeletedExternally, podstate.ReasonEvicted, podstate.ReasonPreempted,
		podstate.ReasonNodeLost, podstate.ReasonDeadlineExceeded, podstate.ReasonPodFailed:
		return true
	}
	return false
}

// stoppingPhase is Running once the main container started, else Pending.
func stoppingPhase(pod *corev1.Pod, t *task.Task) string {
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == t.Spec.MainContainer && (st.State.Running != nil || st.State.Terminated != nil || st.RestartCount > 0) {
			return string(podstate.Running)
		}
	}
	return string(podstate.Pending)
}

func outcomeOf(rec store.Record, n int) (store.AttemptOutcome, bool) {
	for _, o := range rec.Attempts {
		if o.Attempt == n {
			return o, true
		}
	}
	return store.AttemptOutcome{}, false
}

func hasFinalizer(pod *corev1.Pod) bool {
	for _, f := range pod.Finalizers {
		if f == task.Finalizer {
			return true
		}
	}
	return false
}

func mainFinishedAt(pod *corev1.Pod, main string) time.Time {
	if term := mainTerminated(pod, main); term != nil {
		return term.FinishedAt.Time
	}
	return time.Time{}
}

// mainTerminated is the terminated state the pod's status reports for its
// main container, nil while none does.
func mainTerminated(pod *corev1.Pod, main string) *corev1.ContainerStateTerminated {
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == main && st.State.Terminated != nil {
			return st.State.Terminated
		}
	}
	return nil
}

func untilRecheck(st podstate.State, now time.Time) time.Duration {
	if st.Recheck.IsZero() {
		return 0
	}
	return max(st.Recheck.Sub(now), 0) + 10*time.Millisecond
}

// requeue keeps the earliest of several "look again after" delays (0: none).
type requeue struct{ d time.Duration }

func (r *requeue) after(d time.Duration) {
	if d > 0 && (r.d == 0 || d < r.d) {
		r.d = d
	}
}

// captureCtx is the context log captures run in: the executor's life.
func (e *Executor) captureCtx() context.Context {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runCtx
}

// stoppedByOthersWait is how long the outcome st, decided on pod, waits
// while someone else stops the pod (0: decide now). While the main
// container runs its containers may run for their grace period (or longer
// on a lost node), and the main container may still end by itself: no
// decision, and no next attempt, before no container runs, nor before the
// kubelet's final report of a pod deleted with grace period 0
// (finalReportWait).
func (e *Executor) stoppedByOthersWait(rec store.Record, t *task.Task, pod *corev1.Pod, st podstate.State, now time.Time) time.Duration {
	if pod == nil || st.ExitCode != nil || !stoppedByOthers(st.Reason) {
		return 0
	}
	if !podstate.Stopped(pod) {
		e.setProgress(rec, stoppingPhase(pod, t), string(podstate.ReasonStopping),
			"waiting for the pod's containers to stop before deciding: "+st.Message, nil)
		return stopRecheck
	}
	if wait := finalReportWait(pod, st, now); wait > 0 {
		e.setProgress(rec, stoppingPhase(pod, t), string(podstate.ReasonStopping),
			"waiting for the kubelet's final report of a pod deleted with grace period 0: "+st.Message, nil)
		return wait
	}
	return 0
}

// finalReportSettle bounds how long an outcome that is not the main
// container's own waits for the kubelet's final report of a pod deleted
// with grace period 0 (finalReportWait). A live kubelet reports within
// moments; a node that is gone never does.
const finalReportSettle = 10 * time.Second

// finalReportWait is how long the outcome st of pod, decided from a stop by
// someone else rather than from the main container, waits for the kubelet's
// final report: a deletion with grace period 0 (kubectl delete --force, an
// eviction that asks for it) makes podstate.Stopped true at once, but the
// kubelet of a live node still stops the containers and reports their
// final states, and the main container may have exited by itself just
// before (chaos seed 1796527408169114668: exit 0 reported 10 ms after the
// eviction, the outcome recorded Evicted 14 ms later). No wait when the
// report is in (every container terminated, or a final phase), when nobody
// will report (never bound, the pod garbage collector's deletion of a pod
// whose node is gone, a node lost), or once finalReportSettle passed since
// the deletion.
func finalReportWait(pod *corev1.Pod, st podstate.State, now time.Time) time.Duration {
	if pod == nil || st.ExitCode != nil || !stoppedByOthers(st.Reason) || st.Reason == podstate.ReasonNodeLost ||
		pod.DeletionTimestamp == nil || pod.Spec.NodeName == "" || podFinished(pod) || pod.Status.Phase == corev1.PodUnknown {
		return 0
	}
	if g := pod.DeletionGracePeriodSeconds; g == nil || *g != 0 {
		return 0
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == "DeletionByPodGC" {
			return 0
		}
	}
	reported := len(pod.Spec.Containers) > 0
	for _, c := range pod.Spec.Containers {
		i := slices.IndexFunc(pod.Status.ContainerStatuses, func(s corev1.ContainerStatus) bool { return s.Name == c.Name })
		if i < 0 || pod.Status.ContainerStatuses[i].State.Terminated == nil {
			reported = false
			break
		}
	}
	if reported {
		return 0
	}
	return max(pod.DeletionTimestamp.Add(finalReportSettle).Sub(now), 0)
}
