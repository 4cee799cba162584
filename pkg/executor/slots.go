package executor

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Parallelism is counted, never hand-kept: the slots in use are the pods in
// the pod caches plus the admitted creations the caches have not shown
// yet (the Job controller's "expectations"). A creation whose pod the cache
// has not shown within expectationTimeout stops counting, so a lost watch
// event cannot hold a slot for ever.
const expectationTimeout = 5 * time.Minute

// creation is a pod creation admitted for a task, from admission until the
// sync after the pod appeared in the cache (or the creation failed).
type creation struct {
	attempt int
	name    string
	pod     *corev1.Pod // to create
	done    bool        // the API call returned
	err     error       // its error (after AlreadyExists: of the identity check)
	obj     *cachedPod  // the created (or adopted) pod
	adopted bool        // AlreadyExists, and the pod is the task's
	seen    bool        // the cache has shown the pod
	doneAt  time.Time
}

// counts reports whether c still holds a slot that the cache does not count.
func (c *creation) counts(now time.Time) bool {
	return !c.seen && (!c.done || now.Sub(c.doneAt) < expectationTimeout)
}

// waiter is a task waiting for a parallelism slot. Tasks are admitted in
// submission order (CreatedAt, then ID).
type waiter struct {
	at time.Time
	id string
}

func (w waiter) before(o waiter) bool {
	if !w.at.Equal(o.at) {
		return w.at.Before(o.at)
	}
	return w.id < o.id
}

// usedLocked counts the slots in use. e.mu must be held.
func (e *Executor) usedLocked(now time.Time) int {
	n := e.cachedPodCount()
	for _, c := range e.creations {
		if c.counts(now) {
			n++
		}
	}
	return n
}

// admit queues the creation of pod (attempt n of rec) when a slot is free and
// no earlier submission waits for one; otherwise rec waits in line. It
// returns whether the creation was queued.
func (e *Executor) admit(rec store.Record, n int, pod *corev1.Pod) bool {
	now := e.cfg.Clock.Now()
	e.mu.Lock()
	if c := e.creations[rec.ID]; c != nil {
		e.mu.Unlock()
		return c.attempt == n
	}
	i := e.enlistLocked(rec)
	free := e.cfg.Parallelism - e.usedLocked(now)
	if i >= free {
		e.mu.Unlock()
		return false
	}
	e.removeLocked(rec.ID)
	e.creations[rec.ID] = &creation{attempt: n, name: pod.Name, pod: pod}
	e.mu.Unlock()
	select {
	case e.creates <- rec.ID:
	default:
		go func() { e.creates <- rec.ID }() // never blocks a worker
	}
	return true
}

// enlist puts a task that will need a slot in line, by submission time, so
// that no later submission overtakes it, even one that happens to be synced
// first.
func (e *Executor) enlist(rec store.Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.creations[rec.ID]; !ok {
		e.enlistLocked(rec)
	}
}

// enlistLocked puts rec in line (once) and returns its place. e.mu must be held.
func (e *Executor) enlistLocked(rec store.Record) int {
	w := waiter{at: rec.CreatedAt, id: rec.ID}
	if at, ok := e.inLine[rec.ID]; ok {
		w.at = at
	}
	i := sort.Search(len(e.waiting), func(i int) bool { return !e.waiting[i].before(w) })
	if i == len(e.waiting) || e.waiting[i] != w {
		e.waiting = append(e.waiting, waiter{})
		copy(e.waiting[i+1:], e.waiting[i:])
		e.waiting[i] = w
		e.inLine[w.id] = w.at
	}
	return i
}

// unwait takes id out of the line (cancelled, finished or gone) and lets the
// next one in.
func (e *Executor) unwait(id string) {
	e.mu.Lock()
	removed := e.removeLocked(id)
	e.mu.Unlock()
	if removed {
		e.wakeWaiting()
	}
}

// removeLocked takes id out of the line; e.mu must be held.
func (e *Executor) removeLocked(id string) bool {
	at, ok := e.inLine[id]
	if !ok {
		return false
	}
	delete(e.inLine, id)
	w := waiter{at: at, id: id}
	i := sort.Search(len(e.waiting), func(i int) bool { return !e.waiting[i].before(w) })
	if i < len(e.waiting) && e.waiting[i] == w {
		e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
	}
	return true
}

