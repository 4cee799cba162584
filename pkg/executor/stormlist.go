package executor

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/wait"
)

const (
	// stormListEvery is how long after its last LIST a pod cache in a 410
	// storm lists again while a WATCH request is unanswered.
	stormListEvery = 500 * time.Millisecond
	// stormListJitter is the most each wait is lengthened by, as a
	// fraction of it, so that caches do not list in step.
	stormListJitter = 0.1
	// stormListsPerWatch bounds the storm lists while one WATCH request is
	// unanswered.
	stormListsPerWatch = 4
)

// stormLists decides when a pod cache lists while one of its WATCH requests
// is unanswered. Only in a 410 storm: for stormWindow after a watch ended
// with 410 Expired (expired). A WATCH request may be answered late because
// the server is slow to answer watches, which alone is no reason to list;
// in a storm, it will likely be answered 410 after the next compaction, and
// the cache would see nothing until then plus the back-off and a LIST
// (issue 19). A watch that delivers a change does not end the storm: the
// next drop's resumption may well be answered 410 a WATCH delay later. The
// first wait is every after the cache's last LIST (listed), doubled by each
// LIST without news and started again by one with news or a live watch; at
// most stormListsPerWatch lists per WATCH request (watchSent). Not safe for
// concurrent use.
type stormLists struct {
	every       time.Duration
	lastExpired time.Time // zero: never
	lastList    time.Time
	wait        time.Duration // from lastList to the next list
	sent        int           // lists while the current WATCH request is unanswered
}

// stormWindow is how long after a 410 a pod cache is in a storm.
const stormWindow = backoffReset

func newStormLists() stormLists {
	return stormLists{every: stormListEvery, wait: stormListEvery}
}

// expired notes a watch (or WATCH request) ended with 410 Expired at now.
func (s *stormLists) expired(now time.Time) { s.lastExpired = now }

// live notes a watch that delivered a change or a bookmark.
func (s *stormLists) live() { s.wait = s.every }

// listed notes a successful LIST at now, and whether it brought news.
func (s *stormLists) listed(now time.Time, news bool) {
	s.lastList = now
	if news {
		s.wait = s.every
		return
	}
	s.wait *= 2
}

// watchSent notes a new WATCH request.
func (s *stormLists) watchSent() { s.sent = 0 }

// inStorm reports whether a watch ended with 410 within stormWindow of now.
func (s *stormLists) inStorm(now time.Time) bool {
	return !s.lastExpired.IsZero() && now.Sub(s.lastExpired) < stormWindow
}

// due reports whether the cache is to list while the current WATCH request
// is unanswered, and how long after now (before jitter): the list is due
// only if it is still in the storm then.
func (s *stormLists) due(now time.Time) (time.Duration, bool) {
	if s.sent >= stormListsPerWatch {
		return 0, false
	}
	d := max(s.lastList.Add(s.wait).Sub(now), 0)
	return d, s.inStorm(now.Add(d))
}

// watchLive notes a watch that delivered a change or a bookmark.
func (c *podCache) watchLive() {
	c.stormMu.Lock()
	defer c.stormMu.Unlock()
	c.storm.live()
}

// relistVersion is the resourceVersion a LIST with opts asks for: a
// relist from a resourceVersion ("not older than") asks for the last storm
// list's instead when it is newer, so a relist never brings an older state
// than a storm list handed over (with an API server's watch cache, a relist
// from an older version may be served as of that older version).
func (c *podCache) relistVersion(opts metav1.ListOptions) string {
	rv := opts.ResourceVersion
	if rv == "" || rv == "0" || opts.Continue != "" || opts.ResourceVersionMatch != "" {
		return rv
	}
	c.stormMu.Lock()
	floor := c.floor
	c.stormMu.Unlock()
	if n, err := resourceversion.CompareResourceVersion(floor, rv); err == nil && n > 0 {
		return floor
	}
	return rv
}

