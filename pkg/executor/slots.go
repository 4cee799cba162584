package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/pkg/attempt"
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
	epoch   int64 // the term that admitted it; only that term creates the pod
	name    string
	pod     *corev1.Pod // to create
	done    bool        // the API call returned
	err     error       // its error (after AlreadyExists: of the identity check)
	obj     *cachedPod  // the created (or adopted) pod
	adopted bool        // AlreadyExists, and the pod is the task's
	seen    bool        // the cache has shown the pod
	doneAt  time.Time
	// claiming is the pod the claim is recording (claimPod), from its
	// check of the pod's discard until the creation is done: the cleaner
	// sends no discard of it meanwhile.
	claiming types.UID
}

// counts reports whether c still holds a slot that the cache does not count.
func (c *creation) counts(now time.Time) bool {
	return !c.seen && (!c.done || now.Sub(c.doneAt) < expectationTimeout)
}

// usedLocked counts the slots in use, in all and by namespace: the pods in
// the caches and the admitted creations they have not shown yet. e.mu must
// be held.
func (e *Executor) usedLocked(now time.Time) (int, map[string]int) {
	byNS := e.cachedPodsByNamespace()
	n := 0
	for _, c := range byNS {
		n += c
	}
	for _, c := range e.unseenCr {
		if c.counts(now) {
			n++
			byNS[c.pod.Namespace]++
		}
	}
	return n, byNS
}

// Free is how many more pods of namespace ns the executor would start now:
// its parallelism left after the pods it holds (and the creations it
// admitted) and the tasks waiting in its lines, capped by what ns's own
// limit leaves. Zero or less: a task of ns would wait, behind about -Free
// others. Like the answer at submission it is advice: a service with
// several clusters places a task on the cluster whose executor has the
// most (internal/placement).
func (e *Executor) Free(ns string) int {
	// Without a limit of ns's own, from the counters roomAtSubmit reads:
	// no wait for e.mu behind the workers (a placement per submission).
	free := e.cfg.Parallelism - e.cachedPodCount() - int(e.unseen.Load()) - int(e.waiting.Load())
	lim := e.namespaceLimit(ns)
	if lim == 0 {
		return free
	}
	now := e.cfg.Clock.Now()
	e.mu.Lock()
	_, byNS := e.usedLocked(now)
	waitingNS := len(e.lines[ns])
	e.mu.Unlock()
	return min(free, lim-byNS[ns]-waitingNS)
}

// NextInLine returns up to n of the tasks waiting in the executor's lines
// that its own free slots will not take now: those its slot plan would
// start first if it had n slots more (SlotOrder between namespaces, their
// weights, priorities and submission times within one), each namespace's
// count capped at room(ns), leaving out the tasks skip names (nil: none;
// it is called under the executor's lock, and must not block). A service
// with several clusters moves them to a cluster with room for them
// (internal/service), skipping those whose placement keeps them where
// they are: no task waits in one cluster's line while another has a slot
// it may take. Like Free it is advice: a task it names may take a slot
// here before it is moved, and the move (a compare-and-swap that sees no
// pod claimed) then fails.
func (e *Executor) NextInLine(n int, room func(ns string) int, skip func(id string) bool) []string {
	if n <= 0 || e.waiting.Load() == 0 {
		return nil
	}
	now := e.cfg.Clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	own := e.planLocked(now)
	if len(own.admit) == len(e.inLine) {
		return nil
	}
	taken := make(map[string]bool, len(own.admit))
	for _, id := range own.admit {
		taken[id] = true
	}
	spaces := make(map[string]nsSlots, len(e.lines))
	for ns, line := range e.lines {
		r := room(ns)
		if r <= 0 {
			continue
		}
		rest := make([]waiter, 0, len(line))
		for _, w := range line {
			if !taken[w.id] && (skip == nil || !skip(w.id)) {
				rest = append(rest, w)
			}
		}
		if len(rest) > 0 {
			used := own.used[ns] // once its own free slots are taken
			spaces[ns] = nsSlots{used: used, limit: used + r, weight: max(e.cfg.NamespaceWeights[ns], 1), waiting: rest}
		}
	}
	return allot(e.cfg.SlotOrder, n, spaces).admit
}

