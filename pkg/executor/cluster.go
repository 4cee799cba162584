package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// ErrNotLosable is LoseAttempt's refusal: the record's current attempt is not
// one a declaration of loss of the cluster ends (the error says why).
var ErrNotLosable = errors.New("the task's attempt is not lost with the cluster")

// LoseAttempt returns rec as a declaration that cluster is lost writes it
// (docs/multicluster.md, "A cluster declared lost"): the current attempt,
// whose pod was created on cluster and may still run there unseen, ends as
// Failed/ClusterLost on that cluster, and the next attempt waits, unplaced
// (no instance, no cluster, no pod), for a placement on another cluster. The
// loss is kubetask's, not the task's: the next attempt runs whatever the
// task's retries allow; it is one more attempt, so a failure of it is judged
// by retries.limit as any attempt's is. A task cancelled before the loss
// ends instead, Failed/Cancelled.
//
// The caller writes the result with an unfenced compare-and-swap at
// rec.Version (store Update with Epoch 0), after beginning a new term of
// each of the lost cluster's instances (store BeginTerm), so that no write
// of theirs already on its way lands after it. It refuses, with
// ErrNotLosable, a record that is finished, placed on another cluster, or
// whose attempt has no pod: an attempt without a pod is moved (store Move),
// not lost, and loses nothing.
func LoseAttempt(rec store.Record, cluster string, now time.Time) (store.Record, error) {
	switch {
	case rec.Terminal:
		return rec, fmt.Errorf("task %s has its outcome: %w", rec.ID, ErrNotLosable)
	case rec.Cluster != cluster:
		return rec, fmt.Errorf("task %s is placed on cluster %q, not %q: %w", rec.ID, rec.Cluster, cluster, ErrNotLosable)
	case !rec.PodCreated:
		return rec, fmt.Errorf("task %s has no pod on cluster %q (move it instead): %w", rec.ID, cluster, ErrNotLosable)
	}
	if _, ok := outcomeOf(rec, rec.Attempt); ok {
		return rec, fmt.Errorf("task %s: attempt %d has its outcome: %w", rec.ID, rec.Attempt, ErrNotLosable)
	}
	n := rec.Attempt
	pod := task.PodName(task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Nonce: rec.Nonce}, n)
	msg := fmt.Sprintf("cluster %q was declared lost while attempt %d had pod %s there; it may still run", cluster, n, pod)
	rec.Attempts = append(rec.Attempts, store.AttemptOutcome{
		Attempt: n, Pod: pod, PodUID: rec.PodUID,
		Phase: string(podstate.Failed), Reason: string(podstate.ReasonClusterLost), Message: msg, Retryable: true,
		Cluster: cluster, FinishedAt: now, ObservedAt: now,
	})
	rec.PodCreated, rec.PodUID, rec.PodEpoch = false, "", 0
	rec.ExitCode, rec.Retryable, rec.Epoch = nil, false, 0
	if !rec.CancelledAt.IsZero() {
		rec.Terminal = true
		rec.Phase, rec.Reason = string(podstate.Failed), string(podstate.ReasonCancelled)
		rec.Message = "the task was cancelled; " + msg
		return rec, nil
	}
	rec.Attempt++
	rec.Executor, rec.Cluster = "", ""
	rec.NextAttemptAt = now
	rec.Phase, rec.Reason = string(podstate.Pending), string(podstate.ReasonClusterLost)
	rec.Message = fmt.Sprintf("%s; attempt %d waits for another cluster", msg, rec.Attempt)
	return rec, nil
}

// Stranded counts the tasks of which this instance's caches show pods
// while their records are placed on another cluster, or on none: pods of
// attempts declared lost on this cluster, or moved away before their pod
// was recorded, which this instance's passes stop and release (or
// discard). A service reads it for a cluster coming back (Returning): no
// task is placed there until it is 0. Only for an executor with a
// Cluster; 0 otherwise.
func (e *Executor) Stranded(ctx context.Context) (int, error) {
	if e.cfg.Cluster == "" {
		return 0, nil
	}
	runs := map[string]bool{}
	for _, idx := range e.podIndexers() {
		for _, o := range idx.List() {
			if p, ok := o.(*cachedPod); ok && p.run() != "" {
				runs[p.run()] = true
			}
		}
	}
	n := 0
	for id := range runs {
		rec, err := e.store.Get(ctx, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue // released and deleted by releaseUnknown
		case err != nil:
			return n, fmt.Errorf("reading task %s: %w", id, err)
		}
		if rec.Executor != e.cfg.InstanceID && e.strandedHere(rec) { // as syncView decides lostOnly
			n++
		}
	}
	return n, nil
}