// listWhileUnanswered starts the storm lists of a WATCH request about to be
// sent with ctx, when the cache is in a storm; the returned function is
// called once the request is answered, before its watch is handed to the
// Reflector: no storm list is sent after that, and it returns once the
// lists have stopped and what they brought is queued. A list sent before
// the answer may still be waited on for up to StormListEvery (it holds
// what finished while the WATCH request waited; under load a LIST can take
// as long), then it is cut and dropped. So every pod a storm list hands
// over is queued before any event of the watch answered after it.
func (c *podCache) listWhileUnanswered(ctx context.Context) (answered func()) {
	c.stormMu.Lock()
	c.storm.watchSent()
	_, ok := c.storm.due(c.opts.ReflectorClock.Now())
	c.stormMu.Unlock()
	if !ok {
		return func() {}
	}
	ctx, cut := context.WithCancel(ctx)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { c.stormList(ctx, stop) })
	return func() {
		close(stop)
		waited := make(chan struct{})
		go func() {
			select {
			case <-c.opts.ReflectorClock.After(c.opts.StormListEvery):
				cut()
			case <-waited:
			}
		}()
		wg.Wait()
		close(waited)
		cut()
	}
}

// stormList lists as stormLists decides until stop is closed (the WATCH
// request was answered) or ctx ends, and queues what each list brings.
func (c *podCache) stormList(ctx context.Context, stop <-chan struct{}) {
	clk := c.opts.ReflectorClock
	for {
		c.stormMu.Lock()
		d, ok := c.storm.due(clk.Now())
		c.stormMu.Unlock()
		if !ok {
			return
		}
		d += wait.Jitter(c.opts.StormListEvery, stormListJitter) - c.opts.StormListEvery
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-clk.After(d):
		}
		select {
		case <-stop:
			return
		default:
		}
		c.stormMu.Lock()
		c.storm.sent++
		c.stormMu.Unlock()
		// A consistent read: no older than any event the cache has.
		list, err := c.inner.ListWithContext(ctx, metav1.ListOptions{})
		c.observe(ctx, err)
		if ctx.Err() != nil {
			return // cut: dropped
		}
		now := clk.Now()
		if err != nil {
			c.stormMu.Lock()
			c.storm.listed(now, false) // the next one waits longer
			c.stormMu.Unlock()
			continue
		}
		c.queueNews(now, list)
	}
}

// queueNews queues the pods of list, a storm list answered at now, that the
// cache holds at an older resourceVersion or not at all. Pods gone are not
// queued: the watch or the relist brings them.
func (c *podCache) queueNews(now time.Time, list runtime.Object) {
	items, err := meta.ExtractList(list)
	if err != nil {
		c.opts.Logger.Error("storm list not understood", "namespace", c.namespace, "err", err)
		return
	}
	var news []runtime.Object
	for _, obj := range items {
		key, err := podKey(obj)
		if err != nil {
			continue
		}
		cached, ok, err := c.indexer.GetByKey(key)
		if err != nil || !ok {
			news = append(news, obj)
			continue
		}
		if n, ordered := compareVersions(obj, cached); ordered && n > 0 || !ordered && !sameVersion(obj, cached) {
			news = append(news, obj)
		}
	}
	c.stormMu.Lock()
	defer c.stormMu.Unlock()
	for _, obj := range news {
		if err := c.fifo.Update(obj); err != nil {
			c.opts.Logger.Error("storm list's pod not queued", "namespace", c.namespace, "err", err)
		}
	}
	if m, err := meta.ListAccessor(list); err == nil {
		if n, err := resourceversion.CompareResourceVersion(m.GetResourceVersion(), c.floor); c.floor == "" || err == nil && n > 0 {
			c.floor = m.GetResourceVersion()
		}
	}
	c.storm.listed(now, len(news) > 0)
	if len(news) > 0 {
		c.listNews.Store(true)
	}
}