// namespaceLimit is ns's own cap of task pods at once (0: none but
// Parallelism).
func (e *Executor) namespaceLimit(ns string) int {
	if n, ok := e.cfg.NamespaceParallelism[ns]; ok {
		return n
	}
	return e.cfg.DefaultNamespaceParallelism
}

// planLocked decides, from the slots in use and the lines as they are now,
// which waiting tasks take the free slots (allot). e.mu must be held.
func (e *Executor) planLocked(now time.Time) slotPlan {
	used, byNS := e.usedLocked(now)
	spaces := make(map[string]nsSlots, len(e.lines))
	for ns, line := range e.lines {
		spaces[ns] = nsSlots{used: byNS[ns], limit: e.namespaceLimit(ns), weight: max(e.cfg.NamespaceWeights[ns], 1), waiting: line}
	}
	return allot(e.cfg.SlotOrder, e.cfg.Parallelism-used, spaces)
}

// admit queues the creation of pod (attempt n of rec, whose spec.priority
// is prio) when the slot plan gives it a free slot; otherwise rec waits in
// its namespace's line. It returns whether the creation was queued and,
// when not, which limit the task waits for (waitMessage).
func (e *Executor) admit(rec store.Record, n int, pod *corev1.Pod, prio int32) (bool, string) {
	now := e.cfg.Clock.Now()
	e.mu.Lock()
	if c := e.creations[rec.ID]; c != nil {
		e.mu.Unlock()
		return c.attempt == n, ""
	}
	e.enlistLocked(rec, prio)
	plan := e.planLocked(now)
	if !slices.Contains(plan.admit, rec.ID) {
		msg := waitMessage(e.cfg.SlotOrder, rec.Namespace, e.namespaceLimit(rec.Namespace), plan.used[rec.Namespace], e.cfg.Parallelism, e.cfg.LimitShards)
		e.mu.Unlock()
		return false, msg
	}
	e.removeLocked(rec.ID)
	c := &creation{attempt: n, epoch: e.epoch.Load(), name: pod.Name, pod: pod}
	e.creations[rec.ID], e.unseenCr[rec.ID] = c, c
	e.unseen.Add(1)
	// Admissions need not come in the plan's order (whichever task syncs
	// first is admitted first): a task to which the plan now gives a slot
	// that it did not give before is woken, so that no free slot waits for
	// the next release.
	var wake []string
	for _, id := range e.planLocked(now).admit {
		if !slices.Contains(plan.admit, id) {
			wake = append(wake, id)
		}
	}
	e.mu.Unlock()
	for _, id := range wake {
		e.queue.Add(id)
	}
	select {
	case e.creates <- rec.ID:
	default:
		go func() { e.creates <- rec.ID }() // never blocks a worker
	}
	return true, ""
}

// waitingFor says which limit task id, waiting in line, waits for now (its
// last sync's message may be older: the slots it counted have changed
// since), or "" when it is not in line or the plan gives it a free slot.
func (e *Executor) waitingFor(id string) string {
	now := e.cfg.Clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.inLine[id]
	if !ok {
		return ""
	}
	plan := e.planLocked(now)
	if slices.Contains(plan.admit, id) {
		return ""
	}
	return waitMessage(e.cfg.SlotOrder, p.ns, e.namespaceLimit(p.ns), plan.used[p.ns], e.cfg.Parallelism, e.cfg.LimitShards)
}

// waitAtSubmit says which limit task rec, about to be submitted with
// priority prio, would wait for at its first sync (waitMessage), or ""
// when the slot plan would give it a free slot (or the task is known
// already), so that a task that waits from its submission is recorded
// WaitingForSlot by the submission's own write, not by one more.
func (e *Executor) waitAtSubmit(rec store.Record, prio int32) string {
	if e.roomAtSubmit(rec.Namespace) {
		return ""
	}
	return e.planAtSubmit(rec, prio)
}

// planAtSubmit is waitAtSubmit's answer from the slot plan, under e.mu.
func (e *Executor) planAtSubmit(rec store.Record, prio int32) string {
	now := e.cfg.Clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.inLine[rec.ID]; ok {
		return ""
	}
	if _, ok := e.creations[rec.ID]; ok {
		return ""
	}
	rec.CreatedAt = now // as the store will record it: after every task in line
	e.enlistLocked(rec, prio)
	plan := e.planLocked(now)
	e.removeLocked(rec.ID)
	if slices.Contains(plan.admit, rec.ID) {
		return ""
	}
	return waitMessage(e.cfg.SlotOrder, rec.Namespace, e.namespaceLimit(rec.Namespace), plan.used[rec.Namespace], e.cfg.Parallelism, e.cfg.LimitShards)
}

