package executor

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// EventType says what an Event reports.
type EventType string

// Event types, in the order they happen to an attempt.
const (
	// EventSubmitted: the task was accepted (once per task). Its reason is
	// Submitted, or WaitingForSlot (with the limit) for a task that waits
	// for a parallelism slot from its submission.
	EventSubmitted EventType = "Submitted"
	// EventPodCreated: the executor created the attempt's pod.
	EventPodCreated EventType = "PodCreated"
	// EventPodAdopted: the attempt's pod existed already (created before a
	// restart, or by an earlier process) and belongs to the task.
	EventPodAdopted EventType = "PodAdopted"
	// EventState: the task's derived state changed (Phase, Reason, Message).
	EventState EventType = "State"
	// EventAttemptFinished: the attempt's outcome is recorded in the Store.
	// Terminal is set when it is the task's outcome; Result carries the
	// result of a Succeeded task that has one.
	EventAttemptFinished EventType = "AttemptFinished"
	// EventPodStopping: kubetask stops what still runs in a kept pod whose
	// outcome is recorded (sidecars, the result holder).
	EventPodStopping EventType = "PodStopping"
	// EventPodDeleting: kubetask deletes a pod whose outcome is recorded.
	EventPodDeleting EventType = "PodDeleting"
	// EventPodReleased: no container of the attempt's pod runs any more and
	// kubetask removed its finalizer; the pod is kept or about to be gone.
	EventPodReleased EventType = "PodReleased"
)

// Event is one change of one task.
type Event struct {
	ID      string
	Attempt int
	Type    EventType
	// Pod is the attempt's pod, "namespace/name", when it has one, and
	// PodUID its UID when the event knows it.
	Pod    string
	PodUID types.UID
	// Phase, Reason, Message and ExitCode are the task's state after the
	// change (for AttemptFinished: the attempt's outcome).
	Phase, Reason, Message string
	ExitCode               *int32
	// Result is the task's result (AttemptFinished of a Succeeded attempt).
	Result []byte
	// Delete says, on AttemptFinished, whether the cleanup policy deletes the
	// pod (otherwise it is kept, with nothing running in it).
	Delete bool
	// Terminal is set on the AttemptFinished event that records the task's
	// final outcome: exactly one per task (unless the process dies between
	// recording and delivery: the Store has it then).
	Terminal bool
	Time     time.Time
	// Cluster is the cluster of the executor that emits the event
	// (Config.Cluster; "" without one): where the attempt runs.
	Cluster string
	// Task is the task's namespace, name and labels as its record has them,
	// on Submitted events only (nil on the others), so that a consumer that
	// filters events by them need not read the record of a new task.
	Task *TaskMeta
}

// TaskMeta is what identifies a task to a person: its namespace, name and
// labels, as stored in its record.
type TaskMeta struct {
	Namespace, Name string
	Labels          map[string]string
}

// metaOf is rec's TaskMeta (its labels copied: the event outlives rec).
func metaOf(rec store.Record) *TaskMeta {
	return &TaskMeta{Namespace: rec.Namespace, Name: rec.Name, Labels: maps.Clone(rec.Labels)}
}

// Status is what Get reports about a task.
type Status = store.Record

// ErrInvalidTask wraps a task that cannot be submitted.
var ErrInvalidTask = errors.New("invalid task")

