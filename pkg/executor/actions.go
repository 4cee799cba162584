package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Pod clean-up (delete, stop, release) runs outside the workers, like pod
// creation: a worker that records an outcome never waits in the client's rate
// limiter behind other tasks' clean-up, so outcomes are recorded as fast as
// pods finish even when the client's QPS binds. The sync decides an action and
// hands it over; the action's answer comes back to the next pass of the task,
// which decides again from the pod as the cache then shows it.

type actionKind string

const (
	actDelete  actionKind = "delete"
	actStop    actionKind = "stop"
	actRelease actionKind = "release"
	// actDeleteRelease deletes a pod that has stopped and releases it at
	// once, in one action: nothing runs in it and nothing is left to read,
	// and a pod that is deleting and still held makes its kubelet (or kwok)
	// retry its final delete until the finalizer goes, a write and a watch
	// event each time. The release is sent when the DELETE has returned,
	// not beside it: two writes of one pod at once race inside the API
	// server, which reads and writes the loser again (an etcd delete and
	// update more per task, and 0.8x the throughput; test/costs).
	actDeleteRelease actionKind = "delete+release"
	// actDiscard throws away a pod its record does not take, which never ran
	// (attempt.Discard: delete and release, only while the name is its UID's).
	actDiscard actionKind = "discard"
	// actUngate removes the fence's gate of a recorded pod (attempt.Ungate).
	actUngate actionKind = "ungate"
)

// actionSettle bounds how long a done action waits for the cache to show
// its effect before the task decides again without it.
const actionSettle = 30 * time.Second

// podAction is one clean-up call on one pod, from the decision until the
// cache shows its effect.
type podAction struct {
	kind     actionKind
	id       string // task
	attempt  int
	pod      *corev1.Pod // as the decision saw it
	mark     bool        // release: label the pod released
	held     bool        // release: the pod had kubetask's finalizer
	at       time.Time   // when it was decided
	sending  bool        // discard: the cleaner is sending it
	done     bool
	err      error
	doneAt   time.Time
	reported bool // its event was emitted
}

// releases reports whether a removes kubetask's finalizer from a pod that
// had it: its success is the pod's PodReleased.
func (a *podAction) releases() bool {
	return (a.kind == actRelease || a.kind == actDeleteRelease) && a.held
}

// reflected reports whether pod (as the cache shows it now; nil: gone) shows
// the effect of a.
func (a *podAction) reflected(pod *corev1.Pod) bool {
	if pod == nil {
		return true
	}
	switch a.kind {
	case actDelete:
		return pod.DeletionTimestamp != nil
	case actDeleteRelease:
		return pod.DeletionTimestamp != nil && !hasFinalizer(pod)
	case actDiscard:
		return pod.UID != a.pod.UID || pod.DeletionTimestamp != nil && !hasFinalizer(pod)
	case actUngate:
		return pod.UID != a.pod.UID || !attempt.Fenced(pod)
	case actStop:
		secs, ok := podstate.StopDeadlineSeconds(a.pod, a.at)
		return pod.DeletionTimestamp != nil || podstate.Stopped(pod) ||
			(ok && pod.Spec.ActiveDeadlineSeconds != nil && *pod.Spec.ActiveDeadlineSeconds <= secs)
	default:
		return !hasFinalizer(pod) && (!a.mark || pod.Labels[task.LabelReleased] == "true")
	}
}

// startAction hands a clean-up call to the cleaners unless one is pending
// for the pod. Actions are kept by the pod's name, which the pods of one
// attempt share: a done action on another pod of the name (another UID: a
// discarded pod of an earlier term, say) gives way, unless it is a release
// whose event is still to be reported.
func (e *Executor) startAction(a *podAction) {
	key := a.pod.Namespace + "/" + a.pod.Name
	e.mu.Lock()
	if cur, ok := e.actions[key]; ok && !cur.givesWayTo(a) {
		e.mu.Unlock()
		return
	}
	e.actions[key] = a
	e.mu.Unlock()
	select {
	case e.cleanups <- key:
	default:
		go func() { e.cleanups <- key }() // never blocks a worker
	}
}

// givesWayTo reports whether a, the action kept for a pod's name, gives way
// to b, another action on the pod of that name: a is done, is of another
// kind or on the pod of another UID (it is not b done already), and has
// nothing left to report. Without it, the done discard of an earlier pod of
// the name kept the ungate of the attempt's recorded pod from ever being
// sent (the simulator's seed 1796533340373355390: the pod stayed gated for
// ever), and a done ungate would keep a pod's deletion from being sent.
func (a *podAction) givesWayTo(b *podAction) bool {
	if !a.done || a.pod.UID == b.pod.UID && a.kind == b.kind {
		return false
	}
	return !a.releases() || a.reported
}

// retryAction hands a over like startAction, unless the last action on
// its pod failed: that one is forgotten and its error returned, for the
// caller's pass to fail and be retried with the work queue's back-off (the
// next pass hands a over again).
func (e *Executor) retryAction(a *podAction) error {
	key := a.pod.Namespace + "/" + a.pod.Name
	if cur, ok := e.actionOf(key); ok && cur.done && cur.err != nil && cur.pod.UID == a.pod.UID {
		e.clearAction(key)
		return fmt.Errorf("%s of pod %s: %w", cur.kind, key, cur.err)
	}
	e.startAction(a)
	return nil
}

