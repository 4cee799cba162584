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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/podlog"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
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

// finishTimeout bounds the wait, after a cancellation, for the outcome.
const finishTimeout = 5 * time.Minute

// settleMargin is added to the pod's grace period to bound the wait until the
// pod of a decided attempt has stopped and is released (or gone).
const settleMargin = 60 * time.Second

// mainLogWait bounds the wait for the rest of the main container's log once
// its outcome is decided.
const mainLogWait = 30 * time.Second

// ReasonResultFailed is the reason of an outcome whose main container
// succeeded but whose result could not be read: podstate.ReasonResultFailed.
const ReasonResultFailed = podstate.ReasonResultFailed

// ErrNothingToAttach is returned when Options.AttachOnly is set and no
// unfinished pod of the task's run exists.
var ErrNothingToAttach = errors.New("no unfinished pod to attach to")

// ErrAmbiguous is returned when more than one unfinished pod belongs to the
// task's run; Run refuses to pick one.
var ErrAmbiguous = errors.New("ambiguous: several unfinished pods")

// Options configure Run. The zero value of every field but Identity is usable.
type Options struct {
	// Identity names the run; its pods are found by task.RunSelector. Required.
	// Identity.Executor is the instance ID of the run's executor: two Runs
	// with the same one exclude each other (the second waits for the first's
	// instance Lease), so give each run its own (the CLI uses the run ID).
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
	Clock clock.WithTicker
	// Logger receives debug details (default: slog.Default()).
	Logger *slog.Logger
	// Execer reads File results (default: attempt.NewExecer over the given config).
	Execer attempt.Execer
	// FailureLogLines is how many of the main container's last log lines a failed
	// outcome carries (default 20).
	FailureLogLines int
	// LeaseDuration bounds how long a run killed without releasing its
	// instance Lease (kill -9) delays the next Run of the same instance
	// (default 8s).
	LeaseDuration time.Duration
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
	// container (podstate.Derive), or ReasonResultFailed.
	Phase    podstate.Phase
	Reason   podstate.Reason
	Message  string
	ExitCode *int32
	// Result is the task's result, when it has one and it could be read.
	Result []byte
	// ResultError explains why the result could not be read (ReasonResultFailed).
	ResultError string
	// LogTail holds the main container's last log lines and Events the pod's events,
	// for failed outcomes.
	LogTail []string
	Events  []string
	// Cleanup is what happened to the pod: "deleted", "kept" or "" (there was none).
	Cleanup string
	// Elapsed is the time from Run's start until the outcome was decided.
	Elapsed time.Duration
}

// Succeeded reports whether the task succeeded.
func (o *Outcome) Succeeded() bool { return o.Phase == podstate.Succeeded }

// Run runs t, a defaulted and valid task, to completion with the executor's
// attempt lifecycle (pkg/executor) for one task, an in-memory store and this
// run's own instance: it creates the pod of opts.Identity (or attaches to the
// run's unfinished pod), streams logs, decides the outcome from the main
// container, reads the result before stopping anything, stops sidecars that
// would keep the pod running, cleans up per t.Spec.Cleanup and releases
// kubetask's finalizer once no container runs. It runs one attempt
// (t.Spec.Retries is not applied) and never creates a second pod for a run
// that has an unfinished one.
//
// When Run returns an outcome, a kept pod has nothing running in it and no
// finalizer, and a deleted pod is gone (each wait bounded by the pod's grace
// period plus a minute). When ctx ends before the outcome is decided, Run
// cancels the task: the pod is deleted (its grace period honoured) and the
// outcome has reason Cancelled, unless the main container finished first. A
// failed task is an Outcome, not an error; errors are reserved for failures to
// talk to the cluster and for ErrNothingToAttach/ErrAmbiguous.
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
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = 8 * time.Second
	}
	one := t.DeepCopy()
	none := int32(0)
	one.Spec.Retries.Limit = &none // one attempt
	id := opts.Identity
	r := &run{client: client, t: one, opts: opts, id: id, start: opts.Clock.Now(),
		tail: podlog.NewTail(opts.FailureLogLines), evReady: make(chan struct{}, 1),
		postDone: make(chan struct{}), changed: make(chan struct{}, 1)}
	execCfg := executor.Config{
		RESTConfig: cfg, Client: client, Execer: opts.Execer,
		InstanceID: id.Executor, Namespaces: []string{id.Namespace},
		DefaultNamespace: id.Namespace, LeaseNamespace: id.Namespace,
		Parallelism: 1, CreateConcurrency: 1, Workers: 2,
		PlainList:      true, // a LIST of one pod answers at once; a streaming list may wait 100 ms
		EphemeralLease: true, // one request to take a free run's Lease, one to let it go, none left behind
		Store:          store.NewMemory(),
		OnEvent:        r.onEvent,
		OnPodChange:    func(string, string) { r.kick() },
		OnLeading:      r.acquire,
		Hold:           func(string, int) bool { return !r.isPostDone() },
		HoldTimeout:    mainLogWait + 30*time.Second,
		Clock:          opts.Clock,
		Logger:         opts.Logger,
		LeaseDuration:  opts.LeaseDuration, RenewDeadline: opts.LeaseDuration * 2 / 3, RetryPeriod: opts.LeaseDuration / 6,
	}
	if cfg != nil && cfg.QPS > 0 {
		execCfg.QPS, execCfg.Burst = cfg.QPS, cfg.Burst
	}
	ex, err := executor.New(execCfg)
	if err != nil {
		return nil, err
	}
	r.ex = ex
	// The executor outlives a cancellation of ctx: it cancels the task and
	// sees the pod go.
	exCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	exDone := make(chan struct{})
	var exErr error
	go func() {
		exErr = ex.Start(exCtx)
		close(exDone)
	}()
	defer func() {
		stop()
		<-exDone
	}()
	return r.wait(ctx, exDone, func() error { return exErr })
}