// Executor runs tasks as pods. Create it with New and run it with Start.
//
// The end of every attempt goes through one lifecycle (sync): decide from the
// pod as it is now (podstate.Derive; a decision the clock made is confirmed on
// a fresh read), wait until no container runs when someone else is stopping
// the pod, read the result, record the outcome in the Store, stop what still
// runs, release the finalizer once no container runs, delete or keep. A next
// attempt starts only once the previous attempt's pod has stopped.
type Executor struct {
	// lastPods are the ended attempts' pods that Recorder's retry events
	// go to (podevents.go).
	lastPods podRefs
	cfg      Config
	client   kubernetes.Interface
	execer   attempt.Execer
	store    store.Store
	queue    workqueue.TypedRateLimitingInterface[string]
	metrics  *metrics
	creates  chan string // task IDs whose pod creation is queued
	cleanups chan string // pod keys whose clean-up call is queued

	caches []*podCache // the current term's pod caches, one per namespace
	// indexers are the caches' indexers, read without e.mu (podIndexers).
	indexers atomic.Pointer[[]cache.Indexer]
	// waiting and unseen count the tasks in lines and the creations whose
	// pod the cache has not shown, kept with them under e.mu,
	// so that a submission can tell without e.mu that no task waits and
	// slots are free (roomAtSubmit).
	waiting, unseen atomic.Int64

	mu        sync.Mutex
	memos     map[string]*taskMemo  // by task: what a pass leaves for the next (taskMemo)
	gates     map[string]gateMemo   // scheduling-gate observations, by pod key
	failures  map[string]createFail // failed creations of the current attempt, by task
	creations map[string]*creation  // admitted pod creations, by task ID
	// unseenCr are the creations the caches have not shown yet (creations
	// whose seen is false), which usedLocked counts: kept beside creations,
	// so that counting the slots takes as many steps as there are
	// creations in flight, not as many as creations not yet forgotten.
	unseenCr map[string]*creation
	actions  map[string]*podAction // clean-up calls, by pod key
	sealed   map[string]sealing    // by task: an outcome decided on a gated pod, recorded once its deletion shows
	stopped  map[string]types.UID  // by task: the latest pod of a recorded attempt seen with nothing running (startAttempt)
	// relabelled: by task, the adopted pod this process moved to its
	// instance (relabel) while the cache still shows the earlier label.
	relabelled map[string]types.UID

	capMu     sync.Mutex
	captures  map[captureKey]*captureRun // log captures (Config.CaptureLogs)
	runCtx    context.Context            // Start's context, for captures
	lines     map[string][]waiter        // tasks waiting for a parallelism slot, by namespace, in line order
	inLine    map[string]placed          // the tasks in lines, with their place
	startedAt time.Time
	started   bool
	gate      *gate // open while this process holds the instance Lease and its caches synced

	// holder is this process's identity in the instance Lease (set once).
	holder     string
	holderOnce sync.Once

	// epoch is the fencing epoch of the current term (store.BeginTerm), 0
	// between terms: every store write of the term carries it, and every pod
	// the term creates.
	epoch atomic.Int64
	// termCtx is the current term's context (nil between terms) and endTerm
	// ends the term (a store write was fenced: a newer term began elsewhere).
	termCtx context.Context
	endTerm context.CancelCauseFunc
}

// errFenced ends a term whose store write was fenced (store.ErrFenced):
// another process began a newer term of the instance, so this one stops
// acting on pods at once, as when it loses the Lease.
var errFenced = errors.New("another process began a newer term of this executor instance")

// New validates cfg and returns an Executor.
func New(cfg Config) (*Executor, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	e := &Executor{
		cfg:        cfg,
		store:      cfg.Store,
		metrics:    newMetrics(cfg.Registerer),
		memos:      map[string]*taskMemo{},
		gates:      map[string]gateMemo{},
		failures:   map[string]createFail{},
		creations:  map[string]*creation{},
		unseenCr:   map[string]*creation{},
		lines:      map[string][]waiter{},
		inLine:     map[string]placed{},
		creates:    make(chan string, cfg.Parallelism),
		cleanups:   make(chan string, cfg.Parallelism),
		actions:    map[string]*podAction{},
		sealed:     map[string]sealing{},
		stopped:    map[string]types.UID{},
		relabelled: map[string]types.UID{},
		captures:   map[captureKey]*captureRun{},
		runCtx:     context.Background(),
		gate:       newGate(cfg.Clock),
	}
	e.client = cfg.Client
	var rc *rest.Config
	if cfg.RESTConfig != nil {
		rc = countingConfig(cfg.RESTConfig, cfg.QPS, cfg.Burst, e.metrics.apiRequests)
	}
	if e.client == nil && rc != nil {
		c, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("creating client: %w", err)
		}
		e.client = c
	}
	e.execer = cfg.Execer
	if e.execer == nil && e.client != nil {
		e.execer = attempt.NewExecer(rc, e.client)
	}
	// Per-task exponential backoff for failed passes (429, 5xx, exceeded
	// quota...), capped at 30 s so that a task blocked by a passing quota
	// shortage starts soon after it clears; plus an overall rate limit.
	limiter := workqueue.NewTypedMaxOfRateLimiter[string](
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second),
		&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(50), 300)},
	)
	// A RecordOnly executor never starts, so nothing would shut its queue
	// down: it has none (a queue's goroutine would outlive it).
	if !cfg.RecordOnly {
		const name = "kubetask-executor"
		queue := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: name, Clock: cfg.Clock, Queue: &fifo[string]{}})
		e.queue = workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{
			Name: name, Clock: cfg.Clock,
			DelayingQueue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Name: name, Clock: cfg.Clock, Queue: queue}),
		})
	}
	return e, nil
}