// roomAtSubmit reports, without e.mu, that a task of namespace ns would not
// wait: no task waits in any line, ns has no limit of its own, and the pods
// in the caches with the admitted creations they do not show yet leave a
// slot free. False means only that the plan must be asked
// (waitAtSubmit). Like the plan's answer, it is advice for the submission's
// record: the task's first sync decides from the lines and slots as they are
// then. A submission thus does not queue for e.mu behind the workers when
// slots are plentiful, the common case.
func (e *Executor) roomAtSubmit(ns string) bool {
	return e.waiting.Load() == 0 && e.namespaceLimit(ns) == 0 && e.Free(ns) > 0
}

// deleteCreationLocked forgets the creation of task id, if any, keeping
// e.unseen (the creations whose pod the cache has not shown, each holding a
// slot the cache does not count; at most: usedLocked also lets one go after
// expectationTimeout), and reports whether there was one. e.mu must be held.
func (e *Executor) deleteCreationLocked(id string) bool {
	c, ok := e.creations[id]
	if ok && !c.seen {
		e.unseen.Add(-1)
	}
	delete(e.creations, id)
	delete(e.unseenCr, id)
	e.creations, e.unseenCr = emptied(e.creations), emptied(e.unseenCr)
	return ok
}

// enlist puts a task that will need a slot in its namespace's line, by
// priority and submission time, so that no later submission of the same
// priority overtakes it, even one that happens to be synced first.
func (e *Executor) enlist(rec store.Record, prio int32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.creations[rec.ID]; !ok {
		e.enlistLocked(rec, prio)
	}
}

// enlistLocked puts rec in its namespace's line (once: a task keeps its
// place). e.mu must be held.
func (e *Executor) enlistLocked(rec store.Record, prio int32) {
	if _, ok := e.inLine[rec.ID]; ok {
		return
	}
	w := waiter{prio: prio, at: rec.CreatedAt, id: rec.ID}
	line := e.lines[rec.Namespace]
	i := sort.Search(len(line), func(i int) bool { return !line[i].before(w) })
	e.lines[rec.Namespace] = slices.Insert(line, i, w)
	e.inLine[w.id] = placed{ns: rec.Namespace, w: w}
	e.waiting.Store(int64(len(e.inLine)))
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

// removeLocked takes id out of its line; e.mu must be held.
func (e *Executor) removeLocked(id string) bool {
	p, ok := e.inLine[id]
	if !ok {
		return false
	}
	delete(e.inLine, id)
	e.inLine = emptied(e.inLine)
	e.waiting.Store(int64(len(e.inLine)))
	line := e.lines[p.ns]
	i := sort.Search(len(line), func(i int) bool { return !line[i].before(p.w) })
	if i < len(line) && line[i] == p.w {
		line = slices.Delete(line, i, i+1)
	}
	if len(line) == 0 {
		delete(e.lines, p.ns)
	} else {
		e.lines[p.ns] = line
	}
	return true
}

// wakeWaiting syncs the waiting tasks to which the slot plan gives the
// free slots.
func (e *Executor) wakeWaiting() {
	now := e.cfg.Clock.Now()
	e.mu.Lock()
	if len(e.inLine) == 0 {
		e.mu.Unlock()
		return
	}
	ids := e.planLocked(now).admit
	e.mu.Unlock()
	for _, id := range ids {
		e.queue.Add(id)
	}
}

// dropPendingCreations forgets every creation when a term ends: the next
// term counts and admits from the state as it then is, and a creation still
// queued is never performed (createOne finds it gone).
func (e *Executor) dropPendingCreations() {
	e.mu.Lock()
	clear(e.creations)
	clear(e.unseenCr)
	e.unseen.Store(0)
	e.mu.Unlock()
}

// dropCreation forgets the creation of task id and wakes the line.
func (e *Executor) dropCreation(id string) {
	e.mu.Lock()
	ok := e.deleteCreationLocked(id)
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

// errNotClaimed reports a creation the executor did not perform, or whose
// pod it threw away unrun: when it was about to be sent, the task's record no
// longer wanted that pod from this term (the task finished, was cancelled,
// moved to another attempt or instance, has its pod recorded, or a newer term
// of the instance began). The next sync decides again from the record.
var errNotClaimed = errors.New("the task's record no longer wants this pod from this term")

// runCreator creates admitted pods, CreateConcurrency at a time, outside the
// workers, with the current term's context (a call in flight ends with the
// term). It hands the answer to the task's next sync, which decides.
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
			e.createOne(e.termContext(), id)
			e.gate.leave()
		}
	}
}

