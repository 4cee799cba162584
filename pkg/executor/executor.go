package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Event is one state change of one task.
type Event struct {
	ID      string
	Attempt int
	// Phase, Reason, Message and ExitCode are the task's state after the change.
	Phase, Reason, Message string
	ExitCode               *int32
	// AttemptFinished is set when this change recorded the end of Attempt.
	AttemptFinished bool
	// Terminal is set when the task's outcome is final; exactly one event per
	// task has it (unless the process dies between recording and delivery:
	// the Store has it then).
	Terminal bool
	Time     time.Time
}

// Status is what Get reports about a task.
type Status = store.Record

// ErrInvalidTask wraps a task that cannot be submitted.
var ErrInvalidTask = errors.New("invalid task")

// Executor runs tasks as pods. Create it with New and run it with Start.
type Executor struct {
	cfg     Config
	client  kubernetes.Interface
	execer  attempt.Execer
	store   store.Store
	queue   workqueue.TypedRateLimitingInterface[string]
	metrics *metrics

	informers []cache.SharedIndexInformer
	indexers  []cache.Indexer

	mu         sync.Mutex
	active     map[string]bool // tasks whose current attempt holds a parallelism slot
	waiting    []string        // tasks waiting for a slot, FIFO
	waitingSet map[string]bool
	creating   int      // pod creations in flight
	createWait []string // tasks waiting for a creation slot, FIFO
	createSet  map[string]bool
	phases     map[string]string // latest phase per task, for the tasks gauge
	listFail   time.Time         // first failed LIST since the last success
	startedAt  time.Time
	started    bool
}

// New validates cfg and returns an Executor.
func New(cfg Config) (*Executor, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	e := &Executor{
		cfg:        cfg,
		store:      cfg.Store,
		metrics:    newMetrics(cfg.Registerer),
		active:     map[string]bool{},
		waitingSet: map[string]bool{},
		phases:     map[string]string{},
		createSet:  map[string]bool{},
	}
	rc := rest.CopyConfig(cfg.RESTConfig)
	rc.QPS, rc.Burst = cfg.QPS, cfg.Burst
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			e.metrics.apiRequests.Inc()
			return rt.RoundTrip(r)
		})
	})
	e.client = cfg.Client
	if e.client == nil {
		c, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("creating client: %w", err)
		}
		e.client = c
	}
	e.execer = attempt.NewExecer(rc, e.client)
	// Per-task exponential backoff for failed passes (429, 5xx, exceeded
	// quota...), capped at 30 s so that a task blocked by a passing quota
	// shortage starts soon after it clears; plus an overall rate limit.
	limiter := workqueue.NewTypedMaxOfRateLimiter[string](
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second),
		&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(50), 300)},
	)
	e.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		limiter,
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "kubetask-executor", Clock: cfg.Clock})
	return e, nil
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// podSelector selects this instance's pods and those of instances it adopts.
func (e *Executor) podSelector() labels.Selector {
	owners := append([]string{e.cfg.InstanceID}, e.cfg.AdoptFrom...)
	managed, _ := labels.NewRequirement(task.LabelManagedBy, selection.Equals, []string{task.ManagedByValue})
	owner, _ := labels.NewRequirement(task.LabelExecutor, selection.In, owners)
	return labels.NewSelector().Add(*managed, *owner)
}

// Start runs the executor until ctx ends: it adopts what a previous instance
// left (store records and pods), starts the pod informers, waits for their
// caches and runs the workers. It returns nil when ctx ends, or an error if
// it cannot start.
func (e *Executor) Start(ctx context.Context) error {
	e.mu.Lock()
	if e.started {
		e.mu.Unlock()
		return errors.New("executor already started")
	}
	e.started = true
	e.startedAt = e.cfg.Clock.Now()
	e.mu.Unlock()
	log := e.cfg.Logger.With("executor", e.cfg.InstanceID)

	if err := e.adopt(ctx); err != nil {
		return err
	}
	namespaces := e.cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	sel := e.podSelector().String()
	e.mu.Lock()
	for _, ns := range namespaces {
		inf := e.newInformer(ns, sel)
		e.informers = append(e.informers, inf)
		e.indexers = append(e.indexers, inf.GetIndexer())
	}
	e.mu.Unlock()
	for _, inf := range e.informers {
		go inf.RunWithContext(ctx)
	}
	defer e.queue.ShutDown()
	synced := make([]cache.InformerSynced, len(e.informers))
	for i, inf := range e.informers {
		synced[i] = inf.HasSynced
	}
	log.Info("waiting for pod caches", "namespaces", namespaces, "selector", sel)
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}
	// Level-based start: every unfinished task is looked at once, whether or
	// not its pod still exists.
	recs, err := e.store.List(ctx, store.ListOptions{Executor: e.cfg.InstanceID, NonTerminal: true})
	if err != nil {
		return fmt.Errorf("listing unfinished tasks: %w", err)
	}
	for _, r := range recs {
		if r.PodCreated {
			e.holdSlot(r.ID)
		}
		e.observe(r)
		e.queue.Add(r.ID)
	}
	log.Info("executor started", "unfinished", len(recs))
	var wg sync.WaitGroup
	for i := 0; i < e.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e.processNext(ctx) {
			}
		}()
	}
	go e.resync(ctx)
	<-ctx.Done()
	e.queue.ShutDown()
	wg.Wait()
	return nil
}