// Start runs the executor until ctx ends. It takes the instance Lease
// (waiting, and logging who holds it, while another process runs the same
// InstanceID), adopts what the instances in AdoptFrom left, starts the pod
// caches, runs OnLeading while they list, waits for them to sync and lets
// the workers run.
// When the Lease cannot be renewed (the API server unreachable for longer than
// RenewDeadline, or another process took it), the workers stop acting on pods
// at once and Start takes the Lease again before they resume from the state
// as it then is. It returns nil when ctx ends, or the error of OnLeading or of
// the start.
func (e *Executor) Start(ctx context.Context) error {
	if e.cfg.RecordOnly {
		return errors.New("a RecordOnly executor does not start")
	}
	e.mu.Lock()
	if e.started {
		e.mu.Unlock()
		return errors.New("executor already started")
	}
	e.started = true
	e.startedAt = e.cfg.Clock.Now()
	e.runCtx = ctx
	e.mu.Unlock()
	log := e.cfg.Logger.With("executor", e.cfg.InstanceID)

	// The workers, creators and cleaners end with Start, also when it
	// returns an error while ctx goes on: a creator or cleaner parked on its
	// channel since an earlier term waits for its context, not the gate.
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := 0; i < e.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e.processNext(wctx) {
			}
		}()
	}
	for i := 0; i < e.cfg.CreateConcurrency; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			e.runCreator(wctx)
		}()
		go func() {
			defer wg.Done()
			e.runCleaner(wctx)
		}()
	}
	e.metrics.queue.add(e) // its tasks are counted while it runs
	defer e.metrics.queue.remove(e)
	defer func() {
		stop()
		e.queue.ShutDown()
		e.gate.stop()
		wg.Wait()
	}()
	go e.resync(wctx)
	for {
		err := e.holdLease(ctx, e.term)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrLeaseLost):
			log.Warn("stopped acting on pods until the instance lease is held again")
		case errors.Is(err, errFenced):
			log.Warn("stopped acting on pods: another process began a newer term of this instance (its store writes fence this one's); waiting for the instance lease")
		default:
			return err
		}
	}
}

// term is the executor's life while it holds the instance Lease: the pod
// caches run and the gate lets the workers and creators act. When ctx
// ends (the Lease is lost or Start's context ended), the gate closes and term
// returns once no sync or creation is in flight.
//
// A term begins with store.BeginTerm: from then on a write of an earlier
// term (of this process or another) is refused by the store, and every
// write and pod of this term carries its epoch (docs/executor.md, "The
// fence"). A store error at the start is retried with a back-off until ctx
// ends: a store that is down for a while delays the term, it never ends the
// executor.
func (e *Executor) term(ctx context.Context) error {
	log := e.cfg.Logger.With("executor", e.cfg.InstanceID)
	ctx, end := context.WithCancelCause(ctx)
	defer end(nil)
	epoch, err := retryStore(ctx, log, "beginning a term", func(ctx context.Context) (int64, error) {
		return e.store.BeginTerm(ctx, e.cfg.InstanceID)
	})
	if err != nil {
		return nil // ctx ended
	}
	e.mu.Lock()
	e.termCtx, e.endTerm = ctx, end
	e.mu.Unlock()
	e.epoch.Store(epoch)
	defer func() {
		e.epoch.Store(0)
		e.mu.Lock()
		e.termCtx, e.endTerm = nil, nil
		e.mu.Unlock()
	}()
	log.Info("began a term", "epoch", epoch)
	if _, err := retryStore(ctx, log, "adopting tasks", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, e.adopt(ctx)
	}); err != nil {
		return e.termEnd(ctx)
	}
	caches, namespaces := e.startPodCaches(ctx)
	// OnLeading runs while the caches list: no worker acts before both
	// are done, and neither waits for the other's requests.
	if e.cfg.OnLeading != nil {
		if err := e.cfg.OnLeading(ctx); err != nil {
			return err
		}
	}
	synced := make([]cache.DoneChecker, len(caches))
	for i, c := range caches {
		synced[i] = c.syncedChecker()
	}
	log.Info("waiting for pod caches", "namespaces", namespaces, "selector", e.podSelector().String())
	// Woken by the caches themselves: WaitForCacheSync would poll them
	// every 100 ms, a third of a short `kubetask run`.
	if !cache.WaitFor(ctx, "", synced...) {
		return e.termEnd(ctx)
	}
	// Level-based start: every unfinished task is looked at once, whether or
	// not its pod still exists.
	recs, err := retryStore(ctx, log, "listing unfinished tasks", func(ctx context.Context) ([]store.Record, error) {
		return e.store.List(ctx, store.ListOptions{Executor: e.cfg.InstanceID, NonTerminal: true})
	})
	if err != nil {
		return e.termEnd(ctx)
	}
	now := e.cfg.Clock.Now()
	for _, r := range recs {
		if !r.PodCreated && r.CancelledAt.IsZero() && !r.NextAttemptAt.After(now) {
			e.enlist(r, priorityOf(r.Task))
		}
		e.observe(r.ID, r.Namespace, r.Phase, r.Reason, false)
		e.queue.Add(r.ID)
	}
	e.gate.open()
	log.Info("executor started", "unfinished", len(recs), "epoch", epoch)
	<-ctx.Done()
	e.gate.close() // waits until no sync or creation is in flight
	e.dropPendingCreations()
	return e.termEnd(ctx)
}

