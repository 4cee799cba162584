package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// backoffReset is how long a list-and-watch cycle must stay up for the
// pod cache's back-off to start again from its first step.
const backoffReset = 10 * time.Second

// podCache is a cache of the pods one LIST+WATCH selects, built from
// client-go's parts as a SharedIndexInformer is (a Reflector feeding a
// RealFIFO, one goroutine popping each change into an Indexer and handing it
// to the handler), with what the informer does not let one set: its own
// back-off between list-and-watch cycles, a watch error handler, and a record
// of whether it can see the API server.
//
// Guarantees:
//   - The indexer holds the pods as of the last change popped, transformed;
//     the handler is called after the indexer changed, from one goroutine, in
//     the order of the API server's changes: OnAdd for a pod new to the
//     cache, OnUpdate for a changed pod and for every cached pod at each
//     resync, OnDelete with the pod or a cache.DeletedFinalStateUnknown
//     (a pod a relist no longer found). A relist that finds a pod unchanged
//     (same resourceVersion) does not call the handler, as an informer's
//     handler between resyncs is not called.
//   - After a failed or ended list-and-watch cycle (410 Expired, a refused
//     connection, an API server restart) the Reflector lists and watches
//     again after the back-off: its first step, then doubling (by Factor),
//     never longer than Cap, jitter included. The back-off starts again from
//     its first step after a cycle that stayed up for backoffReset, and
//     after a live one: its watch delivered a change after its list, or its
//     LIST brought news (a pod new to the cache, changed, or gone) and no
//     request of it failed. So a 410 storm costs each ended watch one relist
//     after the first step, not after the cap, also when no watch gets to
//     deliver anything before it expires (the cache then sees through its
//     LISTs only), while a server that refuses requests, or ends every watch
//     while nothing changes, is listed ever less often. The
//     Reflector's own retries of a refused WATCH (within a cycle) take the
//     same steps, started again by client-go every 2 minutes.
//   - The first list of a cache may be a streaming list (client-go's
//     watch-list, where the server offers it: one pod decoded at a time);
//     every later one, after a watch ended or failed, is a LIST, whose pods
//     reach the handler before the next WATCH request is sent. A streaming
//     list is a WATCH: it waits as long as the server takes to answer
//     watches, hands nothing over before its initial-events-end bookmark,
//     and nothing at all when the connection is cut before it; a cache that
//     relists knows it is behind, and what it lists must be acted on at
//     once (issue 19: through a 410 storm with slow WATCH answers, finished
//     pods waited for the watch, not for the list).
//   - Storm lists (issue 19): for stormWindow after a watch the server
//     ended with 410 Expired, a WATCH request left unanswered is not waited
//     on alone: stormListEvery
//     (plus up to stormListJitter of it) after the cache's last LIST, the
//     cache LISTs (a consistent read, resourceVersion "") and hands the pods
//     it holds at an older resourceVersion, or not at all, to the handler,
//     as a relist does, while the WATCH request still waits; each LIST
//     without news doubles the wait, and one WATCH request gets at most
//     stormListsPerWatch of them (pods gone are left to the relist or the
//     watch). The WATCH request's answer is handed to the Reflector only
//     once its storm lists are queued (one sent before the answer is waited
//     on for up to stormListEvery, then cut and dropped), so the watch's
//     events always follow what such a LIST handed over, and
//     the Reflector's next relist reads at least as new a resourceVersion
//     as it. A server that is only slow to answer watches, with no 410,
//     gets no storm lists; in a 410 storm whose WATCH answers take longer
//     than the back-off's first step, the cache still sees every change
//     within about stormListEvery.
//   - No pod moves backwards: a change (a watch event, a relist's pod)
//     older than the cached pod (resourceVersions compared as integers,
//     where both are) is dropped, as a storm list may bring a pod newer
//     than the events of a watch answered after it.
//   - The cache is blind from the first failed LIST, WATCH request or
//     list-and-watch cycle after its last success until the next successful
//     LIST or WATCH request (blind reports it; the Blind gauge is 1 meanwhile).
//     A watch the server ends, with 410 Expired or otherwise, is not a
//     failure: the cache is current up to then and lists again within the
//     back-off; that list failing is.
type podCache struct {
	namespace string
	opts      podCacheOptions
	indexer   cache.Indexer
	fifo      *cache.RealFIFO
	reflector *cache.Reflector
	lw        *cache.ListWatch // what the Reflector lists and watches with
	delay     relistDelay

	// relisting is set once the first list-and-watch cycle ended: from then
	// on a streaming list is refused (errListInstead).
	relisting atomic.Bool
	// listNews is set by a LIST that brought news, until its cycle ends.
	listNews atomic.Bool
	inner    *cache.ListWatch // the ListerWatcher the cache was made with: storm lists use it

	stormMu sync.Mutex // guards storm and floor
	storm   stormLists
	// floor is the resourceVersion of the last storm list handed over: the
	// Reflector's relists read at least as new a state.
	floor string

	mu       sync.Mutex
	blindAt  time.Time // first failure since the last success; zero while it sees the API server
	blindErr error     // the latest failure
}

