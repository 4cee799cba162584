package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/podlog"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/task"
)

// LogMode says which containers' logs Run streams.
type LogMode string

const (
	// LogsMain streams the main container's log (the default).
	LogsMain LogMode = "main"
	// LogsAll streams every container's log, init containers and sidecars included.
	LogsAll LogMode = "all"
	// LogsNone streams nothing.
	LogsNone LogMode = "none"
)

// LogLine is a line (or piece of a line) of a container's log: podlog.Line.
type LogLine = podlog.Line

// finishTimeout bounds the work after the outcome is decided (result, stop,
// delete, release), which a cancellation does not interrupt.
const finishTimeout = 5 * time.Minute

// ReasonResultFailed is the reason of an outcome whose main container succeeded
// but whose result could not be read: missing, or larger than result.maxBytes.
// It extends podstate's reasons; Run never reports it for a failed main container.
const ReasonResultFailed podstate.Reason = "ResultFailed"

// ErrNothingToAttach is returned when Options.AttachOnly is set and no
// unfinished pod of the task's run exists.
var ErrNothingToAttach = errors.New("no unfinished pod to attach to")

// ErrAmbiguous is returned when more than one unfinished pod belongs to the
// task's run; Run refuses to pick one.
var ErrAmbiguous = errors.New("ambiguous: several unfinished pods")

// Options configure Run. The zero value of every field but Identity is usable.
type Options struct {
	// Identity names the run; its pods are found by task.RunSelector. Required.
	Identity task.Identity
	// AttachOnly makes Run attach to the unfinished pod of the run and fail with
	// ErrNothingToAttach when there is none, instead of creating one. Without it Run
	// still attaches to an unfinished pod of the run rather than creating a second.
	AttachOnly bool
	// Logs selects the containers whose logs are streamed to OnLog (default LogsMain).
	Logs LogMode
	// OnLog receives log lines, one call at a time, in order per container.
	OnLog func(LogLine)
	// OnEvent receives progress events, one call at a time.
	OnEvent func(Event)
	// Clock is used for timeouts and elapsed times (default: the real clock).
	Clock clock.Clock
	// Logger receives debug details (default: slog.Default()).
	Logger *slog.Logger
	// Execer reads File results (default: attempt.NewExecer over the given config).
	Execer attempt.Execer
	// FailureLogLines is how many of the main container's last log lines a failed
	// outcome carries (default 20).
	FailureLogLines int
}

// Event is a step of the run, for progress output.
type Event struct {
	// Time is when it happened; Elapsed is the time since Run started.
	Time    time.Time
	Elapsed time.Duration
	// Type is one of "created", "attached", "state", "stopping", "deleting",
	// "cancelling", "released".
	Type string
	// Pod is "namespace/name".
	Pod string
	// Phase, Reason and Message are the task's state (for "state" events).
	Phase   podstate.Phase
	Reason  podstate.Reason
	Message string
}

// Outcome is the result of one run.
type Outcome struct {
	// Namespace and Pod name the pod that ran the task; Attempt is its attempt number.
	Namespace, Pod string
	Attempt        int
	// Attached is true when Run found the pod instead of creating it.
	Attached bool
	// Phase, Reason, Message and ExitCode are the task's outcome, decided by the main
	// container (podstate.Derive), except Reason ReasonResultFailed.
	Phase    podstate.Phase
	Reason   podstate.Reason
	Message  string
	ExitCode *int32
	// Result is the task's result, when it has one and it could be read.
	Result []byte
	// ResultError explains why the result could not be read.
	ResultError string
	// LogTail holds the main container's last log lines and Events the pod's events,
	// for failed outcomes.
	LogTail []string
	Events  []string
	// Cleanup is what happened to the pod: "deleted", "kept" or "" (already gone).
	Cleanup string
	// Elapsed is the time from Run's start until the outcome was decided.
	Elapsed time.Duration
}

// Succeeded reports whether the task succeeded.
func (o *Outcome) Succeeded() bool { return o.Phase == podstate.Succeeded }