// termEnd is what term returns once its ctx ended: errFenced when a fenced
// write ended it, nil otherwise (the Lease was lost, or Start's context
// ended, which holdLease reports).
func (e *Executor) termEnd(ctx context.Context) error {
	if errors.Is(context.Cause(ctx), errFenced) {
		return errFenced
	}
	return nil
}

// update writes rec fenced by the current term's epoch (store.Record.Epoch).
// A write refused as fenced ends the term: another process began a newer
// one of this instance.
func (e *Executor) update(ctx context.Context, rec store.Record) (store.Record, error) {
	rec.Epoch = e.epoch.Load()
	if rec.Epoch == 0 {
		return rec, fmt.Errorf("task record %s: %w (between terms)", rec.ID, store.ErrFenced)
	}
	out, err := e.store.Update(ctx, rec)
	if errors.Is(err, store.ErrFenced) {
		e.endFencedTerm(rec.Epoch, "a store write was fenced", "task", rec.ID)
	}
	return out, err
}

// endFencedTerm ends the current term, if its epoch is epoch, because the
// store showed that another process began a newer term of the instance
// (a write refused as fenced, a claim check that found a newer epoch): the
// term can write nothing any more, and only a new term (a new epoch, once
// the Lease is held) can act. The Lease alone does not tell: a Lease this
// process could not renew for a while and that another process held and
// released meanwhile is renewed again as if it had never been lost.
func (e *Executor) endFencedTerm(epoch int64, why string, args ...any) {
	e.mu.Lock()
	end := e.endTerm
	e.mu.Unlock()
	if end != nil && e.epoch.Load() == epoch {
		e.cfg.Logger.Warn(why+": a newer term of this executor instance began; ending this term",
			append([]any{"executor", e.cfg.InstanceID, "epoch", epoch}, args...)...)
		end(errFenced)
	}
}

// termContext is the current term's context: calls made with it end when
// the term does. Between terms it is an ended context.
func (e *Executor) termContext() context.Context {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.termCtx == nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	return e.termCtx
}

// storeRetry is the back-off of the store calls that start a term.
var storeRetry = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Cap: 10 * time.Second, Steps: math.MaxInt32}

// retryStore calls fn until it succeeds or ctx ends (then ctx's error),
// logging each failure, with storeRetry's back-off between calls.
func retryStore[T any](ctx context.Context, log *slog.Logger, what string, fn func(context.Context) (T, error)) (T, error) {
	var out T
	err := wait.ExponentialBackoffWithContext(ctx, storeRetry, func(ctx context.Context) (bool, error) {
		v, err := fn(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("store call failed; retrying", "what", what, "err", err)
			}
			return false, nil
		}
		out = v
		return true, nil
	})
	return out, err
}

// adopt takes over the unfinished tasks of the instances in AdoptFrom.
func (e *Executor) adopt(ctx context.Context) error {
	for _, from := range e.cfg.AdoptFrom {
		recs, err := e.store.List(ctx, store.ListOptions{Executor: from, NonTerminal: true})
		if err != nil {
			return fmt.Errorf("listing tasks of %s: %w", from, err)
		}
		for _, r := range recs {
			if err := e.adoptOne(ctx, from, r); err != nil {
				return err
			}
		}
		e.cfg.Logger.Info("adopted tasks", "from", from, "count", len(recs))
	}
	return nil
}