// errListInstead refuses a streaming list after the cache's first cycle,
// before any request is sent: client-go's Reflector then falls back to a
// LIST, from its last resourceVersion, as it does when the server does not
// offer streaming lists.
var errListInstead = errors.New("relisting with a LIST, not a streaming list")

// podCacheOptions configure a podCache.
type podCacheOptions struct {
	// Namespace is the namespace the ListerWatcher lists, for logs and
	// metrics ("" is all namespaces).
	Namespace string
	// Client is the client behind the ListerWatcher: it tells client-go
	// whether streaming lists can be used (a fake clientset cannot).
	Client any
	// Transform, when set, changes each object before it is cached. It
	// must return a pod or a *cachedPod (the only objects the key function
	// knows besides tombstones) and return a *cachedPod unchanged.
	Transform cache.TransformFunc
	// Handler receives the cache's changes; it must not block.
	Handler cache.ResourceEventHandler
	// ResyncPeriod, when set, calls Handler.OnUpdate for every cached pod
	// this often.
	ResyncPeriod time.Duration
	// Backoff is the back-off between list-and-watch cycles: a validated
	// Config.WatchBackoff (Cap bounds each delay, jitter included).
	Backoff wait.Backoff
	// OnWatchError, when set, is called with each failed list-and-watch
	// cycle's error, before the back-off.
	OnWatchError func(ctx context.Context, r *cache.Reflector, err error)
	// OnExpired, when set, is called for each watch the server ends with
	// 410 Expired (or Gone) in its stream: client-go's Reflector ends the
	// cycle without an error then, so OnWatchError does not see it.
	OnExpired func()
	// Blind counts the cache while it is blind.
	Blind prometheus.Gauge
	// Clock times blindness (the executor's, injected in tests).
	Clock clock.Clock
	// ReflectorClock drives the Reflector and the back-off between cycles.
	// Default the real clock, as an informer's: a fake Clock that a test
	// steps at will must not stall a watch that is retried or resynced.
	ReflectorClock clock.WithTicker
	// StormListEvery is the first wait of the storm lists (stormListEvery
	// when zero; tests shorten it).
	StormListEvery time.Duration
	Logger         *slog.Logger
}