// adopt takes over the unfinished tasks of the instances in AdoptFrom.
func (e *Executor) adopt(ctx context.Context) error {
	for _, from := range e.cfg.AdoptFrom {
		recs, err := e.store.List(ctx, store.ListOptions{Executor: from, NonTerminal: true})
		if err != nil {
			return fmt.Errorf("listing tasks of %s: %w", from, err)
		}
		for _, r := range recs {
			r.Executor = e.cfg.InstanceID
			if _, err := e.store.Update(ctx, r); err != nil && !errors.Is(err, store.ErrConflict) {
				return fmt.Errorf("adopting task %s: %w", r.ID, err)
			}
		}
		e.cfg.Logger.Info("adopted tasks", "from", from, "count", len(recs))
	}
	return nil
}

func (e *Executor) newInformer(ns, selector string) cache.SharedIndexInformer {
	pods := e.client.CoreV1().Pods(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			list, err := pods.List(ctx, opts)
			e.noteList(err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			if e.cfg.WatchTimeout > 0 {
				secs := int64(max(e.cfg.WatchTimeout/time.Second, 1))
				opts.TimeoutSeconds = &secs
			}
			w, err := pods.Watch(ctx, opts)
			if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
				// A streaming list (client-go's WatchListClient): the
				// informer's (re)list, counted with the LISTs.
				e.noteList(err)
				return w, err
			}
			result := "ok"
			if err != nil {
				result = "error"
			}
			e.metrics.watches.WithLabelValues(result).Inc()
			return w, err
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(lw, &corev1.Pod{}, cache.SharedIndexInformerOptions{
		ResyncPeriod: e.cfg.ResyncPeriod,
		Indexers:     cache.Indexers{runIndex: indexByRun},
	})
	_ = inf.SetTransform(func(obj any) (any, error) {
		if pod, ok := obj.(*corev1.Pod); ok {
			podstate.Trim(pod)
		}
		return obj, nil
	})
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		kind := "other"
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			kind = "expired"
		}
		e.metrics.watchErrors.WithLabelValues(kind).Inc()
		e.cfg.Logger.Info("pod watch ended, relisting", "kind", kind, "err", err)
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    e.enqueuePod,
		UpdateFunc: func(_, obj any) { e.enqueuePod(obj) },
		DeleteFunc: e.enqueuePod,
	})
	return inf
}

const runIndex = "run"

func indexByRun(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	if id := pod.Labels[task.LabelRun]; id != "" {
		return []string{id}, nil
	}
	return nil, nil
}

func (e *Executor) enqueuePod(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if id := pod.Labels[task.LabelRun]; id != "" {
		e.queue.Add(id)
	}
}

func (e *Executor) noteList(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.metrics.lists.WithLabelValues("error").Inc()
		if e.listFail.IsZero() {
			e.listFail = e.cfg.Clock.Now()
		}
		return
	}
	e.metrics.lists.WithLabelValues("ok").Inc()
	e.listFail = time.Time{}
}

// Healthy returns nil while the executor can see its pods: its informers have
// synced, or are still within LivenessTimeout of starting, and no informer
// has been failing to LIST for LivenessTimeout.
func (e *Executor) Healthy() error {
	e.mu.Lock()
	startedAt, listFail, started, informers := e.startedAt, e.listFail, e.started, e.informers
	e.mu.Unlock()
	now := e.cfg.Clock.Now()
	if !started {
		return errors.New("executor not started")
	}
	if !listFail.IsZero() && now.Sub(listFail) >= e.cfg.LivenessTimeout {
		return fmt.Errorf("pod informers cannot list since %s", listFail.Format(time.RFC3339))
	}
	for _, inf := range informers {
		if !inf.HasSynced() && now.Sub(startedAt) >= e.cfg.LivenessTimeout {
			return fmt.Errorf("pod informers not synced %s after start", now.Sub(startedAt).Round(time.Second))
		}
	}
	return nil
}