// adoptOne moves task r, unfinished and of instance from when listed, to
// this instance. A conflict (the record changed since the list: a user's
// cancellation, a write of from's last process) is not the end of it: the
// record is read again and moved while it is still from's and unfinished,
// since no other process will ever run a task left to a gone instance (the
// simulator's seed 1323: a task cancelled as it was adopted stayed with the
// gone instance, never finished).
func (e *Executor) adoptOne(ctx context.Context, from string, r store.Record) error {
	for {
		r.Executor = e.cfg.InstanceID
		_, err := e.update(ctx, r)
		if !errors.Is(err, store.ErrConflict) {
			if err != nil {
				return fmt.Errorf("adopting task %s: %w", r.ID, err)
			}
			return nil
		}
		cur, err := e.store.Get(ctx, r.ID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil
		case err != nil:
			return fmt.Errorf("adopting task %s: %w", r.ID, err)
		case cur.Executor != from || cur.Terminal:
			return nil
		}
		r = cur
	}
}

func (e *Executor) processNext(ctx context.Context) bool {
	if !e.gate.wait(ctx) {
		return false
	}
	id, quit := e.queue.Get()
	if quit {
		return false
	}
	defer e.queue.Done(id)
	if !e.gate.enter() {
		e.queue.AddRateLimited(id) // the Lease was lost meanwhile: later
		return true
	}
	defer e.gate.leave()
	start := time.Now()
	after, err := e.sync(ctx, id)
	e.metrics.reconcile.Observe(time.Since(start).Seconds())
	switch {
	case err == nil:
		e.queue.Forget(id)
		if after > 0 {
			e.queue.AddAfter(id, after)
		}
	case ctx.Err() != nil:
	default:
		e.cfg.Logger.Info("reconcile failed, retrying", "task", id, "err", err)
		e.queue.AddRateLimited(id)
	}
	return true
}

// noteList counts a list of a pod cache.
func (e *Executor) noteList(err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	e.metrics.lists.WithLabelValues(result).Inc()
}

// Healthy returns nil while the executor can see its pods: its pod caches
// have synced, or are still within LivenessTimeout of starting, no cache has
// been blind (failing to LIST or WATCH since its last success) for
// LivenessTimeout, and the executor has not stopped acting on pods for
// LivenessTimeout. A failure the next try recovers from (a 410 Expired, a
// dropped connection) never makes it fail.
func (e *Executor) Healthy() error {
	e.mu.Lock()
	startedAt, started, caches := e.startedAt, e.started, e.caches
	e.mu.Unlock()
	now := e.cfg.Clock.Now()
	if !started {
		return errors.New("executor not started")
	}
	for _, c := range caches {
		if since, err := c.blind(); !since.IsZero() && now.Sub(since) >= e.cfg.LivenessTimeout {
			return fmt.Errorf("pod cache of %s cannot list or watch pods since %s: %w", namespaceName(c.namespace), since.Format(time.RFC3339), err)
		}
	}
	if closedSince := e.gate.closedSince(); !closedSince.IsZero() && now.Sub(maxTime(closedSince, startedAt)) >= e.cfg.LivenessTimeout {
		return fmt.Errorf("not acting on pods since %s: waiting for the instance lease %s/%s or for the pod caches", closedSince.Format(time.RFC3339), e.cfg.LeaseNamespace, LeaseName(e.cfg.InstanceID))
	}
	for _, c := range caches {
		if !c.HasSynced() && now.Sub(startedAt) >= e.cfg.LivenessTimeout {
			return fmt.Errorf("pod cache of %s not synced %s after start", namespaceName(c.namespace), now.Sub(startedAt).Round(time.Second))
		}
	}
	return nil
}

// Ready reports whether the executor acts on pods now: it holds its instance
// Lease and its pod caches have synced (a service's readiness).
func (e *Executor) Ready() bool { return e.gate.closedSince().IsZero() }

func (e *Executor) resync(ctx context.Context) {
	t := e.cfg.Clock.NewTicker(e.cfg.ResyncPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			if err := e.ResyncAll(ctx); err != nil {
				e.cfg.Logger.Error("resync", "err", err)
			}
		}
	}
}

// Resync makes the executor look at task id again soon (a task another
// process submitted or cancelled through the shared Store, or one whose Hold
// answer changed). A RecordOnly executor ignores it.
func (e *Executor) Resync(id string) {
	if !e.cfg.RecordOnly {
		e.queue.Add(id)
	}
}