// createOne performs the admitted creation of task id, if it is still
// pending and was admitted in this term, and brings the task back to a
// worker. It is the fence's side of a creation (docs/executor.md):
//
//  1. the record still wants the pod, checked in the store (claimGone) and
//     with the instance's current epoch, once here and again right before
//     the request leaves the client, after its rate limiter (withSendCheck);
//  2. the pod is created with the term's epoch and the record's nonce, and
//     gated (task.FenceGate): nothing in it runs yet;
//  3. the record is written, fenced by the term's epoch, with the pod's UID
//     (markCreated); a pod the record does not take is discarded, unrun;
//  4. only then is the gate removed, and the pod scheduled.
func (e *Executor) createOne(ctx context.Context, id string) {
	e.mu.Lock()
	c := e.creations[id]
	var (
		pod   *corev1.Pod
		n     int
		epoch int64
	)
	if c != nil && !c.done {
		pod, n, epoch = c.pod, c.attempt, c.epoch
	}
	e.mu.Unlock()
	if pod == nil {
		return
	}
	if epoch != e.epoch.Load() {
		e.dropCreation(id) // admitted in an earlier term
		return
	}
	pod = fencedPod(pod, epoch)
	check := func(ctx context.Context) error {
		return e.checkClaim(ctx, id, n, epoch, pod.Annotations[task.AnnotationNonce])
	}
	var (
		obj     *corev1.Pod
		adopted bool
	)
	err := check(ctx)
	if err == nil {
		obj, adopted, err = e.create(withSendCheck(ctx, check), pod, epoch)
	}
	if err == nil {
		obj, err = e.claimPod(ctx, id, n, obj, adopted)
	}
	if ctx.Err() != nil {
		return
	}
	e.mu.Lock()
	if c := e.creations[id]; c != nil && c.name == pod.Name {
		c.done, c.err, c.adopted, c.doneAt = true, err, adopted, e.cfg.Clock.Now()
		if obj != nil && err == nil {
			c.obj = compactPod(obj)
		}
	}
	e.mu.Unlock()
	e.queue.Add(id)
}

// fencedPod is pod as a term of epoch creates it: annotated with the epoch
// and gated, so that it runs only once its record takes it.
func fencedPod(pod *corev1.Pod, epoch int64) *corev1.Pod {
	pod = pod.DeepCopy()
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[task.AnnotationEpoch] = strconv.FormatInt(epoch, 10)
	pinByAffinity(&pod.Spec)
	pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: task.FenceGate})
	return pod
}

// pinByAffinity turns spec.nodeName into what the DaemonSet controller
// uses to keep its pods on their nodes through the scheduler: a required
// node affinity on the node's metadata.name. kube-apiserver refuses a pod
// with both nodeName and scheduling gates, and the fence's gate must stay
// (nodeName would bind the pod at its creation, before its record takes
// it). The node name is added to every required term (they are ORed), so
// the pod still runs only where its own affinity allowed; a toleration of
// every NoSchedule taint keeps what nodeName did, which bypassed the
// scheduler and so those taints (the kubelet still refuses NoExecute taints
// the pod does not tolerate, as before). What the scheduler adds: a node
// without room leaves the pod Pending (Unschedulable) where the kubelet
// would have failed it (OutOfcpu and the like).
func pinByAffinity(spec *corev1.PodSpec) {
	node := spec.NodeName
	if node == "" {
		return
	}
	spec.NodeName = ""
	onNode := corev1.NodeSelectorRequirement{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	required := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if required == nil || len(required.NodeSelectorTerms) == 0 {
		spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{onNode}}},
		}
	} else {
		for i := range required.NodeSelectorTerms {
			required.NodeSelectorTerms[i].MatchFields = append(required.NodeSelectorTerms[i].MatchFields, onNode)
		}
	}
	spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
}