// Run runs t, a defaulted and valid task, to completion: it creates the pod of
// opts.Identity (or attaches to the run's unfinished pod), streams logs, decides
// the outcome from the main container, reads the result before stopping
// anything, stops sidecars that would keep the pod running, cleans up per
// t.Spec.Cleanup and releases kubetask's finalizer. It never creates a second
// pod for a run that has an unfinished one.
//
// When ctx ends before the outcome is decided, Run deletes the pod (its grace
// period honoured), waits for it to go and returns an outcome with reason
// Cancelled. A failed task is an Outcome, not an error; errors are reserved for
// failures to talk to the cluster and for ErrNothingToAttach/ErrAmbiguous.
func Run(ctx context.Context, client kubernetes.Interface, cfg *rest.Config, t *task.Task, opts Options) (*Outcome, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Logs == "" {
		opts.Logs = LogsMain
	}
	if opts.FailureLogLines <= 0 {
		opts.FailureLogLines = 20
	}
	if opts.Execer == nil && cfg != nil {
		opts.Execer = attempt.NewExecer(cfg, client)
	}
	r := &run{client: client, t: t, opts: opts, start: opts.Clock.Now(), policy: t.Policy(),
		changed: make(chan struct{}, 1), tail: podlog.NewTail(opts.FailureLogLines)}
	return r.run(ctx)
}

type run struct {
	client kubernetes.Interface
	t      *task.Task
	opts   Options
	start  time.Time
	policy podstate.Policy

	ns, name string
	lister   cache.Indexer
	changed  chan struct{} // the pod changed (capacity 1, never closed)
	subsMu   sync.Mutex
	subs     []chan struct{}

	emitMu sync.Mutex
	tail   *podlog.Tail
	last   podstate.State
}

func (r *run) log() *slog.Logger { return r.opts.Logger }

func (r *run) event(e Event) {
	if r.opts.OnEvent == nil {
		return
	}
	e.Time = r.opts.Clock.Now()
	e.Elapsed = e.Time.Sub(r.start)
	e.Pod = r.ns + "/" + r.name
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	r.opts.OnEvent(e)
}

func (r *run) line(l LogLine) {
	if l.Container == r.t.Spec.MainContainer {
		r.tail.Add(l)
	}
	if r.opts.OnLog == nil {
		return
	}
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	r.opts.OnLog(l)
}