// ResyncAll makes the executor look at every unfinished task of its
// instance again (after a gap in store.Changes).
func (e *Executor) ResyncAll(ctx context.Context) error {
	if e.cfg.RecordOnly {
		return nil
	}
	recs, err := e.store.List(ctx, store.ListOptions{Executor: e.cfg.InstanceID, NonTerminal: true})
	if err != nil {
		return fmt.Errorf("listing unfinished tasks: %w", err)
	}
	for _, r := range recs {
		e.queue.Add(r.ID)
	}
	return nil
}

// SubmitOption changes how Submit records a new task.
type SubmitOption func(*store.Record)

// FirstAttempt makes the task's first attempt number n instead of 0. When
// the pod of attempt n exists already and carries the task's identity, the
// executor adopts it instead of creating one (kubetask run uses it to attach
// to the pod of a run an earlier process started).
func FirstAttempt(n int) SubmitOption {
	return func(r *store.Record) { r.Attempt = max(n, 0) }
}

// AttachPod makes the task's current attempt the existing pod of that
// attempt, recorded by its UID, nonce and epoch annotations, instead of one
// the executor creates: for a caller that found the pod of a run that an
// earlier process started and checked it is the task's (kubetask run's
// attach, under the instance Lease). Use it with FirstAttempt.
func AttachPod(pod *corev1.Pod) SubmitOption {
	return func(r *store.Record) {
		r.PodCreated, r.PodUID, r.Nonce = true, string(pod.UID), pod.Annotations[task.AnnotationNonce]
		r.PodEpoch, _ = strconv.ParseInt(pod.Annotations[task.AnnotationEpoch], 10, 64)
		r.Phase, r.Reason, r.Message = string(podstate.Pending), string(podstate.ReasonScheduling), "attached to pod "+pod.Name
	}
}

// Origin records that the task reruns task id.
func Origin(id string) SubmitOption {
	return func(r *store.Record) { r.Origin = id }
}

// SubmittedBy records who submitted the task; every pod of the task carries
// it in its task.AnnotationSubmittedBy annotation, so that cluster policies
// and audits see the submitter, not only the executor's identity.
func SubmittedBy(a store.Actor) SubmitOption {
	return func(r *store.Record) { r.SubmittedBy = a }
}

// CancelOption changes how Cancel records a cancellation.
type CancelOption func(*store.Record)

// CancelledBy records who asked for the cancellation (kept only by the call
// that cancels the task: a later one changes nothing).
func CancelledBy(a store.Actor) CancelOption {
	return func(r *store.Record) { r.CancelledBy = a }
}

// Submit accepts task t under id. It is idempotent by id: submitting an ID
// again returns the existing record and does not start another run. id is
// any ID task.ValidateID accepts (its pods carry it exactly in an annotation,
// and a label-safe value derived from it in their labels). The task is
// validated before anything is stored.
// Submit may be called before Start; the task then runs once Start holds the
// instance Lease.
func (e *Executor) Submit(ctx context.Context, id string, t *task.Task, opts ...SubmitOption) (Status, error) {
	rec, _, err := e.SubmitCreated(ctx, id, t, opts...)
	return rec, err
}