// claimGone says why rec no longer wants a pod for attempt n from executor
// instance, built from a record with nonce, or "" when it does: the record
// is that one (not a later record of its ID, used again after retention
// deleted the earlier one), the instance's, unfinished, not cancelled, at
// attempt n, and no pod of that attempt is recorded.
func claimGone(rec store.Record, n int, instance, cluster, nonce string) string {
	switch {
	case rec.Nonce != nonce:
		return "the task's record is a later one of its ID"
	case rec.Executor != instance:
		return "the task moved to executor " + rec.Executor
	case rec.Cluster != cluster:
		return fmt.Sprintf("the task is placed on cluster %q", rec.Cluster)
	case rec.Terminal:
		return "the task has its outcome"
	case !rec.CancelledAt.IsZero():
		return "the task was cancelled"
	case rec.Attempt != n:
		return fmt.Sprintf("the task is at attempt %d", rec.Attempt)
	case rec.PodCreated:
		return "the attempt's pod is recorded"
	}
	return ""
}

// checkClaim fails with errNotClaimed unless the record of task id still
// wants the pod of attempt n from this instance and epoch is still the
// instance's current one; with the store's error when it cannot tell.
func (e *Executor) checkClaim(ctx context.Context, id string, n int, epoch int64, nonce string) error {
	rec, err := e.store.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("checking the claim of task %s: %w", id, err)
	}
	if why := claimGone(rec, n, e.cfg.InstanceID, e.cfg.Cluster, nonce); why != "" {
		return fmt.Errorf("%w: %s", errNotClaimed, why)
	}
	cur, err := e.store.Epoch(ctx, e.cfg.InstanceID)
	if err != nil {
		return fmt.Errorf("checking the claim of task %s: %w", id, err)
	}
	if cur != epoch {
		if cur > epoch {
			e.endFencedTerm(epoch, "a creation's claim check found a newer term", "task", id)
		}
		return fmt.Errorf("%w: term %d of the instance began (this one is %d)", errNotClaimed, cur, epoch)
	}
	return nil
}

// claimPod records obj, the gated pod just created (or found) for attempt n
// of task id, as the attempt's pod, with a write fenced by the term's epoch,
// and then removes its gate. When the record does not take it (it no longer
// wants a pod, records another, or the write is fenced) obj is discarded,
// never having run.
func (e *Executor) claimPod(ctx context.Context, id string, n int, obj *corev1.Pod, adopted bool) (*corev1.Pod, error) {
	if err := e.discardBlocksClaim(id, obj); err != nil {
		return nil, err
	}
	var claimErr error
	for range 5 {
		rec, err := e.store.Get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("recording pod %s/%s: %w", obj.Namespace, obj.Name, err)
		}
		if rec.PodCreated && rec.Attempt == n && rec.PodUID == string(obj.UID) && rec.Cluster == e.cfg.Cluster {
			claimErr = nil // recorded by an earlier try whose answer was lost
			break
		}
		if why := claimGone(rec, n, e.cfg.InstanceID, e.cfg.Cluster, obj.Annotations[task.AnnotationNonce]); why != "" {
			claimErr = fmt.Errorf("%w: %s", errNotClaimed, why)
			break
		}
		_, claimErr = e.markCreated(ctx, rec, obj, adopted, e.cfg.Clock.Now())
		if !errors.Is(claimErr, store.ErrConflict) {
			break
		}
	}
	switch {
	case errors.Is(claimErr, errNotClaimed), errors.Is(claimErr, store.ErrFenced):
		e.cfg.Logger.Info("discarding a pod its record does not take; it never ran", "task", id, "pod", obj.Namespace+"/"+obj.Name, "why", claimErr)
		if err := attempt.Discard(ctx, e.client, obj); err != nil {
			e.cfg.Logger.Warn("discarding a pod failed; the next term discards it", "pod", obj.Namespace+"/"+obj.Name, "err", err)
		}
		return nil, claimErr
	case claimErr != nil:
		return nil, claimErr // the next creation finds the gated pod (AlreadyExists) and records it
	}
	if err := attempt.Ungate(ctx, e.client, obj); err != nil {
		// Recorded: the task's next sync removes the gate.
		e.cfg.Logger.Warn("removing the fence's gate failed; retrying from the task's sync", "pod", obj.Namespace+"/"+obj.Name, "err", err)
		return obj, nil
	}
	e.noteUngated(id, obj.UID)
	e.cfg.Tracer.ungated(id, n, e.cfg.Clock.Now())
	for i, g := range obj.Spec.SchedulingGates {
		if g.Name == task.FenceGate {
			obj = obj.DeepCopy()
			obj.Spec.SchedulingGates = slices.Delete(obj.Spec.SchedulingGates, i, i+1)
			break
		}
	}
	return obj, nil
}

