package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

func (e *Executor) processNext(ctx context.Context) bool {
	id, quit := e.queue.Get()
	if quit {
		return false
	}
	defer e.queue.Done(id)
	start := time.Now()
	err := e.sync(ctx, id)
	e.metrics.reconcile.Observe(time.Since(start).Seconds())
	switch {
	case err == nil:
		e.queue.Forget(id)
	case ctx.Err() != nil:
	default:
		e.cfg.Logger.Info("reconcile failed, retrying", "task", id, "err", err)
		e.queue.AddRateLimited(id)
	}
	return true
}

// podsOfRun returns the cached pods of task id, all attempts.
func (e *Executor) podsOfRun(id string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, idx := range e.indexers {
		objs, _ := idx.ByIndex(runIndex, id)
		for _, o := range objs {
			if p, ok := o.(*corev1.Pod); ok {
				out = append(out, p)
			}
		}
	}
	return out
}

// sync brings task id one step closer to its goal from the current state of
// its record and its pods. It is idempotent.
func (e *Executor) sync(ctx context.Context, id string) error {
	rec, err := e.store.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return e.releaseUnknown(ctx, id)
	}
	if err != nil {
		return fmt.Errorf("reading task %s: %w", id, err)
	}
	if rec.Executor != e.cfg.InstanceID {
		return nil // another instance's task
	}
	var t task.Task
	if err := json.Unmarshal(rec.Task, &t); err != nil {
		return fmt.Errorf("decoding task %s: %w", id, err)
	}
	ident := task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Executor: e.cfg.InstanceID}
	pods := e.podsOfRun(id)
	if rec.Terminal {
		e.releaseSlot(id)
		return e.finishPods(ctx, &t, rec, pods, -1)
	}
	// Pods of earlier attempts whose outcome is recorded: release them.
	if err := e.finishPods(ctx, &t, rec, pods, rec.Attempt); err != nil {
		return err
	}
	now := e.cfg.Clock.Now()
	policy := t.Policy()
	policy.CancelledAt = rec.CancelledAt
	name := task.PodName(ident, rec.Attempt)
	var pod *corev1.Pod
	for _, p := range pods {
		if p.Name == name {
			pod = p
		}
	}
	if pod != nil && pod.Labels[task.LabelExecutor] != e.cfg.InstanceID {
		return e.relabel(ctx, pod)
	}
	if pod == nil {
		if !rec.PodCreated {
			return e.createAttempt(ctx, &t, rec, ident, now)
		}
		// The cache may lag behind our own create: ask the API server.
		live, err := e.client.CoreV1().Pods(rec.Namespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			pod = live
		case apierrors.IsNotFound(err):
		default:
			return fmt.Errorf("reading pod %s: %w", name, err)
		}
	}
	state := podstate.Derive(pod, policy, now)
	if !state.Terminal() {
		if !state.Recheck.IsZero() {
			e.queue.AddAfter(id, state.Recheck.Sub(now)+10*time.Millisecond)
		}
		if rec.Phase == string(state.Phase) && rec.Reason == string(state.Reason) && rec.Message == state.Message {
			return nil
		}
		rec.Phase, rec.Reason, rec.Message, rec.ExitCode = string(state.Phase), string(state.Reason), state.Message, state.ExitCode
		rec, err = e.store.Update(ctx, rec)
		if err != nil {
			return fmt.Errorf("recording state of task %s: %w", id, err)
		}
		e.observe(rec)
		e.emit(rec, false)
		return nil
	}
	return e.recordOutcome(ctx, &t, rec, pod, state, now)
}