// SubmitCreated is Submit that also reports whether this call created the
// task's record. The store decides it atomically: of concurrent submissions
// of one ID, exactly one gets true, and the others get the record it
// stored (whose document may differ from theirs: compare to tell a retry
// from a conflict).
func (e *Executor) SubmitCreated(ctx context.Context, id string, t *task.Task, opts ...SubmitOption) (Status, bool, error) {
	if err := task.ValidateID(id); err != nil {
		return Status{}, false, fmt.Errorf("%w: task ID %q: %w", ErrInvalidTask, id, err)
	}
	t = t.DeepCopy() // the caller's task is never modified
	if t.Namespace == "" {
		t.Namespace = e.cfg.DefaultNamespace
	}
	if !e.watches(t.Namespace) {
		return Status{}, false, fmt.Errorf("%w: namespace %q is not one this executor watches (%v)", ErrInvalidTask, t.Namespace, e.cfg.Namespaces)
	}
	t.Default()
	if err := t.Validate(); err != nil {
		return Status{}, false, fmt.Errorf("%w: %w", ErrInvalidTask, err)
	}
	traceStart := e.cfg.Tracer.stamp(ctx, t, originOf(opts), e.cfg.Clock.Now())
	doc, err := json.Marshal(t)
	if err != nil {
		return Status{}, false, fmt.Errorf("encoding task: %w", err)
	}
	rec := store.Record{
		ID: id, Namespace: t.Namespace, Name: t.Name, Executor: e.cfg.InstanceID, Cluster: e.cfg.Cluster, Task: doc, Labels: t.Labels,
		Phase: "Pending", Reason: "Submitted", Message: "waiting to create the pod", Nonce: newNonce(),
	}
	for _, o := range opts {
		o(&rec)
	}
	if !e.cfg.RecordOnly && !rec.PodCreated {
		if why := e.waitAtSubmit(rec, t.Spec.Priority); why != "" {
			rec.Reason, rec.Message = reasonWaitingForSlot, why
		}
	}
	rec, created, err := e.store.Create(ctx, rec)
	if err != nil {
		return Status{}, false, fmt.Errorf("storing task %s: %w", id, err)
	}
	if created {
		e.cfg.Tracer.submitted(ctx, rec, t, traceStart, e.cfg.Clock.Now(), !e.cfg.RecordOnly)
	}
	if e.cfg.RecordOnly {
		if created {
			e.emit(Event{ID: rec.ID, Attempt: rec.Attempt, Type: EventSubmitted, Phase: rec.Phase, Reason: rec.Reason, Message: rec.Message, Time: rec.UpdatedAt, Task: metaOf(rec)})
		}
		return rec, created, nil
	}
	if created {
		e.enlist(rec, t.Spec.Priority)
		e.observe(rec.ID, rec.Namespace, rec.Phase, rec.Reason, false)
		e.emit(Event{ID: rec.ID, Attempt: rec.Attempt, Type: EventSubmitted, Phase: rec.Phase, Reason: rec.Reason, Message: rec.Message, Time: rec.UpdatedAt, Task: metaOf(rec)})
		if rec.PodCreated { // AttachPod: the attempt's pod is the caller's
			ident := task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Executor: e.cfg.InstanceID, Nonce: rec.Nonce}
			e.emit(Event{ID: rec.ID, Attempt: rec.Attempt, Type: EventPodAdopted, Pod: rec.Namespace + "/" + task.PodName(ident, rec.Attempt),
				Phase: rec.Phase, Reason: rec.Reason, Message: rec.Message, Time: rec.UpdatedAt})
		}
	}
	e.queue.Add(id)
	return rec, created, nil
}

// originOf is the origin opts record (Origin), "" for none.
func originOf(opts []SubmitOption) string {
	var r store.Record
	for _, o := range opts {
		o(&r)
	}
	return r.Origin
}

// newNonce returns a record's nonce: 80 random bits, in lower-case base32.
func newNonce() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return strings.ToLower(base32.StdEncoding.EncodeToString(b))
}

func (e *Executor) watches(ns string) bool {
	return len(e.cfg.Namespaces) == 0 || slices.Contains(e.cfg.Namespaces, ns)
}

// Cancel asks for task id to stop. A main container that already finished
// keeps its outcome; otherwise the task ends Failed/Cancelled and is not
// retried. Cancelling a finished task does nothing.
func (e *Executor) Cancel(ctx context.Context, id string, opts ...CancelOption) error {
	for {
		rec, err := e.store.Get(ctx, id)
		if err != nil {
			return fmt.Errorf("cancelling task %s: %w", id, err)
		}
		if rec.Terminal || !rec.CancelledAt.IsZero() {
			return nil
		}
		rec.CancelledAt = e.cfg.Clock.Now()
		for _, o := range opts {
			o(&rec)
		}
		// The user's write, not a term's: it carries no epoch, so whichever
		// term last wrote the record does not refuse it (the version's
		// compare-and-swap still orders it with the terms' writes).
		rec.Epoch = 0
		if _, err := e.store.Update(ctx, rec); errors.Is(err, store.ErrConflict) {
			continue
		} else if err != nil {
			return fmt.Errorf("cancelling task %s: %w", id, err)
		}
		if e.cfg.RecordOnly {
			return nil
		}
		// A cancelled task never takes the slot it waits for.
		e.unwait(id)
		e.queue.Add(id)
		return nil
	}
}