// wakeWaiting syncs the tasks at the head of the line that the free slots
// can take.
func (e *Executor) wakeWaiting() {
	now := e.cfg.Clock.Now()
	e.mu.Lock()
	free := min(e.cfg.Parallelism-e.usedLocked(now), len(e.waiting))
	var ids []string
	for i := 0; i < free; i++ {
		ids = append(ids, e.waiting[i].id)
	}
	e.mu.Unlock()
	for _, id := range ids {
		e.queue.Add(id)
	}
}

// dropCreation forgets the creation of task id and wakes the line.
func (e *Executor) dropCreation(id string) {
	e.mu.Lock()
	_, ok := e.creations[id]
	delete(e.creations, id)
	e.mu.Unlock()
	if ok {
		e.wakeWaiting()
	}
}

func (e *Executor) creationOf(id string) (creation, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.creations[id]
	if !ok {
		return creation{}, false
	}
	return *c, true
}

// errNameTaken reports a pod with the attempt's name that is not the task's.
var errNameTaken = errors.New("the pod name is taken by a pod that is not this task's")

// runCreator creates admitted pods, CreateConcurrency at a time, outside the
// workers. It only performs the API call and hands the answer to the task's
// next sync, which decides.
func (e *Executor) runCreator(ctx context.Context) {
	for e.gate.wait(ctx) {
		select {
		case <-ctx.Done():
			return
		case id := <-e.creates:
			if !e.gate.enter() {
				go func() { e.creates <- id }() // after the Lease is held again
				continue
			}
			e.createOne(ctx, id)
			e.gate.leave()
		}
	}
}

// createOne performs the admitted creation of task id, if it is still
// pending, and brings the task back to a worker.
func (e *Executor) createOne(ctx context.Context, id string) {
	e.mu.Lock()
	c := e.creations[id]
	var pod *corev1.Pod
	if c != nil && !c.done {
		pod = c.pod
	}
	e.mu.Unlock()
	if pod == nil {
		return
	}
	obj, adopted, err := e.create(ctx, pod)
	if ctx.Err() != nil {
		return
	}
	e.mu.Lock()
	if c := e.creations[id]; c != nil && c.name == pod.Name {
		c.done, c.err, c.adopted, c.doneAt = true, err, adopted, e.cfg.Clock.Now()
		if obj != nil {
			c.obj = compactPod(obj)
		}
	}
	e.mu.Unlock()
	e.queue.Add(id)
}

// create creates pod. On AlreadyExists it reads the existing pod and adopts
// it only when it carries the same identity (created before a restart, or by
// an earlier process of this instance).
func (e *Executor) create(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, bool, error) {
	obj, err := e.client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	switch {
	case err == nil:
		e.metrics.podCreations.WithLabelValues("created").Inc()
		return obj, false, nil
	case !apierrors.IsAlreadyExists(err):
		e.metrics.podCreations.WithLabelValues("error").Inc()
		return nil, false, fmt.Errorf("creating pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	e.metrics.podCreations.WithLabelValues("exists").Inc()
	live, err := e.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, false, fmt.Errorf("reading existing pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	want, n, _ := task.IdentityFromPod(pod)
	if !e.ownsPod(live, want, n) {
		return nil, false, fmt.Errorf("%w: %s/%s", errNameTaken, pod.Namespace, pod.Name)
	}
	return live, true, nil
}

// ownsPod reports whether pod carries identity id (the executor may be this
// instance or one it adopts) and attempt n.
func (e *Executor) ownsPod(pod *corev1.Pod, id task.Identity, n int) bool {
	got, m, err := task.IdentityFromPod(pod)
	if err != nil || m != n || got.Namespace != id.Namespace || got.Name != id.Name || got.RunID != id.RunID {
		return false
	}
	if got.Executor == e.cfg.InstanceID {
		return true
	}
	for _, a := range e.cfg.AdoptFrom {
		if got.Executor == a {
			return true
		}
	}
	return false
}