// createAttempt creates the current attempt's pod when its backoff has passed
// and a parallelism slot is free.
func (e *Executor) createAttempt(ctx context.Context, t *task.Task, rec store.Record, ident task.Identity, now time.Time) error {
	if !rec.CancelledAt.IsZero() {
		state := podstate.State{Phase: podstate.Failed, Reason: podstate.ReasonCancelled, Message: "the task was cancelled before its pod was created"}
		return e.recordOutcome(ctx, t, rec, nil, state, now)
	}
	if wait := rec.NextAttemptAt.Sub(now); wait > 0 {
		e.queue.AddAfter(rec.ID, wait)
		return nil
	}
	if !e.acquireSlot(rec.ID) {
		if rec.Reason != "WaitingForSlot" {
			rec.Phase, rec.Reason, rec.Message = string(podstate.Pending), "WaitingForSlot", fmt.Sprintf("waiting: %d task pods exist, the parallelism limit", e.cfg.Parallelism)
			if rec, err := e.store.Update(ctx, rec); err == nil {
				e.emit(rec, false)
			}
		}
		return nil
	}
	pod, err := task.BuildPod(t, ident, rec.Attempt)
	if err != nil {
		e.releaseSlot(rec.ID)
		return fmt.Errorf("building pod of task %s: %w", rec.ID, err)
	}
	if !e.acquireCreate(rec.ID) {
		return nil // woken when a creation finishes; the worker is free meanwhile
	}
	_, err = e.client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	e.releaseCreate()
	switch {
	case err == nil:
		e.metrics.podCreations.WithLabelValues("created").Inc()
	case apierrors.IsAlreadyExists(err):
		// Created before a crash, or by a stale duplicate: the deterministic
		// name makes it the same pod.
		e.metrics.podCreations.WithLabelValues("exists").Inc()
	default:
		e.metrics.podCreations.WithLabelValues("error").Inc()
		e.releaseSlot(rec.ID)
		// Visible in the task's state; the queue retries with backoff
		// (429, 5xx, conflicts, exceeded quota, webhook failures...).
		msg := fmt.Sprintf("creating pod %s failed, retrying: %v", pod.Name, err)
		if rec.Message != msg {
			rec.Phase, rec.Reason, rec.Message = string(podstate.Pending), "CreateFailed", msg
			if rec2, uerr := e.store.Update(ctx, rec); uerr == nil {
				e.emit(rec2, false)
			}
		}
		return fmt.Errorf("creating pod %s: %w", pod.Name, err)
	}
	rec.PodCreated = true
	rec.Phase, rec.Reason, rec.Message = string(podstate.Pending), string(podstate.ReasonScheduling), fmt.Sprintf("pod %s created", pod.Name)
	rec, err = e.store.Update(ctx, rec)
	if err != nil {
		// The pod exists; the next pass finds it (PodCreated or not, the
		// name is the same and AlreadyExists is fine).
		return fmt.Errorf("recording pod creation of task %s: %w", rec.ID, err)
	}
	e.observe(rec)
	e.emit(rec, false)
	return nil
}