// Get returns the task's record, with the latest derived state of an
// unfinished task (progress is kept in memory, not written to the Store);
// a task waiting for a slot says which limit it waits for now.
func (e *Executor) Get(ctx context.Context, id string) (Status, error) {
	rec, err := e.store.Get(ctx, id)
	if err != nil {
		return rec, err
	}
	if !rec.Terminal {
		e.mu.Lock()
		var p progress
		m := e.memos[id]
		ok := m != nil && m.hasLive
		if ok {
			p = m.live
		}
		e.mu.Unlock()
		if ok && p.attempt == rec.Attempt {
			rec.Phase, rec.Reason, rec.Message, rec.ExitCode = p.phase, p.reason, p.message, p.exitCode
			if p.reason == reasonWaitingForSlot {
				if msg := e.waitingFor(id); msg != "" {
					rec.Message = msg
				}
			}
		}
	}
	return rec, nil
}

// Client is the executor's API client (rate-limited by QPS and Burst).
func (e *Executor) Client() kubernetes.Interface { return e.client }

// CachedPod returns what the pod cache keeps of a pod this executor watches,
// or nil when the cache does not have it. The cache keeps, to hold little
// memory per pod, only what the executor decides from, and the pod returned
// has only these fields set:
//
//   - metadata: namespace, name, resourceVersion, creationTimestamp,
//     deletionTimestamp, deletionGracePeriodSeconds, finalizers, and
//     kubetask's own labels and annotations (task.PodLabels, the identity
//     annotations BuildPod sets, task.LabelReleased); not the template's
//     labels and annotations nor anyone else's, no uid, ownerReferences or
//     managedFields;
//   - spec: nodeName, restartPolicy, activeDeadlineSeconds, the names of the
//     schedulingGates, and per container and init container its name,
//     image, restartPolicy and restartPolicyRules;
//   - status: phase, reason, message, startTime, the PodScheduled and
//     DisruptionTarget conditions (type, status, reason, message,
//     lastTransitionTime), and per container and init container status its
//     name, restartCount, state and lastState (waiting: reason, message;
//     running: startedAt; terminated: exitCode, reason, message, startedAt,
//     finishedAt).
//
// This is everything podstate.Derive and podlog.ProgressOf read. Each call
// returns a new pod, which shares memory with the cache: never modify it.
// Read the pod from the API server for anything else.
func (e *Executor) CachedPod(namespace, name string) *corev1.Pod {
	for _, idx := range e.podIndexers() {
		if obj, ok, err := idx.GetByKey(namespace + "/" + name); err == nil && ok {
			if p, ok := obj.(*cachedPod); ok {
				return p.pod()
			}
		}
	}
	return nil
}

func (e *Executor) emit(ev Event) {
	if e.cfg.OnEvent == nil && e.cfg.Recorder == nil && e.cfg.Tracer == nil {
		return
	}
	if ev.Time.IsZero() {
		ev.Time = e.cfg.Clock.Now()
	}
	e.cfg.Tracer.event(ev)
	if ev.Cluster == "" {
		ev.Cluster = e.cfg.Cluster
	}
	if e.cfg.Recorder != nil {
		e.tellPod(ev)
	}
	if e.cfg.OnEvent != nil {
		e.cfg.OnEvent(ev)
	}
}

// observe keeps the kubetask_tasks gauge (the tasks this process has seen,
// by their latest phase, terminal phases included) and the task's class
// (namespace, phase, reason), which kubetask_tasks_queued and
// kubetask_pending_tasks count at scrape time. It is called when the
// task's phase or reason changes, never at a pass that changes neither.
func (e *Executor) observe(id, namespace, phase, reason string, terminal bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.memos[id]
	if m != nil && m.hasPhase {
		_, was, _ := m.phase.split()
		if was == phase && !terminal {
			m.phase = taskClass(namespace, phase, reason)
			return
		}
		e.metrics.tasks.WithLabelValues(was).Dec()
	}
	e.metrics.tasks.WithLabelValues(phase).Inc()
	if terminal {
		if m != nil { // final: nothing will move it again
			m.phase, m.hasPhase = interned{}, false
			e.tidyMemoLocked(id, m)
		}
		return
	}
	m = e.memoLocked(id)
	m.phase, m.hasPhase = taskClass(namespace, phase, reason), true
}

// disown stops counting task id, another instance's now (moved to another
// cluster or instance), in the gauges of the tasks this process runs.
func (e *Executor) disown(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.memos[id]
	if m == nil || !m.hasPhase {
		return
	}
	_, was, _ := m.phase.split()
	e.metrics.tasks.WithLabelValues(was).Dec()
	m.phase, m.hasPhase = interned{}, false
	e.tidyMemoLocked(id, m)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