// newPodCache returns a podCache over lw; Run runs it.
func newPodCache(lw *cache.ListWatch, o podCacheOptions) *podCache {
	c := &podCache{namespace: o.Namespace, opts: o, inner: lw, storm: newStormLists()}
	c.indexer = newPodIndexer()
	c.fifo = cache.NewRealFIFOWithOptions(cache.RealFIFOOptions{
		Name:         "pods " + namespaceName(o.Namespace),
		KeyFunction:  podKey,
		KnownObjects: c.indexer,
		Transformer:  o.Transform,
	})
	// Every request goes through observed, which sees every failure and
	// every success.
	observed := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.ResourceVersion = c.relistVersion(opts)
			list, err := lw.ListWithContext(ctx, opts)
			c.observe(ctx, err)
			news := err == nil && c.hasNews(opts, list)
			if news {
				c.listNews.Store(true)
			}
			if err == nil && opts.Continue == "" {
				c.stormMu.Lock()
				c.storm.listed(c.opts.ReflectorClock.Now(), news)
				c.stormMu.Unlock()
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			streaming := opts.SendInitialEvents != nil && *opts.SendInitialEvents
			if streaming && c.relisting.Load() {
				return nil, errListInstead // not a failure: nothing was asked
			}
			answered := func() {}
			if !streaming {
				answered = c.listWhileUnanswered(ctx)
			}
			w, err := lw.WatchWithContext(ctx, opts)
			answered()
			c.observe(ctx, err)
			if err != nil {
				if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					c.stormMu.Lock()
					c.storm.expired(c.opts.ReflectorClock.Now())
					c.stormMu.Unlock()
				}
				return w, err
			}
			return filterWatch(w, c.watchEvents(streaming)), nil
		},
		DisableChunking: lw.DisableChunking,
	}
	if o.ReflectorClock == nil {
		o.ReflectorClock = clock.RealClock{}
	}
	if o.StormListEvery == 0 {
		o.StormListEvery = stormListEvery
	}
	c.storm.every, c.storm.wait = o.StormListEvery, o.StormListEvery
	c.opts, c.lw = o, observed
	b := reflectorBackoff(o.Backoff)
	c.delay = relistDelay{clock: o.ReflectorClock, initial: b, current: b}
	// The wrapper tells client-go whether the client supports streaming
	// lists.
	c.reflector = cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(observed, o.Client), &corev1.Pod{}, c.fifo, cache.ReflectorOptions{
		Name:         "pods " + namespaceName(o.Namespace),
		ResyncPeriod: o.ResyncPeriod,
		Clock:        o.ReflectorClock,
		Backoff:      &b,
	})
	o.Blind.Add(0) // the series exists from the start
	return c
}

// reflectorBackoff is b in the terms of wait.Backoff: there the jitter comes
// on top of a step and Cap ends the growth only while Steps remain, so the
// cap is lowered to leave room for the jitter and Steps is unlimited.
func reflectorBackoff(b wait.Backoff) wait.Backoff {
	b.Cap = time.Duration(float64(b.Cap) / (1 + b.Jitter))
	b.Duration = min(b.Duration, b.Cap)
	b.Steps = math.MaxInt32
	return b
}

// Run lists and watches, and keeps the indexer and the handler up to date,
// until ctx ends; it returns once it no longer calls the handler. A podCache
// runs once.
func (c *podCache) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		<-ctx.Done()
		c.fifo.Close()
	})
	wg.Go(func() { c.popLoop(ctx) })
	// Reflector.RunWithContext, with this cache's back-off and watch error
	// handler (a Reflector has no setter for either).
	_ = wait.DelayFunc(c.delay.next).Until(ctx, true, true, func(ctx context.Context) (bool, error) {
		err := c.reflector.ListAndWatchWithContext(ctx)
		c.endCycle(err)
		if err != nil && ctx.Err() == nil {
			c.fail(err)
			if c.opts.OnWatchError != nil {
				c.opts.OnWatchError(ctx, c.reflector, err)
			}
		}
		return false, nil
	})
	wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.blindAt.IsZero() { // a stopped cache is not counted blind
		c.blindAt, c.blindErr = time.Time{}, nil
		c.opts.Blind.Dec()
	}
}

// endCycle notes the end of a list-and-watch cycle that returned err: later
// lists are LISTs, and a cycle whose LIST brought news and none of whose
// requests failed is live for the back-off.
func (c *podCache) endCycle(err error) {
	c.relisting.Store(true)
	if c.listNews.Swap(false) && err == nil {
		c.delay.live.Store(true)
	}
}

// HasSynced reports whether the cache's first list has been handed to the
// handler in full: the RealFIFO counts the first list's items done only once
// each is popped and processed.
func (c *podCache) HasSynced() bool { return c.fifo.HasSynced() }

// Indexer is the cache. Never modify the objects it holds.
func (c *podCache) Indexer() cache.Indexer { return c.indexer }

// blind returns when the cache last became unable to list or watch and the
// latest failure; zero while it sees the API server.
func (c *podCache) blind() (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.blindAt, c.blindErr
}

func (c *podCache) observe(ctx context.Context, err error) {
	switch {
	case err == nil:
		c.succeed()
	case ctx.Err() == nil: // not a request the end of Run cancelled
		c.fail(err)
	}
}