// recordOutcome records the end of the current attempt exactly once, then
// acts on the pod: reads the result first (the holder must still run), stops
// what still runs, releases the finalizer and deletes per policy.
func (e *Executor) recordOutcome(ctx context.Context, t *task.Task, rec store.Record, pod *corev1.Pod, state podstate.State, now time.Time) error {
	if len(rec.Attempts) != rec.Attempt {
		return nil // already recorded (a stale pass)
	}
	var result []byte
	if pod != nil && state.Phase == podstate.Succeeded && t.Spec.Result != nil {
		r, err := attempt.ReadResult(ctx, e.execer, pod, t)
		switch {
		case err == nil:
			result = r
		case errors.Is(err, attempt.ErrNoResult) || errors.Is(err, attempt.ErrResultTooLarge):
			state.Message += "; result: " + err.Error()
		default:
			return fmt.Errorf("reading result of task %s: %w", rec.ID, err) // retried
		}
	}
	podName := ""
	finishedAt := now
	if pod != nil {
		podName = pod.Name
		if ft := mainFinishedAt(pod, t.Spec.MainContainer); !ft.IsZero() {
			finishedAt = ft
		}
	}
	finished := rec.Attempt
	rec.Attempts = append(rec.Attempts, store.AttemptOutcome{
		Attempt: finished, Pod: podName, Phase: string(state.Phase), Reason: string(state.Reason),
		Message: state.Message, ExitCode: state.ExitCode, Retryable: state.Retryable, FinishedAt: finishedAt, ObservedAt: now,
	})
	retry := rec.CancelledAt.IsZero() && t.ShouldRetry(state, finished)
	if retry {
		delay := t.RetryDelay(finished)
		rec.Attempt++
		rec.PodCreated = false
		rec.NextAttemptAt = now.Add(delay)
		rec.Phase, rec.Reason = string(podstate.Pending), "RetryBackoff"
		rec.Message = fmt.Sprintf("attempt %d ended %s; attempt %d starts in %s", finished, state, rec.Attempt, delay)
		rec.ExitCode, rec.Retryable = nil, false
	} else {
		rec.Terminal = true
		rec.Phase, rec.Reason, rec.Message = string(state.Phase), string(state.Reason), state.Message
		rec.ExitCode, rec.Retryable, rec.Result = state.ExitCode, state.Retryable, result
	}
	updated, err := e.store.Update(ctx, rec)
	if errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("recording outcome of task %s: %w", rec.ID, err) // re-read and re-decide
	}
	if err != nil {
		return fmt.Errorf("recording outcome of task %s: %w", rec.ID, err)
	}
	rec = updated
	e.metrics.outcomes.WithLabelValues(string(state.Phase), string(state.Reason)).Inc()
	if pod != nil {
		e.metrics.outcomeLag.Observe(now.Sub(finishedAt).Seconds())
	}
	e.releaseSlot(rec.ID)
	e.observe(rec)
	// Act on the pod before telling anyone, so that an embedding that exits
	// on the terminal event leaves no finalizer behind. A failure here is
	// retried by the next pass (the outcome is recorded, so it only cleans up).
	var finishErr error
	if pod != nil {
		finishErr = e.finishPod(ctx, t, pod, state)
	}
	if e.cfg.OnEvent != nil {
		e.cfg.OnEvent(Event{ID: rec.ID, Attempt: finished, Phase: string(state.Phase), Reason: string(state.Reason),
			Message: state.Message, ExitCode: state.ExitCode, AttemptFinished: true, Terminal: rec.Terminal, Time: now})
		if retry {
			e.emit(rec, false)
		}
	}
	if retry {
		e.queue.AddAfter(rec.ID, rec.NextAttemptAt.Sub(now))
	}
	return finishErr
}

// finishPod stops what still runs in a pod whose attempt's outcome is
// recorded, releases its finalizer and deletes it per the cleanup policy.
func (e *Executor) finishPod(ctx context.Context, t *task.Task, pod *corev1.Pod, state podstate.State) error {
	del := attempt.ShouldDelete(t.Spec.Cleanup, state)
	if state.StopPod && !del {
		if err := attempt.Stop(ctx, e.client, pod, e.cfg.Clock.Now()); err != nil {
			return err
		}
	}
	if slices.Contains(pod.Finalizers, task.Finalizer) {
		if err := attempt.ReleaseSeen(ctx, e.client, pod); err != nil {
			return err
		}
	}
	if del && pod.DeletionTimestamp == nil {
		return attempt.Delete(ctx, e.client, pod.Namespace, pod.Name)
	}
	return nil
}