type run struct {
	client kubernetes.Interface
	t      *task.Task
	opts   Options
	id     task.Identity
	start  time.Time
	ex     *executor.Executor

	evMu     sync.Mutex
	evQueue  []executor.Event // from the executor's worker, never blocking it
	evReady  chan struct{}    // signalled when evQueue grew (capacity 1)
	changed  chan struct{}    // the pod changed (capacity 1)
	subsMu   sync.Mutex
	subs     []chan struct{}
	postMu   sync.Mutex
	postDone chan struct{} // closed when the run no longer needs the decided pod

	emitMu    sync.Mutex
	tail      *podlog.Tail
	lastState Event

	podMu    sync.Mutex
	attempt  int
	attached bool
	pod      string // the attempt's pod name, once submitted
	mainLogs chan struct{}
}

// podName returns the attempt's pod name ("" before the task is submitted).
func (r *run) podName() string {
	r.podMu.Lock()
	defer r.podMu.Unlock()
	return r.pod
}

func (r *run) log() *slog.Logger { return r.opts.Logger }

func (r *run) event(e Event) {
	if r.opts.OnEvent == nil {
		return
	}
	e.Time = r.opts.Clock.Now()
	e.Elapsed = e.Time.Sub(r.start)
	if pod := r.podName(); e.Pod == "" && pod != "" {
		e.Pod = r.id.Namespace + "/" + pod
	}
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	if e.Type == "state" {
		if l := r.lastState; l.Phase == e.Phase && l.Reason == e.Reason && l.Message == e.Message {
			return
		}
		r.lastState = e
	}
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

func (r *run) onEvent(ev executor.Event) {
	r.evMu.Lock()
	r.evQueue = append(r.evQueue, ev)
	r.evMu.Unlock()
	select {
	case r.evReady <- struct{}{}:
	default:
	}
}

// nextEvents takes the queued executor events.
func (r *run) nextEvents() []executor.Event {
	r.evMu.Lock()
	defer r.evMu.Unlock()
	evs := r.evQueue
	r.evQueue = nil
	return evs
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

func (r *run) isPostDone() bool {
	select {
	case <-r.postDone:
		return true
	default:
		return false
	}
}

func (r *run) releasePod() {
	r.postMu.Lock()
	if !r.isPostDone() {
		close(r.postDone)
	}
	r.postMu.Unlock()
	r.ex.Resync(r.id.RunID)
}

// testHookAfterSubmit, when set (by tests only), runs in acquire between the
// executor's Submit and acquire's own note of the pod's name.
var testHookAfterSubmit func()

// acquire runs under the instance Lease, before the executor's informers
// start: it finds the run's unfinished pod (attach) or the next attempt
// number, and submits the task.
func (r *run) acquire(ctx context.Context) error {
	id := r.id
	list, err := r.client.CoreV1().Pods(id.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.RunSelector(id).String()})
	if err != nil {
		return fmt.Errorf("listing pods of run %s: %w", id.RunID, err)
	}
	open, next := selectPods(list.Items, id)
	switch {
	case len(open) > 1:
		names := make([]string, len(open))
		for i, p := range open {
			names[i] = p.Name
		}
		err = fmt.Errorf("%w of task %s/%s (run %s): %s; refusing to pick one. Keep one and release the others: "+
			"kubectl -n %s patch pod NAME --type=json -p '[{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}]' && kubectl -n %s delete pod NAME",
			ErrAmbiguous, id.Namespace, id.Name, id.RunID, strings.Join(names, ", "), id.Namespace, id.Namespace)
		return err
	case len(open) == 1:
		_, next, _ = task.IdentityFromPod(open[0])
	case r.opts.AttachOnly:
		return fmt.Errorf("%w: task %s/%s (run %s) has no pod still waiting for its outcome in namespace %s",
			ErrNothingToAttach, id.Namespace, id.Name, id.RunID, id.Namespace)
	}
	one := r.t.DeepCopy()
	one.Namespace = id.Namespace
	opts := []executor.SubmitOption{executor.FirstAttempt(next)}
	if len(open) == 1 {
		opts = append(opts, executor.AttachPod(open[0])) // the pod an earlier run started: recorded as the attempt's
	}
	rec, err := r.ex.Submit(ctx, id.RunID, one, opts...)
	if err != nil {
		return err
	}
	if testHookAfterSubmit != nil {
		testHookAfterSubmit()
	}
	named := id
	named.Nonce = rec.Nonce
	r.podMu.Lock()
	r.attempt, r.attached, r.pod = next, len(open) == 1, task.PodName(named, next)
	r.podMu.Unlock()
	return nil
}

// selectPods returns the unfinished pods of run id among pods (those still
// carrying kubetask's finalizer: their outcome was never recorded) and the next
// free attempt number. Pods whose recorded identity is not id are ignored.
func selectPods(pods []corev1.Pod, id task.Identity) (open []*corev1.Pod, next int) {
	for i := range pods {
		p := &pods[i]
		pid, att, err := task.IdentityFromPod(p)
		pid.Nonce = id.Nonce // a run's pods carry the nonce of the record of the process that made them
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

// wait follows the executor's events until the outcome is recorded and the
// pod settled, cancelling the task when ctx ends first.
func (r *run) wait(ctx context.Context, exDone <-chan struct{}, exErr func() error) (*Outcome, error) {
	out := &Outcome{Namespace: r.id.Namespace}
	logCtx, stopLogs := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLogs()
	cancelled := ctx.Done()
	var (
		deadline   <-chan time.Time
		decided    bool
		released   bool
		settleBy   <-chan time.Time
		postLaunch sync.Once
	)
	postDone := r.postDone // once closed, a look at settled, then no more
	for {
		if decided && r.settled(out, released) {
			if !released && out.Pod != "" {
				// Gone: its finalizer is off. The executor's own report of the
				// release may come after the cache saw the pod go.
				r.event(Event{Type: "released"})
			}
			return out, nil
		}
		var evs []executor.Event
		select {
		case <-exDone:
			if decided {
				return out, nil
			}
			err := exErr()
			if err == nil {
				err = errors.New("the executor stopped before the outcome was decided")
			}
			return nil, err
		case <-cancelled:
			cancelled = nil
			if !decided {
				r.event(Event{Type: "cancelling"})
				if err := r.ex.Cancel(context.WithoutCancel(ctx), r.id.RunID); err != nil && !errors.Is(err, store.ErrNotFound) {
					return nil, err
				}
				if r.podName() == "" { // nothing was submitted yet
					out.Phase, out.Reason, out.Message = podstate.Failed, podstate.ReasonCancelled, "the run was cancelled before it started"
					out.Elapsed = r.opts.Clock.Now().Sub(r.start)
					return out, nil
				}
				deadline = r.opts.Clock.After(finishTimeout)
			}
		case <-deadline:
			return nil, fmt.Errorf("cancelling: no outcome %s after the cancellation", finishTimeout)
		case <-settleBy:
			r.log().Warn("gave up waiting for the pod to stop and be released", "pod", r.id.Namespace+"/"+r.pod)
			return out, nil
		case <-r.changed:
		case <-postDone:
			// The post-launch work is done: a pod already gone is settled
			// now, with no event of its own to wake the loop.
			postDone = nil
		case <-r.evReady:
			evs = r.nextEvents()
		}
		for _, ev := range evs {
			switch ev.Type {
			case executor.EventPodCreated, executor.EventPodAdopted:
				r.podMu.Lock()
				// The event names the pod: an adopted pod's event comes from
				// within Submit, before acquire has set r.pod.
				if _, name, ok := strings.Cut(ev.Pod, "/"); ok {
					r.pod = name
				}
				out.Pod, out.Attempt, out.Attached = r.pod, ev.Attempt, r.attached || ev.Type == executor.EventPodAdopted
				r.podMu.Unlock()
				typ := "created"
				if out.Attached {
					typ = "attached"
				}
				r.event(Event{Type: typ})
				r.mainLogs = r.startLogs(logCtx)
			case executor.EventState:
				if ev.Reason == "Creating" {
					continue // "created" follows
				}
				r.event(Event{Type: "state", Phase: podstate.Phase(ev.Phase), Reason: podstate.Reason(ev.Reason), Message: ev.Message})
			case executor.EventAttemptFinished:
				r.event(Event{Type: "state", Phase: podstate.Phase(ev.Phase), Reason: podstate.Reason(ev.Reason), Message: ev.Message})
				decided = true
				out.Phase, out.Reason, out.Message, out.ExitCode = podstate.Phase(ev.Phase), podstate.Reason(ev.Reason), ev.Message, ev.ExitCode
				out.Result, out.Attempt = ev.Result, ev.Attempt
				out.Elapsed = r.opts.Clock.Now().Sub(r.start)
				if out.Reason == ReasonResultFailed {
					out.ResultError = ev.Message
				}
				if ev.Pod == "" {
					out.Pod = ""
					r.releasePod()
					continue
				}
				out.Pod = r.podName()
				out.Cleanup = "kept"
				if ev.Delete {
					out.Cleanup = "deleted"
				}
				settleBy = r.opts.Clock.After(r.grace() + settleMargin)
				postLaunch.Do(func() { go r.post(ctx, out, stopLogs) })
			case executor.EventPodStopping:
				r.event(Event{Type: "stopping"})
			case executor.EventPodDeleting:
				r.event(Event{Type: "deleting"})
			case executor.EventPodReleased:
				released = true
				r.event(Event{Type: "released"})
			}
		}
	}
}

// settled reports whether the decided attempt's pod is done with: gone, or
// kept with no container running and its finalizer released.
func (r *run) settled(out *Outcome, released bool) bool {
	if !r.isPostDone() {
		return false
	}
	if out.Pod == "" {
		return true
	}
	p := r.ex.CachedPod(r.id.Namespace, r.pod)
	return p == nil || (out.Cleanup == "kept" && released)
}

// post runs while the executor holds the decided pod: it waits for the rest
// of the main container's log, gathers the explanation of a failure, then
// lets the executor stop, delete and release the pod.
func (r *run) post(ctx context.Context, out *Outcome, stopLogs func()) {
	defer r.releasePod()
	if out.ExitCode != nil && r.mainLogs != nil {
		select {
		case <-r.mainLogs:
		case <-ctx.Done():
		case <-r.opts.Clock.After(mainLogWait):
			r.log().Warn("main container's log did not end; continuing", "pod", r.id.Namespace+"/"+r.pod)
		}
	}
	if out.Phase == podstate.Failed {
		r.explain(context.WithoutCancel(ctx), out)
	}
	stopLogs()
}

func (r *run) grace() time.Duration {
	if g := r.t.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return corev1.DefaultTerminationGracePeriodSeconds * time.Second
}

// startLogs starts one follower per streamed container; the returned channel is
// closed when the main container's log has been read completely (at once when it
// is not streamed).
func (r *run) startLogs(ctx context.Context) chan struct{} {
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
		if r.t.Spec.Result != nil && r.t.Spec.Result.From == task.ResultFromFile {
			names = append(names, task.ResultContainer)
		}
	}
	var seenMu sync.Mutex
	seen := false
	progress := func(name string) podlog.Progress {
		p := r.ex.CachedPod(r.id.Namespace, r.pod)
		seenMu.Lock()
		defer seenMu.Unlock()
		if p == nil && !seen {
			// Created, but the cache has not shown it yet: not gone.
			return podlog.Progress{}
		}
		seen = true
		return podlog.ProgressOf(p, name)
	}
	for _, name := range names {
		f, err := podlog.New(podlog.Config{Client: r.client, Namespace: r.id.Namespace, Pod: r.pod, Container: name,
			Progress: func() podlog.Progress { return progress(name) },
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

// explain gathers the main container's last log lines and the pod's events.
func (r *run) explain(ctx context.Context, out *Outcome) {
	out.LogTail = r.tail.Lines()
	if len(out.LogTail) == 0 && out.Pod != "" {
		if lines, err := podlog.LastLines(ctx, r.client, r.id.Namespace, r.pod, r.t.Spec.MainContainer, int64(r.opts.FailureLogLines)); err == nil {
			out.LogTail = lines
		}
	}
	if out.Pod == "" {
		return
	}
	evs, err := r.client.CoreV1().Events(r.id.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(
			fields.OneTermEqualSelector("involvedObject.name", r.pod),
			fields.OneTermEqualSelector("involvedObject.kind", "Pod")).String(),
	})
	if err != nil {
		r.log().Debug("listing pod events", "pod", r.id.Namespace+"/"+r.pod, "err", err)
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