// noteUngated remembers that this process removed the fence gate of pod uid
// of task id, so that a cache that still shows the gate does not make the
// task's sync remove it again.
func (e *Executor) noteUngated(id string, uid types.UID) {
	e.mu.Lock()
	e.memoLocked(id).ungated = uid
	e.mu.Unlock()
}

func (e *Executor) ungatedBy(id string, uid types.UID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ungated types.UID
	if m := e.memos[id]; m != nil {
		ungated = m.ungated
	}
	return ungated == uid
}

// create creates pod, gated and stamped with the term's epoch. On
// AlreadyExists it reads the existing pod: one this term created (a retried
// creation) is returned as created, unless it is being deleted (this term
// discarded it: the discard is finished and the creation fails, to be
// retried); one an earlier term created and never
// ran (still gated, not recorded: the claim was checked before) is discarded
// and the creation fails, to be retried; a pod of a release before the fence
// (no epoch) with the task's identity is adopted; anything else is not the
// task's.
func (e *Executor) create(ctx context.Context, pod *corev1.Pod, epoch int64) (*corev1.Pod, bool, error) {
	obj, err := e.client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	switch {
	case err == nil:
		e.metrics.podCreations.WithLabelValues("created").Inc()
		return obj, false, nil
	case errors.Is(err, errNotClaimed):
		return nil, false, err
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
	fenced, stamped := attempt.Fenced(live), live.Annotations[task.AnnotationEpoch] != ""
	ownInstance := live.Annotations[task.AnnotationExecutor] == e.cfg.InstanceID
	podEpoch, _ := strconv.ParseInt(live.Annotations[task.AnnotationEpoch], 10, 64)
	switch {
	case fenced && ownInstance && podEpoch == epoch && live.DeletionTimestamp != nil:
		// This term's, and discarded (a claim that found the task moved
		// away, its deletion's answer lost; the finalizer keeps it): never
		// recorded, whatever the record says now (simulation seed
		// 2600198083: the task came back, and the retry's claim recorded
		// the pod being deleted). The discard is finished, and the creation
		// tried again once the pod is gone.
		if err := attempt.Discard(ctx, e.client, live); err != nil {
			return nil, false, err
		}
		return nil, false, fmt.Errorf("pod %s/%s of this term is being discarded; creating it again once it is gone", pod.Namespace, pod.Name)
	case fenced && ownInstance && podEpoch == epoch:
		return live, false, nil // this term's: an earlier try whose answer was lost
	case fenced && ownInstance && podEpoch > epoch:
		// A newer term of the instance created it: this request was sent
		// before that term began and arrived after its creation. The pod
		// is that term's to record; this term, fenced, leaves it alone
		// (discarded, the newer term recorded a deleted pod: simulation
		// seed 80149096).
		return nil, false, fmt.Errorf("%w: pod %s/%s is term %d's, this term is %d", errNotClaimed, pod.Namespace, pod.Name, podEpoch, epoch)
	case fenced:
		e.cfg.Logger.Info("discarding a pod an earlier term created and never ran", "pod", pod.Namespace+"/"+pod.Name, "epoch", live.Annotations[task.AnnotationEpoch])
		if err := attempt.Discard(ctx, e.client, live); err != nil {
			return nil, false, err
		}
		return nil, false, fmt.Errorf("pod %s/%s of an earlier term was discarded; creating it again", pod.Namespace, pod.Name)
	case !stamped:
		return live, true, nil // created before the fence existed
	}
	return nil, false, fmt.Errorf("%w: %s/%s runs without its record taking it", errNameTaken, pod.Namespace, pod.Name)
}

// ownsPod reports whether pod carries identity id (the executor may be this
// instance or one it adopts) and attempt n.
func (e *Executor) ownsPod(pod *corev1.Pod, id task.Identity, n int) bool {
	got, m, err := task.IdentityFromPod(pod)
	if err != nil || m != n || got.Namespace != id.Namespace || got.Name != id.Name || got.RunID != id.RunID || got.Nonce != id.Nonce {
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