// hasNews reports whether list, the answer to a LIST with opts, holds news
// for the cache: a pod it does not hold at that resourceVersion, or, when the
// list is whole (not a page), another number of pods than it holds (a pod
// gone). Changes the cache has queued but not applied yet count as news.
func (c *podCache) hasNews(opts metav1.ListOptions, list runtime.Object) bool {
	items, err := meta.ExtractList(list)
	if err != nil {
		return false
	}
	for _, obj := range items {
		key, err := podKey(obj)
		if err != nil {
			continue
		}
		cached, ok, err := c.indexer.GetByKey(key)
		if err != nil || !ok || !sameVersion(cached, obj) {
			return true
		}
	}
	m, err := meta.ListAccessor(list)
	whole := err == nil && opts.Continue == "" && m.GetContinue() == ""
	return whole && len(items) != len(c.indexer.ListKeys())
}

// watchEvents returns the filter of one watch's events: it notes a change
// delivered after the list (for a streaming list, after its
// initial-events-end bookmark), which makes the cycle a live one for the
// back-off, and reports a 410 in the stream.
func (c *podCache) watchEvents(streaming bool) watch.FilterFunc {
	listed := !streaming
	return func(ev watch.Event) (watch.Event, bool) {
		switch ev.Type {
		case watch.Added, watch.Modified, watch.Deleted:
			if listed {
				c.delay.live.Store(true)
				c.watchLive()
			}
		case watch.Bookmark:
			if m, err := meta.Accessor(ev.Object); err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				listed = true
			}
			c.watchLive()
		case watch.Error:
			if err := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				c.stormMu.Lock()
				c.storm.expired(c.opts.ReflectorClock.Now())
				c.stormMu.Unlock()
				if c.opts.OnExpired != nil {
					c.opts.OnExpired()
				}
			}
		}
		return ev, true
	}
}

func (c *podCache) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.blindErr = err
	if !c.blindAt.IsZero() {
		return
	}
	c.blindAt = c.opts.Clock.Now()
	c.opts.Blind.Inc()
	c.opts.Logger.Info("pod cache cannot list or watch", "namespace", c.namespace, "err", err)
}

func (c *podCache) succeed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.blindAt.IsZero() {
		return
	}
	c.opts.Logger.Info("pod cache lists and watches again", "namespace", c.namespace, "blindFor", c.opts.Clock.Since(c.blindAt).String())
	c.blindAt, c.blindErr = time.Time{}, nil
	c.opts.Blind.Dec()
}

// popLoop hands every change the Reflector queues to process until the
// queue is closed, as the informer's controller does.
func (c *podCache) popLoop(ctx context.Context) {
	for ctx.Err() == nil {
		_, err := c.fifo.Pop(c.process)
		if errors.Is(err, cache.ErrFIFOClosed) {
			return
		}
		if err != nil {
			c.opts.Logger.Error("pod cache change not applied", "namespace", c.namespace, "err", err)
		}
	}
}

// process applies popped deltas to the indexer and calls the handler, as
// client-go's processDeltas and a SharedIndexInformer's handler between
// resyncs do.
func (c *podCache) process(obj any, isInInitialList bool) error {
	deltas, ok := obj.(cache.Deltas)
	if !ok {
		return fmt.Errorf("popped %T, not cache.Deltas", obj)
	}
	for _, d := range deltas {
		switch d.Type {
		case cache.Sync, cache.Replaced, cache.Added, cache.Updated:
			old, exists, err := c.indexer.Get(d.Object)
			if n, ok := compareVersions(d.Object, old); err == nil && exists && d.Type != cache.Sync && ok && n < 0 {
				continue // older than the cached pod (a storm list was ahead of the watch)
			}
			if err == nil && exists {
				if err := c.indexer.Update(d.Object); err != nil {
					return fmt.Errorf("updating cached pod: %w", err)
				}
				// A relist that finds a pod unchanged is no news (an
				// informer counts it a resync); a watch event always is,
				// whatever its resourceVersion (a fake clientset keeps it).
				if d.Type != cache.Replaced || !sameVersion(old, d.Object) {
					c.opts.Handler.OnUpdate(old, d.Object)
				}
				continue
			}
			if err := c.indexer.Add(d.Object); err != nil {
				return fmt.Errorf("caching pod: %w", err)
			}
			c.opts.Handler.OnAdd(d.Object, isInInitialList)
		case cache.Deleted:
			if err := c.indexer.Delete(d.Object); err != nil {
				return fmt.Errorf("removing cached pod: %w", err)
			}
			c.opts.Handler.OnDelete(d.Object)
		}
	}
	return nil
}