func (e *Executor) resync(ctx context.Context) {
	t := e.cfg.Clock.NewTicker(e.cfg.ResyncPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			recs, err := e.store.List(ctx, store.ListOptions{Executor: e.cfg.InstanceID, NonTerminal: true})
			if err != nil {
				e.cfg.Logger.Error("resync: listing tasks", "err", err)
				continue
			}
			for _, r := range recs {
				e.queue.Add(r.ID)
			}
		}
	}
}

// Submit accepts task t under id. It is idempotent by id: submitting an ID
// again returns the existing record and does not start another run. id must
// be a valid label value. The task is validated before anything is stored.
func (e *Executor) Submit(ctx context.Context, id string, t *task.Task) (Status, error) {
	if msgs := validation.IsValidLabelValue(id); id == "" || len(msgs) > 0 {
		return Status{}, fmt.Errorf("%w: task ID %q must be a non-empty label value (letters, digits, '-', '_', '.', at most 63): %v", ErrInvalidTask, id, msgs)
	}
	// Work on a copy: the caller's task is never modified.
	raw, err := json.Marshal(t)
	if err != nil {
		return Status{}, fmt.Errorf("encoding task: %w", err)
	}
	t = &task.Task{}
	if err := json.Unmarshal(raw, t); err != nil {
		return Status{}, fmt.Errorf("copying task: %w", err)
	}
	if t.Namespace == "" {
		t.Namespace = e.cfg.DefaultNamespace
	}
	if !e.watches(t.Namespace) {
		return Status{}, fmt.Errorf("%w: namespace %q is not one this executor watches (%v)", ErrInvalidTask, t.Namespace, e.cfg.Namespaces)
	}
	t.Default()
	if err := t.Validate(); err != nil {
		return Status{}, fmt.Errorf("%w: %w", ErrInvalidTask, err)
	}
	doc, err := json.Marshal(t)
	if err != nil {
		return Status{}, fmt.Errorf("encoding task: %w", err)
	}
	rec, created, err := e.store.Create(ctx, store.Record{
		ID: id, Namespace: t.Namespace, Name: t.Name, Executor: e.cfg.InstanceID, Task: doc,
		Phase: "Pending", Reason: "Submitted", Message: "waiting to create the pod",
	})
	if err != nil {
		return Status{}, fmt.Errorf("storing task %s: %w", id, err)
	}
	if created {
		e.observe(rec)
		e.emit(rec, false)
	}
	e.queue.Add(id)
	return rec, nil
}

func (e *Executor) watches(ns string) bool {
	if len(e.cfg.Namespaces) == 0 {
		return true
	}
	for _, n := range e.cfg.Namespaces {
		if n == ns {
			return true
		}
	}
	return false
}

// Cancel asks for task id to stop. A main container that already finished
// keeps its outcome; otherwise the task ends Failed/Cancelled and is not
// retried. Cancelling a finished task does nothing.
func (e *Executor) Cancel(ctx context.Context, id string) error {
	for {
		rec, err := e.store.Get(ctx, id)
		if err != nil {
			return fmt.Errorf("cancelling task %s: %w", id, err)
		}
		if rec.Terminal || !rec.CancelledAt.IsZero() {
			return nil
		}
		rec.CancelledAt = e.cfg.Clock.Now()
		if _, err := e.store.Update(ctx, rec); errors.Is(err, store.ErrConflict) {
			continue
		} else if err != nil {
			return fmt.Errorf("cancelling task %s: %w", id, err)
		}
		// A cancelled task never takes the slot it waits for: pass its turn on.
		e.unwait(id)
		e.queue.Add(id)
		return nil
	}
}

// Get returns the task's record.
func (e *Executor) Get(ctx context.Context, id string) (Status, error) {
	return e.store.Get(ctx, id)
}

// Client is the executor's API client (rate-limited by QPS and Burst).
func (e *Executor) Client() kubernetes.Interface { return e.client }

func (e *Executor) emit(rec store.Record, attemptFinished bool) {
	if e.cfg.OnEvent == nil {
		return
	}
	e.cfg.OnEvent(Event{
		ID: rec.ID, Attempt: rec.Attempt, Phase: rec.Phase, Reason: rec.Reason, Message: rec.Message,
		ExitCode: rec.ExitCode, AttemptFinished: attemptFinished, Terminal: rec.Terminal, Time: rec.UpdatedAt,
	})
}