func (r *run) run(ctx context.Context) (*Outcome, error) {
	pod, attached, err := r.acquire(ctx)
	if err != nil {
		return nil, err
	}
	r.ns, r.name = pod.Namespace, pod.Name
	_, att, _ := task.IdentityFromPod(pod)
	out := &Outcome{Namespace: r.ns, Pod: r.name, Attempt: att, Attached: attached}
	if attached {
		r.event(Event{Type: "attached"})
	} else {
		r.event(Event{Type: "created"})
	}

	// The informer outlives ctx: after a cancellation it still watches the pod go.
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWatch()
	if err := r.watch(watchCtx, ctx); err != nil {
		return nil, err
	}

	logCtx, stopLogs := context.WithCancel(ctx)
	defer stopLogs()
	mainLogs := r.startLogs(logCtx)

	for {
		if ctx.Err() != nil {
			return r.cancel(ctx, out, mainLogs)
		}
		pod, err := r.current(ctx)
		if err != nil {
			if ctx.Err() != nil {
				continue // the cancel path above
			}
			return nil, err
		}
		st := podstate.Derive(pod, r.policy, r.opts.Clock.Now())
		r.report(st)
		if st.Terminal() {
			// Once the outcome is decided, cleaning up must not be cut short by a
			// cancellation: it is bounded instead.
			fctx, done := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
			defer done()
			return r.finish(fctx, ctx, out, pod, st, mainLogs, stopLogs)
		}
		var recheck <-chan time.Time
		var timer clock.Timer
		if !st.Recheck.IsZero() {
			timer = r.opts.Clock.NewTimer(st.Recheck.Sub(r.opts.Clock.Now()))
			recheck = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-r.changed:
		case <-recheck:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// report emits a "state" event when the state's phase or reason changed.
func (r *run) report(st podstate.State) {
	if st.Phase == r.last.Phase && st.Reason == r.last.Reason && st.Message == r.last.Message {
		return
	}
	r.last = st
	r.event(Event{Type: "state", Phase: st.Phase, Reason: st.Reason, Message: st.Message})
}

// acquire finds the run's unfinished pod or creates the next attempt's.
func (r *run) acquire(ctx context.Context) (*corev1.Pod, bool, error) {
	id := r.opts.Identity
	list, err := r.client.CoreV1().Pods(id.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.RunSelector(id).String()})
	if err != nil {
		return nil, false, fmt.Errorf("listing pods of run %s: %w", id.RunID, err)
	}
	open, next := selectPods(list.Items, id)
	switch {
	case len(open) > 1:
		names := make([]string, len(open))
		for i, p := range open {
			names[i] = p.Name
		}
		return nil, false, fmt.Errorf("%w of task %s/%s (run %s): %s; refusing to pick one. Keep one and release the others: "+
			"kubectl -n %s patch pod NAME --type=json -p '[{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}]' && kubectl -n %s delete pod NAME",
			ErrAmbiguous, id.Namespace, id.Name, id.RunID, strings.Join(names, ", "), id.Namespace, id.Namespace)
	case len(open) == 1:
		return open[0], true, nil
	case r.opts.AttachOnly:
		return nil, false, fmt.Errorf("%w: task %s/%s (run %s) has no pod still waiting for its outcome in namespace %s",
			ErrNothingToAttach, id.Namespace, id.Name, id.RunID, id.Namespace)
	}
	pod, err := task.BuildPod(r.t, id, next)
	if err != nil {
		return nil, false, err
	}
	created, err := r.client.CoreV1().Pods(id.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Someone created this attempt at the same time: attach to it if it is ours.
		got, gerr := r.client.CoreV1().Pods(id.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, false, fmt.Errorf("getting pod %s/%s: %w", id.Namespace, pod.Name, gerr)
		}
		if o, _ := selectPods([]corev1.Pod{*got}, id); len(o) == 1 {
			return o[0], true, nil
		}
		return nil, false, fmt.Errorf("pod %s/%s exists and is not an unfinished pod of this run", id.Namespace, pod.Name)
	}
	if err != nil {
		return nil, false, fmt.Errorf("creating pod %s/%s: %w", id.Namespace, pod.Name, err)
	}
	return created, false, nil
}

// selectPods returns the unfinished pods of run id among pods (those still
// carrying kubetask's finalizer: their outcome was never recorded) and the next
// free attempt number. Pods whose recorded identity is not id are ignored.
func selectPods(pods []corev1.Pod, id task.Identity) (open []*corev1.Pod, next int) {
	for i := range pods {
		p := &pods[i]
		pid, att, err := task.IdentityFromPod(p)
		if err != nil || pid != id {
			continue
		}
		next = max(next, att+1)
		if slices.Contains(p.Finalizers, task.Finalizer) {
			open = append(open, p)
		}
	}
	sort.Slice(open, func(i, j int) bool { return open[i].Name < open[j].Name })
	return open, next
}

// watch starts an informer on the one pod (a field selector on its name). The
// informer relists on 410 Expired and after API server restarts; the runner is
// level-based and reads the pod from its store on every change.
func (r *run) watch(ctx, runCtx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(r.client, 0, informers.WithNamespace(r.ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", r.name).String()
		}))
	inf := f.Core().V1().Pods().Informer()
	kick := func(any) { r.kick() }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kick, UpdateFunc: func(_, o any) { kick(o) }, DeleteFunc: kick,
	}); err != nil {
		return fmt.Errorf("watching pod %s/%s: %w", r.ns, r.name, err)
	}
	r.lister = inf.GetIndexer()
	f.Start(ctx.Done())
	// A cancellation during the first list is handled by the caller's cancel
	// path (which reads the pod with a GET), so only runCtx ends the wait.
	if !cache.WaitForCacheSync(runCtx.Done(), inf.HasSynced) && runCtx.Err() == nil {
		return fmt.Errorf("watching pod %s/%s: cache did not sync", r.ns, r.name)
	}
	return nil
}

func (r *run) kick() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
	r.subsMu.Lock()
	for _, c := range r.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	r.subsMu.Unlock()
}

func (r *run) subscribe() <-chan struct{} {
	c := make(chan struct{}, 1)
	r.subsMu.Lock()
	r.subs = append(r.subs, c)
	r.subsMu.Unlock()
	return c
}

// cached returns the pod from the informer's store (nil when absent). Never modify it.
func (r *run) cached() *corev1.Pod {
	obj, ok, err := r.lister.GetByKey(r.ns + "/" + r.name)
	if err != nil || !ok {
		return nil
	}
	p, _ := obj.(*corev1.Pod)
	return p
}

// current returns the pod, nil when it is gone: a pod missing from the store is
// confirmed with a GET so that a lagging cache never makes a live pod look gone.
func (r *run) current(ctx context.Context) (*corev1.Pod, error) {
	if p := r.cached(); p != nil {
		return p, nil
	}
	p, err := r.client.CoreV1().Pods(r.ns).Get(ctx, r.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("getting pod %s/%s: %w", r.ns, r.name, err)
	}
	return p, nil
}