// podKey is the cache's key function, the informer's for pods and for
// what the executor's Transform makes of them (cachedPod): namespace/name;
// a tombstone is deleted by its key.
func podKey(obj any) (string, error) {
	switch o := obj.(type) {
	case *cachedPod:
		return o.key(), nil
	case cache.DeletedFinalStateUnknown:
		return o.Key, nil
	}
	return cache.MetaNamespaceKeyFunc(obj)
}

// sameVersion reports whether a and b have one resourceVersion.
func sameVersion(a, b any) bool {
	va, okA := resourceVersion(a)
	vb, okB := resourceVersion(b)
	return okA && okB && va == vb
}

// compareVersions compares the resourceVersions of a and b as the API
// server orders them (-1, 0, +1); false when either is not a well-formed
// one (a fake clientset's).
func compareVersions(a, b any) (int, bool) {
	va, okA := resourceVersion(a)
	vb, okB := resourceVersion(b)
	if !okA || !okB {
		return 0, false
	}
	n, err := resourceversion.CompareResourceVersion(va, vb)
	return n, err == nil
}

func resourceVersion(obj any) (string, bool) {
	if c, ok := obj.(*cachedPod); ok {
		return c.resourceVersion, true
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", false
	}
	return m.GetResourceVersion(), true
}

// relistDelay is the back-off between list-and-watch cycles: the steps of
// initial, started again after a live cycle (one whose LIST brought news or
// whose watch delivered a change after its list: the server answers, and
// pods change faster than the cache's watches last, as in a 410 storm or an
// API server's rollout, so the next list is not hammering a failing server
// and brings what the executor waits for) or one that stayed up for
// backoffReset. Only the goroutine of Run calls next.
type relistDelay struct {
	clock            clock.Clock
	initial, current wait.Backoff
	cycleStart       time.Time   // when the cycle after the last delay started
	live             atomic.Bool // set by the cycle's LIST or watch on news
}

func (d *relistDelay) next() time.Duration {
	now := d.clock.Now()
	live := d.live.Swap(false)
	if live || !d.cycleStart.IsZero() && now.Sub(d.cycleStart) >= backoffReset {
		d.current = d.initial
	}
	delay := d.current.Step()
	d.cycleStart = now.Add(delay)
	return delay
}

// namespaceName names namespace ns in messages.
func namespaceName(ns string) string {
	if ns == metav1.NamespaceAll {
		return "all namespaces"
	}
	return "namespace " + ns
}

// filteredWatch is watch.Filter without its leak: watch.Filter's loop,
// holding an event the consumer no longer reads (the reflector stops
// reading when its context ends, a Lease lost say, and then calls Stop),
// blocks on its send for ever. This one's loop ends at Stop.
type filteredWatch struct {
	in   watch.Interface
	out  chan watch.Event
	f    watch.FilterFunc
	stop chan struct{}
	once sync.Once
}

// filterWatch passes w's events through f, as watch.Filter does, until w
// ends or Stop is called.
func filterWatch(w watch.Interface, f watch.FilterFunc) watch.Interface {
	fw := &filteredWatch{in: w, out: make(chan watch.Event), f: f, stop: make(chan struct{})}
	go fw.loop()
	return fw
}

func (fw *filteredWatch) ResultChan() <-chan watch.Event { return fw.out }

// Stop stops the upstream watch and the loop, whether or not the consumer
// reads.
func (fw *filteredWatch) Stop() {
	fw.once.Do(func() { close(fw.stop) })
	fw.in.Stop()
}

func (fw *filteredWatch) loop() {
	defer close(fw.out)
	for {
		select {
		case <-fw.stop:
			return
		case ev, ok := <-fw.in.ResultChan():
			if !ok {
				return
			}
			ev, keep := fw.f(ev)
			if !keep {
				continue
			}
			select {
			case fw.out <- ev:
			case <-fw.stop:
				return
			}
		}
	}
}