// actionOf returns a copy of the pending or done action on pod key.
func (e *Executor) actionOf(key string) (podAction, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a, ok := e.actions[key]
	if !ok {
		return podAction{}, false
	}
	return *a, true
}

func (e *Executor) clearAction(key string) {
	e.mu.Lock()
	e.clearActionLocked(key)
	e.mu.Unlock()
}

// clearActionLocked forgets the action on pod key; e.mu is held.
func (e *Executor) clearActionLocked(key string) {
	delete(e.actions, key)
	e.actions = emptied(e.actions)
}

// runCleaner performs clean-up calls while the gate is open.
func (e *Executor) runCleaner(ctx context.Context) {
	for e.gate.wait(ctx) {
		select {
		case <-ctx.Done():
			return
		case key := <-e.cleanups:
			if !e.gate.enter() {
				go func() { e.cleanups <- key }() // after the Lease is held again
				continue
			}
			e.cleanOne(ctx, key)
			e.gate.leave()
		}
	}
}

// cleanOne performs the pending action on pod key and brings its task back.
func (e *Executor) cleanOne(ctx context.Context, key string) {
	e.mu.Lock()
	a, ok := e.actions[key]
	sent := a // the action this call performs, unless another takes its place
	var act podAction
	if ok && !a.done {
		if c := e.creations[a.id]; a.kind == actDiscard && c != nil && !c.done && c.claiming == a.pod.UID {
			// The creator's claim is recording the pod, or discards it
			// itself (claimPod).
			e.clearActionLocked(key)
			e.mu.Unlock()
			e.queue.Add(a.id)
			return
		}
		a.sending = a.kind == actDiscard
		act = *a
	}
	e.mu.Unlock()
	if !ok || act.kind == "" {
		return
	}
	var err error
	pod := act.pod
	switch act.kind {
	case actDelete:
		err = attempt.Delete(ctx, e.client, pod.Namespace, pod.Name)
	case actDeleteRelease:
		err = attempt.Delete(ctx, e.client, pod.Namespace, pod.Name)
		err = errors.Join(err, attempt.ReleaseSeen(ctx, e.client, pod, false))
	case actStop:
		err = attempt.Stop(ctx, e.client, pod, act.at)
	case actRelease:
		err = attempt.ReleaseSeen(ctx, e.client, pod, act.mark)
	case actDiscard:
		var taken bool
		if taken, err = e.recordTakes(ctx, act.id, pod.UID); taken {
			e.mu.Lock()
			if e.actions[key] == sent {
				e.clearActionLocked(key)
			}
			e.mu.Unlock()
			e.queue.Add(act.id)
			return
		}
		if err == nil {
			err = attempt.Discard(ctx, e.client, pod)
		}
	case actUngate:
		if err = attempt.Ungate(ctx, e.client, pod); err == nil {
			e.noteUngated(act.id, pod.UID)
		}
	default:
		err = fmt.Errorf("unknown pod action %q", act.kind)
	}
	if ctx.Err() != nil {
		return
	}
	e.mu.Lock()
	if a, ok := e.actions[key]; ok && a == sent {
		a.done, a.err, a.doneAt, a.sending = true, err, e.cfg.Clock.Now(), false
	}
	e.mu.Unlock()
	e.queue.Add(act.id)
}

// recordTakes reports whether the record of task id takes pod uid as its
// current attempt's pod. A discard is decided on a record read before it is
// sent, and the creator's claim may record the pod in between (a retried
// creation of a task that was moved away and back finds its term's gated
// pod and records it: simulation seed 2600352580, whose queued discard then
// deleted the recorded pod). The cleaner reads the record again once it is
// sending (podAction.sending): a claim that comes after that refuses the
// pod (claimPod), and one before it is in this read.
func (e *Executor) recordTakes(ctx context.Context, id string, uid types.UID) (bool, error) {
	rec, err := e.store.Get(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading task %s before a discard: %w", id, err)
	}
	return rec.PodCreated && rec.PodUID == string(uid), nil
}

// discardBlocksClaim reports why the claim of pod, the creation of task
// id's, must not record it: a discard of it is being sent or was sent.
// Otherwise the claim marks the pod its own (creation.claiming) in the same
// step, and the cleaner sends no discard of it until the creation is done;
// after that, the cleaner's read of the record sees what the claim wrote
// (recordTakes). A discard whose call failed is forgotten (the creation's
// retry reads the pod again, and finishes the discard if it took effect).
func (e *Executor) discardBlocksClaim(id string, pod *corev1.Pod) error {
	key := pod.Namespace + "/" + pod.Name
	e.mu.Lock()
	defer e.mu.Unlock()
	a, ok := e.actions[key]
	if !ok || a.kind != actDiscard || a.pod.UID != pod.UID || !a.sending && !a.done {
		if c := e.creations[id]; c != nil && !c.done && c.name == pod.Name {
			c.claiming = pod.UID
		}
		return nil
	}
	if a.done && a.err != nil {
		e.clearActionLocked(key)
	}
	return fmt.Errorf("pod %s is being discarded; creating it again once it is gone", key)
}