// startLogs starts one follower per streamed container; the returned channel is
// closed when the main container's log has been read completely (at once when it
// is not streamed).
func (r *run) startLogs(ctx context.Context) <-chan struct{} {
	mainDone := make(chan struct{})
	if r.opts.Logs == LogsNone {
		close(mainDone)
		return mainDone
	}
	names := []string{r.t.Spec.MainContainer}
	if r.opts.Logs == LogsAll {
		names = nil
		spec := r.t.Spec.Template.Spec
		for _, c := range spec.InitContainers {
			names = append(names, c.Name)
		}
		for _, c := range spec.Containers {
			names = append(names, c.Name)
		}
	}
	for _, name := range names {
		f, err := podlog.New(podlog.Config{Client: r.client, Namespace: r.ns, Pod: r.name, Container: name,
			Progress: func() podlog.Progress { return podlog.ProgressOf(r.cached(), name) },
			Changed:  r.subscribe(), Clock: r.opts.Clock, OnLine: r.line, Logger: r.log(),
		})
		main := name == r.t.Spec.MainContainer
		go func() {
			if err == nil {
				err = f.Run(ctx)
			}
			if err != nil && ctx.Err() == nil {
				r.log().Debug("log not read to its end", "container", name, "err", err)
			}
			if main {
				close(mainDone)
			}
		}()
	}
	return mainDone
}

// finish handles a decided outcome: result, failure details, stop or delete,
// release. ctx bounds the API calls; runCtx is the caller's context (for the
// wait on the main container's log).
func (r *run) finish(ctx, runCtx context.Context, out *Outcome, pod *corev1.Pod, st podstate.State, mainLogs <-chan struct{}, stopLogs func()) (*Outcome, error) {
	out.Phase, out.Reason, out.Message, out.ExitCode = st.Phase, st.Reason, st.Message, st.ExitCode
	out.Elapsed = r.opts.Clock.Now().Sub(r.start)

	// The main container's log ends once it terminated; do not wait forever for an
	// unreachable API server.
	if st.ExitCode != nil {
		select {
		case <-mainLogs:
		case <-runCtx.Done():
		case <-r.opts.Clock.After(30 * time.Second):
			r.log().Warn("main container's log did not end; continuing", "pod", r.ns+"/"+r.name)
		}
	}

	// Read the result before stopping anything: a File result lives in the holder.
	if pod != nil && r.t.Spec.Result != nil && st.ExitCode != nil && (r.opts.Execer != nil || r.t.Spec.Result.From != task.ResultFromFile) {
		res, err := attempt.ReadResult(ctx, r.opts.Execer, pod, r.t)
		switch {
		case err != nil && st.Phase == podstate.Succeeded:
			out.Phase, out.Reason, out.ResultError = podstate.Failed, ReasonResultFailed, err.Error()
			out.Message = "the main container succeeded but its result could not be read: " + err.Error()
		case err != nil:
			out.ResultError = err.Error()
		default:
			out.Result = res
		}
	}

	if out.Phase == podstate.Failed && pod != nil {
		r.explain(ctx, out)
	}
	stopLogs()

	if pod != nil {
		outcome := st
		outcome.Phase = out.Phase
		deleted := attempt.ShouldDelete(r.t.Spec.Cleanup, outcome)
		if deleted {
			r.event(Event{Type: "deleting"})
			if err := attempt.Delete(ctx, r.client, r.ns, r.name); err != nil {
				return out, err
			}
			out.Cleanup = "deleted"
		} else {
			out.Cleanup = "kept"
			if st.StopPod || podRunning(pod) {
				r.event(Event{Type: "stopping"})
				if err := attempt.Stop(ctx, r.client, pod, r.opts.Clock.Now()); err != nil {
					return out, err
				}
			}
		}
		r.settle(ctx, pod, deleted)
	}
	return out, nil
}

// podRunning reports whether a regular container of p may still run (the pod
// has not finished and is not being deleted).
func podRunning(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Terminated == nil {
			return true
		}
	}
	return false
}

// explain gathers the main container's last log lines and the pod's events.
func (r *run) explain(ctx context.Context, out *Outcome) {
	out.LogTail = r.tail.Lines()
	if len(out.LogTail) == 0 {
		if lines, err := podlog.LastLines(ctx, r.client, r.ns, r.name, r.t.Spec.MainContainer, int64(r.opts.FailureLogLines)); err == nil {
			out.LogTail = lines
		}
	}
	evs, err := r.client.CoreV1().Events(r.ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(
			fields.OneTermEqualSelector("involvedObject.name", r.name),
			fields.OneTermEqualSelector("involvedObject.kind", "Pod")).String(),
	})
	if err != nil {
		r.log().Debug("listing pod events", "pod", r.ns+"/"+r.name, "err", err)
		return
	}
	items := evs.Items
	sort.SliceStable(items, func(i, j int) bool { return eventTime(&items[i]).Before(eventTime(&items[j])) })
	for _, e := range items {
		s := fmt.Sprintf("%s %s: %s", e.Type, e.Reason, strings.TrimSpace(e.Message))
		if e.Count > 1 {
			s += fmt.Sprintf(" (x%d)", e.Count)
		}
		out.Events = append(out.Events, s)
	}
}