// finishPods finishes the pods of attempts before upTo whose outcomes are
// recorded (all pods when upTo < 0).
func (e *Executor) finishPods(ctx context.Context, t *task.Task, rec store.Record, pods []*corev1.Pod, upTo int) error {
	var errs []error
	for _, p := range pods {
		_, n, err := task.IdentityFromPod(p)
		if err != nil || (upTo >= 0 && n >= upTo) {
			continue
		}
		state := podstate.State{Phase: podstate.Failed}
		if n < len(rec.Attempts) {
			state.Phase = podstate.Phase(rec.Attempts[n].Phase)
		}
		state.StopPod = podstate.Derive(p, t.Policy(), e.cfg.Clock.Now()).StopPod
		done := !slices.Contains(p.Finalizers, task.Finalizer) &&
			(p.DeletionTimestamp != nil || !attempt.ShouldDelete(t.Spec.Cleanup, state)) && !state.StopPod
		if done {
			continue
		}
		if err := e.finishPod(ctx, t, p, state); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// releaseUnknown handles pods of a task the store does not know (an
// in-memory store after a restart, a record removed by hand): nobody will
// report them, so they are released and deleted rather than left running or
// stuck Terminating.
func (e *Executor) releaseUnknown(ctx context.Context, id string) error {
	var errs []error
	for _, p := range e.podsOfRun(id) {
		if p.Labels[task.LabelExecutor] != e.cfg.InstanceID {
			continue
		}
		e.cfg.Logger.Info("releasing pod of unknown task", "task", id, "pod", p.Namespace+"/"+p.Name)
		if err := attempt.ReleaseSeen(ctx, e.client, p); err != nil {
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

// relabel moves an adopted pod to this instance.
func (e *Executor) relabel(ctx context.Context, pod *corev1.Pod) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q},"annotations":{%q:%q}}}`,
		task.LabelExecutor, e.cfg.InstanceID, task.AnnotationExecutor, e.cfg.InstanceID)
	_, err := e.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("adopting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

func mainFinishedAt(pod *corev1.Pod, main string) time.Time {
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == main && st.State.Terminated != nil {
			return st.State.Terminated.FinishedAt.Time
		}
	}
	return time.Time{}
}

// observe keeps the kubetask_tasks gauge: the tasks this process has seen,
// by their latest phase (terminal phases included).
func (e *Executor) observe(rec store.Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if old, ok := e.phases[rec.ID]; ok {
		if old == rec.Phase {
			return
		}
		e.metrics.tasks.WithLabelValues(old).Dec()
	}
	e.metrics.tasks.WithLabelValues(rec.Phase).Inc()
	if rec.Terminal {
		delete(e.phases, rec.ID) // final: nothing will move it again
		return
	}
	e.phases[rec.ID] = rec.Phase
}

// acquireCreate takes one of CreateConcurrency creation slots, or queues id
// to be woken when one frees. It never blocks a worker.
func (e *Executor) acquireCreate(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.creating < e.cfg.CreateConcurrency {
		e.creating++
		return true
	}
	if !e.createSet[id] {
		e.createSet[id] = true
		e.createWait = append(e.createWait, id)
	}
	return false
}

// releaseCreate frees a creation slot and wakes the next waiting task.
func (e *Executor) releaseCreate() {
	e.mu.Lock()
	e.creating--
	var next string
	if len(e.createWait) > 0 {
		next, e.createWait = e.createWait[0], e.createWait[1:]
		delete(e.createSet, next)
	}
	e.mu.Unlock()
	if next != "" {
		e.queue.Add(next)
	}
}

// unwait removes id from both waiting lines (it will never take the slot).
func (e *Executor) unwait(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.waitingSet[id] {
		delete(e.waitingSet, id)
		e.waiting = slices.DeleteFunc(e.waiting, func(w string) bool { return w == id })
	}
	if e.createSet[id] {
		delete(e.createSet, id)
		e.createWait = slices.DeleteFunc(e.createWait, func(w string) bool { return w == id })
	}
}

// acquireSlot takes a parallelism slot for id, or queues id for the next free one.
func (e *Executor) acquireSlot(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.active[id] {
		return true
	}
	if len(e.active) < e.cfg.Parallelism {
		e.active[id] = true
		return true
	}
	if !e.waitingSet[id] {
		e.waitingSet[id] = true
		e.waiting = append(e.waiting, id)
	}
	return false
}

// holdSlot marks id as holding a slot (a pod that exists at start).
func (e *Executor) holdSlot(id string) {
	e.mu.Lock()
	e.active[id] = true
	e.mu.Unlock()
}

// releaseSlot frees id's slot and wakes the next waiting task.
func (e *Executor) releaseSlot(id string) {
	e.mu.Lock()
	if !e.active[id] {
		e.mu.Unlock()
		return
	}
	delete(e.active, id)
	var next string
	for len(e.waiting) > 0 && next == "" {
		next, e.waiting = e.waiting[0], e.waiting[1:]
		delete(e.waitingSet, next)
	}
	e.mu.Unlock()
	if next != "" {
		e.queue.Add(next)
	}
}