func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	default:
		return e.CreationTimestamp.Time
	}
}

// cancel handles the end of ctx before the outcome was decided: the pod is
// deleted with its grace period, Run waits until its containers stopped,
// releases the finalizer and waits for the object to go.
func (r *run) cancel(ctx context.Context, out *Outcome, mainLogs <-chan struct{}) (*Outcome, error) {
	cctx, done := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer done()
	pod, err := r.current(cctx)
	if err != nil {
		return nil, fmt.Errorf("cancelling: %w", err)
	}

	policy := r.policy
	policy.CancelledAt = r.opts.Clock.Now()
	st := podstate.Derive(pod, policy, policy.CancelledAt)
	if st.Terminal() && st.Reason != podstate.ReasonCancelled && st.Reason != podstate.ReasonDeletedExternally {
		// The main container had finished before the cancellation: its outcome stands.
		r.report(st)
		return r.finish(cctx, ctx, out, pod, st, mainLogs, func() {})
	}
	r.event(Event{Type: "cancelling"})
	out.Phase, out.Reason = podstate.Failed, podstate.ReasonCancelled
	out.Message = "the run was cancelled; the pod was deleted"
	out.Elapsed = r.opts.Clock.Now().Sub(r.start)
	if pod == nil {
		return out, nil
	}
	if err := attempt.Delete(cctx, r.client, r.ns, r.name); err != nil {
		return out, err
	}
	out.Cleanup = "deleted"
	r.settle(cctx, pod, true)
	return out, nil
}

// settle waits until every container of the pod stopped (the kubelet reports
// a final phase, or the pod is gone), releases kubetask's finalizer and, when
// the pod was deleted, waits for the object to go. Release is level-based:
// whenever the cached pod still carries the finalizer, it is removed (again).
// Each wait is bounded by the pod's grace period plus 30 s; a pod that
// is still there then is released anyway and the wait is logged.
func (r *run) settle(ctx context.Context, pod *corev1.Pod, deleted bool) {
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	bound := time.Duration(grace)*time.Second + 30*time.Second
	r.waitFor(ctx, bound, stoppedAt(r.opts.Clock.Now))
	release := func(p *corev1.Pod) {
		if p == nil || !slices.Contains(p.Finalizers, task.Finalizer) {
			return
		}
		if err := attempt.ReleaseSeen(ctx, r.client, p); err != nil {
			r.log().Warn("releasing pod", "pod", r.ns+"/"+r.name, "err", err)
		}
	}
	release(r.cached())
	r.event(Event{Type: "released"})
	r.waitFor(ctx, bound, func(p *corev1.Pod) bool {
		release(p)
		return p == nil || (!deleted && !slices.Contains(p.Finalizers, task.Finalizer))
	})
}

// stoppedAt returns a condition that reports whether no container of a pod
// runs any more at time now: the pod is gone, was never bound to a node, has a
// final phase, or is being deleted and either the kubelet confirmed it (it
// deletes the pod with grace 0 once the containers stopped), the deletion
// deadline (deletionTimestamp, when the kubelet SIGKILLs) passed by
// killMargin, or no container status says running.
func stoppedAt(now func() time.Time) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		if p == nil || p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			return true
		}
		if p.DeletionTimestamp == nil {
			return false
		}
		if g := p.DeletionGracePeriodSeconds; g != nil && *g == 0 {
			return true
		}
		if now().After(p.DeletionTimestamp.Add(killMargin)) {
			return true
		}
		for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
			for _, s := range list {
				if s.State.Running != nil {
					return false
				}
			}
		}
		return true
	}
}

// killMargin is how long after a pod's deletion deadline kubetask assumes the
// kubelet has killed its containers even if it did not report so.
const killMargin = 2 * time.Second

// waitFor waits until cond holds for the cached pod, at most d.
func (r *run) waitFor(ctx context.Context, d time.Duration, cond func(*corev1.Pod) bool) bool {
	deadline := r.opts.Clock.After(d)
	for {
		if cond(r.cached()) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline:
			r.log().Warn("gave up waiting for pod", "pod", r.ns+"/"+r.name, "after", d)
			return false
		case <-r.changed:
		case <-r.opts.Clock.After(time.Second):
		}
	}
}
