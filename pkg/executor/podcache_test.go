package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/pkg/task"
)

// testBackoff is a short back-off for the tests that run a pod cache.
var testBackoff = wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.5, Cap: 50 * time.Millisecond}

// fakeLW is an API server for one pod cache: List returns pods (or
// listErr's error), Watch watchFn's answer or a fake watcher the test feeds.
type fakeLW struct {
	mu       sync.Mutex
	pods     []corev1.Pod
	rv       int
	lists    int
	watches  int
	listErr  func(n int) error                    // for the nth List, from 1; nil: no error
	watchFn  func(n int) (watch.Interface, error) // for the nth Watch; nil: a fake watcher
	watching chan *watch.FakeWatcher              // the fake watchers, as they are handed out
	listedAt []time.Time
}

func newFakeLW(pods ...corev1.Pod) *fakeLW {
	return &fakeLW{pods: pods, rv: 100, watching: make(chan *watch.FakeWatcher, 100)}
}

func (f *fakeLW) setPods(pods ...corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods = pods
	f.rv++
}

func (f *fakeLW) counts() (lists, watches int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lists, f.watches
}

func (f *fakeLW) lw() *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(_ context.Context, _ metav1.ListOptions) (runtime.Object, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.lists++
			f.listedAt = append(f.listedAt, time.Now())
			if f.listErr != nil {
				if err := f.listErr(f.lists); err != nil {
					return nil, err
				}
			}
			list := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: fmt.Sprint(f.rv)}}
			for _, p := range f.pods {
				list.Items = append(list.Items, *p.DeepCopy())
			}
			return list, nil
		},
		WatchFuncWithContext: func(_ context.Context, _ metav1.ListOptions) (watch.Interface, error) {
			f.mu.Lock()
			f.watches++
			n, fn := f.watches, f.watchFn
			f.mu.Unlock()
			if fn != nil {
				if w, err := fn(n); w != nil || err != nil {
					return w, err
				}
			}
			fw := watch.NewFake()
			f.watching <- fw
			return fw, nil
		},
	}
}

func testPod(name, rv string) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv, Labels: map[string]string{task.LabelRun: "run-" + name}}}
}

// recorder records a pod cache's handler calls as "add ns/a 1",
// "update ns/a 2", "delete ns/a 3" or "delete ns/a unknown" (a tombstone).
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.note("add", obj) },
		UpdateFunc: func(_, obj any) { r.note("update", obj) },
		DeleteFunc: func(obj any) { r.note("delete", obj) },
	}
}

func (r *recorder) note(what string, obj any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		r.events = append(r.events, fmt.Sprintf("%s %s unknown", what, t.Key))
		return
	}
	p := obj.(*corev1.Pod)
	r.events = append(r.events, fmt.Sprintf("%s %s/%s %s", what, p.Namespace, p.Name, p.ResourceVersion))
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// testCacheOptions are a pod cache's options for a test: events to rec,
// the short back-off, the real clock, no logs.
func testCacheOptions(rec *recorder) podCacheOptions {
	return podCacheOptions{
		Namespace: "ns",
		Client:    fake.NewClientset(), // no streaming lists
		Handler:   rec.handler(),
		Backoff:   testBackoff,
		Blind:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "blind"}),
		Clock:     clock.RealClock{},
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// runCache runs c until the test ends.
func runCache(t *testing.T, c *podCache) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitFor fails the test unless cond holds within 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func keys(c *podCache) []string {
	k := c.Indexer().ListKeys()
	slices.Sort(k)
	return k
}

// TestPodCacheProcess: each delta changes the indexer and calls the handler
// as a SharedIndexInformer's handler between resyncs is called.
func TestPodCacheProcess(t *testing.T) {
	a1, a2 := testPod("a", "1"), testPod("a", "2")
	for _, tc := range []struct {
		name     string
		cached   []corev1.Pod
		delta    cache.Delta
		initial  bool
		want     []string
		wantKeys []string
	}{
		{"added", nil, cache.Delta{Type: cache.Added, Object: &a1}, false, []string{"add ns/a 1"}, []string{"ns/a"}},
		{"in the first list", nil, cache.Delta{Type: cache.Replaced, Object: &a1}, true, []string{"add ns/a 1"}, []string{"ns/a"}},
		{"updated", []corev1.Pod{a1}, cache.Delta{Type: cache.Updated, Object: &a2}, false, []string{"update ns/a 2"}, []string{"ns/a"}},
		{"changed in a relist", []corev1.Pod{a1}, cache.Delta{Type: cache.Replaced, Object: &a2}, false, []string{"update ns/a 2"}, []string{"ns/a"}},
		{"unchanged in a relist", []corev1.Pod{a1}, cache.Delta{Type: cache.Replaced, Object: &a1}, false, nil, []string{"ns/a"}},
		// A fake clientset's update keeps the resourceVersion: still news.
		{"updated, same resourceVersion", []corev1.Pod{a1}, cache.Delta{Type: cache.Updated, Object: &a1}, false, []string{"update ns/a 1"}, []string{"ns/a"}},
		{"resync", []corev1.Pod{a1}, cache.Delta{Type: cache.Sync, Object: &a1}, false, []string{"update ns/a 1"}, []string{"ns/a"}},
		{"deleted", []corev1.Pod{a1}, cache.Delta{Type: cache.Deleted, Object: &a2}, false, []string{"delete ns/a 2"}, []string{}},
		{"gone from a relist", []corev1.Pod{a1}, cache.Delta{Type: cache.Deleted, Object: cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: &a1}}, false, []string{"delete ns/a unknown"}, []string{}},
		// A storm list may be ahead of the watch answered after it: an
		// older change never moves the pod backwards.
		{"older in a watch event", []corev1.Pod{a2}, cache.Delta{Type: cache.Updated, Object: &a1}, false, nil, []string{"ns/a"}},
		{"older, added by a watch", []corev1.Pod{a2}, cache.Delta{Type: cache.Added, Object: &a1}, false, nil, []string{"ns/a"}},
		{"older in a relist", []corev1.Pod{a2}, cache.Delta{Type: cache.Replaced, Object: &a1}, false, nil, []string{"ns/a"}},
		{"resync of an older object", []corev1.Pod{a2}, cache.Delta{Type: cache.Sync, Object: &a1}, false, []string{"update ns/a 1"}, []string{"ns/a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			c := newPodCache(newFakeLW().lw(), testCacheOptions(rec))
			for _, p := range tc.cached {
				if err := c.Indexer().Add(p.DeepCopy()); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.process(cache.Deltas{tc.delta}, tc.initial); err != nil {
				t.Fatal(err)
			}
			if got := rec.take(); !slices.Equal(got, tc.want) {
				t.Errorf("handler calls %q, want %q", got, tc.want)
			}
			if got := keys(c); !slices.Equal(got, tc.wantKeys) {
				t.Errorf("cached %q, want %q", got, tc.wantKeys)
			}
			if strings.HasPrefix(tc.name, "older") {
				if p, _, _ := c.Indexer().GetByKey("ns/a"); p.(*corev1.Pod).ResourceVersion != "2" {
					t.Errorf("cached pod at resourceVersion %s, want it left at 2", p.(*corev1.Pod).ResourceVersion)
				}
			}
		})
	}
}

// TestPodCacheFollowsTheAPIServer: a running cache syncs from the first list
// and delivers the watch's adds, updates and deletes and the relists' news,
// in order, with the indexer changed first.
func TestPodCacheFollowsTheAPIServer(t *testing.T) {
	fl := newFakeLW(testPod("a", "1"))
	rec := &recorder{}
	c := newPodCache(fl.lw(), testCacheOptions(rec))
	runCache(t, c)
	waitFor(t, "the cache synced", c.HasSynced)
	if got := rec.take(); !slices.Equal(got, []string{"add ns/a 1"}) {
		t.Fatalf("first list: handler calls %q", got)
	}
	fw := <-fl.watching
	expired := apierrors.NewResourceExpired("too old resource version").Status()
	b2, a3, b4, c5 := testPod("b", "2"), testPod("a", "3"), testPod("b", "4"), testPod("c", "5")
	for _, step := range []struct {
		name     string
		do       func()
		want     []string
		wantKeys []string
	}{
		{"watch adds", func() { fw.Add(&b2) }, []string{"add ns/b 2"}, []string{"ns/a", "ns/b"}},
		{"watch updates", func() { fw.Modify(&a3) }, []string{"update ns/a 3"}, []string{"ns/a", "ns/b"}},
		{"watch deletes", func() { fw.Delete(&b4) }, []string{"delete ns/b 4"}, []string{"ns/a"}},
		{"relist after 410 finds a new pod and an unchanged one", func() {
			fl.setPods(a3, c5)
			fw.Error(&expired)
			fw = <-fl.watching
		}, []string{"add ns/c 5"}, []string{"ns/a", "ns/c"}},
		{"relist after 410 misses a pod", func() {
			fl.setPods(c5)
			fw.Error(&expired)
			fw = <-fl.watching
		}, []string{"delete ns/a unknown"}, []string{"ns/c"}},
	} {
		step.do()
		var got []string
		waitFor(t, step.name+": the handler called", func() bool {
			got = append(got, rec.take()...)
			return len(got) >= len(step.want)
		})
		if !slices.Equal(got, step.want) {
			t.Errorf("%s: handler calls %q, want %q", step.name, got, step.want)
		}
		if k := keys(c); !slices.Equal(k, step.wantKeys) {
			t.Errorf("%s: cached %q, want %q", step.name, k, step.wantKeys)
		}
	}
}

// TestPodCacheRelistsWithinTheBackoff: after a failed or ended watch or a
// failed list the cache lists (or watches) again within its back-off, five
// times in a row well within what client-go's default back-off (0.8 s
// doubling) needs for the first retry plus the second; failed cycles are
// counted by kind.
func TestPodCacheRelistsWithinTheBackoff(t *testing.T) {
	const failures = 5
	expired := apierrors.NewResourceExpired("too old resource version")
	for _, tc := range []struct {
		name                string
		listErr             func(n int) error
		watchFn             func(n int) (watch.Interface, error)
		wantLists, wantWats int
		wantExpired, wantOt float64
	}{
		{
			name:    "watch request answers 410 Expired",
			watchFn: func(n int) (watch.Interface, error) { return nil, failFirst(n, expired) },
			// each failure ends the cycle: a relist
			wantLists: failures + 1, wantWats: failures + 1, wantExpired: failures,
		},
		{
			name: "watch ends with an ERROR 410 event",
			watchFn: func(n int) (watch.Interface, error) {
				if n > failures {
					return nil, nil
				}
				fw := watch.NewFakeWithChanSize(1, false)
				fw.Error(&expired.ErrStatus)
				return fw, nil
			},
			// Not a failed cycle, but an expired watch: counted as one.
			wantLists: failures + 1, wantWats: failures + 1, wantExpired: failures,
		},
		{
			name:      "watch request fails",
			watchFn:   func(n int) (watch.Interface, error) { return nil, failFirst(n, errors.New("connection reset by peer")) },
			wantLists: failures + 1, wantWats: failures + 1, wantOt: failures,
		},
		{
			name:    "watch request refused",
			watchFn: func(n int) (watch.Interface, error) { return nil, failFirst(n, syscall.ECONNREFUSED) },
			// the Reflector watches again, with the same back-off, without relisting
			wantLists: 1, wantWats: failures + 1,
		},
		{
			name:      "list fails",
			listErr:   func(n int) error { return failFirst(n, errors.New("service unavailable")) },
			wantLists: failures + 1, wantWats: 1, wantOt: failures,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, func(c *Config) { c.WatchBackoff = testBackoff })
			fl := newFakeLW(testPod("a", "1"))
			fl.listErr, fl.watchFn = tc.listErr, tc.watchFn
			opts := f.ex.podCacheOptions("ns")
			c := newPodCache(fl.lw(), opts)
			start := time.Now()
			runCache(t, c)
			select {
			case <-fl.watching: // the watch that stays
			case <-time.After(10 * time.Second):
				lists, watches := fl.counts()
				t.Fatalf("no lasting watch after 10 s: %d lists, %d watches", lists, watches)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("%d failures took %s to recover from, want well under 2 s (back-off %s to %s)", failures, took, testBackoff.Duration, testBackoff.Cap)
			}
			if lists, watches := fl.counts(); lists != tc.wantLists || watches != tc.wantWats {
				t.Errorf("%d lists and %d watches, want %d and %d", lists, watches, tc.wantLists, tc.wantWats)
			}
			waitFor(t, "the cache synced", c.HasSynced)
			if got := testutil.ToFloat64(f.ex.metrics.watchErrors.WithLabelValues("expired")); got != tc.wantExpired {
				t.Errorf("watch errors (expired) = %v, want %v", got, tc.wantExpired)
			}
			if got := testutil.ToFloat64(f.ex.metrics.watchErrors.WithLabelValues("other")); got != tc.wantOt {
				t.Errorf("watch errors (other) = %v, want %v", got, tc.wantOt)
			}
			// The fake hands its watcher out before its Watch returns, and
			// the cache counts the request a success once it has returned.
			waitFor(t, "the cache to see again", func() bool { since, _ := c.blind(); return since.IsZero() })
			if got := testutil.ToFloat64(f.ex.metrics.podCacheBlind.WithLabelValues("ns")); got != 0 {
				t.Errorf("kubetask_pod_cache_blind = %v after recovering, want 0", got)
			}
		})
	}
}

// failFirst returns err for the first failures calls, then nil.
func failFirst(n int, err error) error {
	if n <= 5 {
		return err
	}
	return nil
}

// TestRelistDelay: the delay grows from Duration by Factor, never exceeds
// Cap with its jitter, and starts again from Duration only after a cycle
// that stayed up for backoffReset or a live one (its watch delivered a
// change).
func TestRelistDelay(t *testing.T) {
	b := newFx(t, nil).ex.cfg.WatchBackoff // the default
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	d := relistDelay{clock: clk, initial: reflectorBackoff(b), current: reflectorBackoff(b)}
	ms := time.Millisecond
	for i, tc := range []struct {
		cycle    time.Duration // how long the cycle before this delay stayed up
		live     bool          // its watch delivered a change
		min, max time.Duration
	}{
		{0, false, 100 * ms, 150 * ms},
		{0, false, 200 * ms, 300 * ms},
		{0, false, 400 * ms, 600 * ms},
		{time.Second, false, 800 * ms, 1200 * ms},
		{0, false, 1333 * ms, 2000 * ms}, // capped: 2 s with the jitter
		{5 * time.Second, false, 1333 * ms, 2000 * ms},
		{0, false, 1333 * ms, 2000 * ms},
		{backoffReset, false, 100 * ms, 150 * ms}, // a cycle that stayed up: from the start
		{0, false, 200 * ms, 300 * ms},
		{0, false, 400 * ms, 600 * ms},
		{2 * time.Second, true, 100 * ms, 150 * ms}, // a live cycle (a 410 storm): from the start
		{2 * time.Second, true, 100 * ms, 150 * ms},
		{0, false, 200 * ms, 300 * ms}, // the live mark is spent
	} {
		clk.Step(tc.cycle)
		d.live.Store(tc.live)
		got := d.next()
		if got < tc.min || got > tc.max {
			t.Errorf("delay %d after a %s cycle = %s, want %s to %s", i, tc.cycle, got, tc.min, tc.max)
		}
		clk.Step(got)
	}
}

// TestWatchBackoffConfig: the zero WatchBackoff is the default; a set one is
// used as given when it makes sense.
func TestWatchBackoffConfig(t *testing.T) {
	def := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Cap: 2 * time.Second}
	for _, tc := range []struct {
		name    string
		b, want wait.Backoff
		wantErr bool
	}{
		{name: "default", want: def},
		{name: "set", b: testBackoff, want: testBackoff},
		{name: "constant", b: wait.Backoff{Duration: time.Second, Cap: time.Second}, want: wait.Backoff{Duration: time.Second, Cap: time.Second}},
		{name: "no duration", b: wait.Backoff{Cap: time.Second, Factor: 2}, wantErr: true},
		{name: "cap below duration", b: wait.Backoff{Duration: time.Second, Cap: time.Millisecond, Factor: 2}, wantErr: true},
		{name: "shrinking", b: wait.Backoff{Duration: time.Second, Cap: time.Second, Factor: 0.5}, wantErr: true},
		{name: "negative jitter", b: wait.Backoff{Duration: time.Second, Cap: time.Second, Jitter: -1}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Client: fake.NewClientset(), Execer: &fakeExec{}, InstanceID: "ex", WatchBackoff: tc.b}
			err := cfg.defaults()
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "WatchBackoff") {
					t.Errorf("defaults() = %v, want a WatchBackoff error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.WatchBackoff != tc.want {
				t.Errorf("WatchBackoff %+v, want %+v", cfg.WatchBackoff, tc.want)
			}
		})
	}
}

// TestHealthyReportsABlindPodCache: Healthy fails once a pod cache has been
// blind for LivenessTimeout without a success in between, never for a
// failure the next try recovered from.
func TestHealthyReportsABlindPodCache(t *testing.T) {
	type op struct {
		at   time.Duration // since the start
		fail bool          // a failed request; otherwise a successful one
	}
	const timeout = time.Minute
	for _, tc := range []struct {
		name    string
		ops     []op
		checkAt time.Duration
		wantErr bool
	}{
		{"never failed", nil, 2 * timeout, false},
		{"failing for less than the timeout", []op{{0, true}}, timeout - time.Second, false},
		{"failing for the timeout", []op{{0, true}}, timeout, true},
		{"failing again and again counts from the first failure", []op{{0, true}, {30 * time.Second, true}, {59 * time.Second, true}}, timeout, true},
		{"a 410 recovered within a second", []op{{0, true}, {500 * time.Millisecond, false}}, 2 * timeout, false},
		{"failing again after a success counts from the new failure", []op{{0, true}, {time.Second, false}, {2 * time.Second, true}}, timeout + time.Second, false},
		{"failing again after a success, for the timeout", []op{{0, true}, {time.Second, false}, {2 * time.Second, true}}, timeout + 2*time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, func(c *Config) { c.LivenessTimeout = timeout })
			c := newPodCache(newFakeLW().lw(), f.ex.podCacheOptions("ns"))
			f.ex.caches, f.ex.started, f.ex.startedAt = []*podCache{c}, true, f.clk.Now()
			f.ex.gate.open()
			start := f.clk.Now()
			errDown := errors.New("apiserver unavailable")
			for _, o := range tc.ops {
				f.clk.SetTime(start.Add(o.at))
				if o.fail {
					c.observe(f.ctx, errDown)
				} else {
					c.observe(f.ctx, nil)
				}
			}
			f.clk.SetTime(start.Add(tc.checkAt))
			// Synced, so that only blindness can fail it.
			_ = c.fifo.Replace(nil, "1")
			err := f.ex.Healthy()
			if tc.wantErr != (err != nil) {
				t.Fatalf("Healthy() = %v, want an error: %v", err, tc.wantErr)
			}
			if err != nil && (!errors.Is(err, errDown) || !strings.Contains(err.Error(), "cannot list or watch")) {
				t.Errorf("Healthy() = %v, want it to say the cache cannot list or watch, wrapping the failure", err)
			}
			blind := 0.0
			if n := len(tc.ops); n > 0 && tc.ops[n-1].fail {
				blind = 1
			}
			if got := testutil.ToFloat64(f.ex.metrics.podCacheBlind.WithLabelValues("ns")); got != blind {
				t.Errorf("kubetask_pod_cache_blind = %v, want %v", got, blind)
			}
		})
	}
}

// TestPodCacheBlindWhileTheListerFails: a running cache whose lists fail is
// blind from the first failure (gauge 1, Healthy failing after
// LivenessTimeout), and sees again, synced, once a list succeeds.
func TestPodCacheBlindWhileTheListerFails(t *testing.T) {
	f := newFx(t, func(c *Config) { c.WatchBackoff = testBackoff; c.LivenessTimeout = time.Minute })
	var failing atomic.Bool
	failing.Store(true)
	errDown := errors.New("apiserver unavailable")
	fl := newFakeLW(testPod("a", "1"))
	fl.listErr = func(int) error {
		if failing.Load() {
			return errDown
		}
		return nil
	}
	c := newPodCache(fl.lw(), f.ex.podCacheOptions("ns"))
	f.ex.caches, f.ex.started, f.ex.startedAt = []*podCache{c}, true, f.clk.Now()
	f.ex.gate.open()
	failedAt := f.clk.Now()
	runCache(t, c)
	waitFor(t, "the cache is blind", func() bool { since, _ := c.blind(); return !since.IsZero() })
	waitFor(t, "the cache listed again", func() bool { lists, _ := fl.counts(); return lists >= 3 })
	if since, err := c.blind(); !since.Equal(failedAt) || !errors.Is(err, errDown) {
		t.Errorf("blind since %s (%v), want since %s, the first failure", since, err, failedAt)
	}
	if got := testutil.ToFloat64(f.ex.metrics.podCacheBlind.WithLabelValues("ns")); got != 1 {
		t.Errorf("kubetask_pod_cache_blind = %v while failing, want 1", got)
	}
	if err := f.ex.Healthy(); err != nil {
		t.Errorf("unhealthy within the liveness timeout: %v", err)
	}
	f.clk.Step(time.Minute)
	if err := f.ex.Healthy(); !errors.Is(err, errDown) {
		t.Errorf("Healthy() = %v after a minute blind, want the list's error", err)
	}
	failing.Store(false)
	waitFor(t, "the cache synced", c.HasSynced)
	if since, err := c.blind(); !since.IsZero() {
		t.Errorf("blind since %s (%v) after a successful list", since, err)
	}
	if got := testutil.ToFloat64(f.ex.metrics.podCacheBlind.WithLabelValues("ns")); got != 0 {
		t.Errorf("kubetask_pod_cache_blind = %v after recovering, want 0", got)
	}
	if err := f.ex.Healthy(); err != nil {
		t.Errorf("unhealthy after recovering: %v", err)
	}
}

// TestPodCachesFeedTheExecutor: the executor's pod caches list its
// unreleased pods through the fake clientset, compact, and every cached pod
// reaches CachedPod, podsOfRun, the slot count, the queue and OnPodChange.
func TestPodCachesFeedTheExecutor(t *testing.T) {
	var changed atomic.Value
	f := newFx(t, func(c *Config) { c.OnPodChange = func(ns, name string) { changed.Store(ns + "/" + name) } })
	labels := map[string]string{task.LabelManagedBy: task.ManagedByValue, task.LabelExecutor: "ex", task.LabelRun: "r1"}
	mine := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: labels,
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	released := mine.DeepCopy()
	released.Name, released.Labels = "kept", map[string]string{task.LabelManagedBy: task.ManagedByValue, task.LabelExecutor: "ex", task.LabelRun: "r0", task.LabelReleased: "true"}
	for _, p := range []*corev1.Pod{mine, released} {
		if _, err := f.client.CoreV1().Pods("ns").Create(f.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	caches, namespaces := f.ex.startPodCaches(ctx)
	if !slices.Equal(namespaces, []string{"ns"}) || len(caches) != 1 {
		t.Fatalf("caches for %v", namespaces)
	}
	waitFor(t, "the cache synced", caches[0].HasSynced)
	p := f.ex.CachedPod("ns", "p")
	if p == nil {
		t.Fatal("CachedPod(ns, p) = nil")
	}
	if obj, _, _ := caches[0].Indexer().GetByKey("ns/p"); obj != nil {
		if _, ok := obj.(*cachedPod); !ok {
			t.Errorf("the cache holds a %T, not a *cachedPod", obj)
		}
	}
	if p.ManagedFields != nil || p.Labels[task.LabelRun] != "r1" {
		t.Errorf("CachedPod(ns, p) is not the cached view: %+v", p.ObjectMeta)
	}
	if f.ex.CachedPod("ns", "kept") != nil {
		t.Error("a released pod is cached")
	}
	if got := f.ex.podsOfRun("r1"); len(got) != 1 {
		t.Errorf("podsOfRun(r1) = %d pods, want 1", len(got))
	}
	f.ex.mu.Lock()
	n := f.ex.cachedPodCount()
	f.ex.mu.Unlock()
	if n != 1 {
		t.Errorf("cachedPodCount() = %d, want 1", n)
	}
	if f.ex.queue.Len() != 1 {
		t.Errorf("queue holds %d tasks, want r1", f.ex.queue.Len())
	}
	if got, _ := changed.Load().(string); got != "ns/p" {
		t.Errorf("OnPodChange saw %q, want ns/p", got)
	}
}

// TestWatchEventsMarkLiveAndExpired: a change after the list makes the
// cycle live (for a streaming list, only after its initial-events-end
// bookmark); a 410 Expired or Gone in the stream is reported, another error
// is not.
func TestWatchEventsMarkLiveAndExpired(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	endOfList := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	expired := apierrors.NewResourceExpired("too old resource version")
	status := func(err *apierrors.StatusError) runtime.Object { s := err.Status(); return &s }
	for _, tc := range []struct {
		name        string
		streaming   bool
		events      []watch.Event
		wantLive    bool
		wantExpired int
	}{
		{name: "a change", events: []watch.Event{{Type: watch.Modified, Object: pod}}, wantLive: true},
		{name: "a deletion", events: []watch.Event{{Type: watch.Deleted, Object: pod}}, wantLive: true},
		{name: "bookmarks only", events: []watch.Event{{Type: watch.Bookmark, Object: pod}}},
		{name: "nothing"},
		{name: "streaming list, its items only", streaming: true, events: []watch.Event{{Type: watch.Added, Object: pod}, {Type: watch.Bookmark, Object: endOfList}}},
		{name: "streaming list, then a change", streaming: true, events: []watch.Event{{Type: watch.Added, Object: pod}, {Type: watch.Bookmark, Object: endOfList}, {Type: watch.Modified, Object: pod}}, wantLive: true},
		{name: "410 Expired", events: []watch.Event{{Type: watch.Error, Object: status(expired)}}, wantExpired: 1},
		{name: "410 Gone", events: []watch.Event{{Type: watch.Error, Object: &metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonGone}}}, wantExpired: 1},
		{name: "another error", events: []watch.Event{{Type: watch.Error, Object: status(apierrors.NewInternalError(errors.New("boom")))}}},
		{name: "a change, then 410", events: []watch.Event{{Type: watch.Added, Object: pod}, {Type: watch.Error, Object: status(expired)}}, wantLive: true, wantExpired: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			c := &podCache{opts: podCacheOptions{OnExpired: func() { n++ }, ReflectorClock: clock.RealClock{}}}
			f := c.watchEvents(tc.streaming)
			for _, ev := range tc.events {
				if got, keep := f(ev); !keep || got.Type != ev.Type {
					t.Errorf("event %s changed to %s (kept %v)", ev.Type, got.Type, keep)
				}
			}
			if got := c.delay.live.Load(); got != tc.wantLive {
				t.Errorf("live %v, want %v", got, tc.wantLive)
			}
			if n != tc.wantExpired {
				t.Errorf("OnExpired called %d times, want %d", n, tc.wantExpired)
			}
		})
	}
}

// streamingLW is an API server that serves streaming lists (client-go's
// watch-list: a WATCH with sendInitialEvents, the cache's pods as ADDED
// events, then the initial-events-end bookmark) as well as LISTs, and lets
// a test hold every WATCH request it has not answered yet.
type streamingLW struct {
	mu      sync.Mutex
	pods    []corev1.Pod
	rv      int
	lists   int
	streams int           // streaming lists asked for
	hold    chan struct{} // while not nil, WATCH requests wait until it is closed
	// watching are the watchers handed out, as they are.
	watching chan *watch.FakeWatcher
}

func (s *streamingLW) lw() *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(_ context.Context, _ metav1.ListOptions) (runtime.Object, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.lists++
			list := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: fmt.Sprint(s.rv)}}
			for _, p := range s.pods {
				list.Items = append(list.Items, *p.DeepCopy())
			}
			return list, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			s.mu.Lock()
			hold := s.hold
			streaming := opts.SendInitialEvents != nil && *opts.SendInitialEvents
			if streaming {
				s.streams++
			}
			s.mu.Unlock()
			if hold != nil {
				select {
				case <-hold:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			fw := watch.NewFakeWithChanSize(len(s.pods)+1, false)
			if streaming {
				for i := range s.pods {
					fw.Add(s.pods[i].DeepCopy())
				}
				fw.Action(watch.Bookmark, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: fmt.Sprint(s.rv),
					Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
			}
			s.watching <- fw
			return fw, nil
		},
	}
}

// TestRelistedPodsReachTheHandlerWhileWatchesHang: after a 410 the cache
// relists with a LIST and hands what changed meanwhile (here a pod that
// finished while the watch was down) to the handler at once, even while
// every WATCH request goes unanswered (an API server slow to answer
// watches, a connection cut again and again). A relist by streaming list is
// a WATCH: it hands nothing over before its initial-events-end bookmark, so
// the finished pod waited for the watch (issue 19's harsh storm). The first
// list may stream.
func TestRelistedPodsReachTheHandlerWhileWatchesHang(t *testing.T) {
	running, finished := testPod("a", "1"), testPod("a", "2")
	running.Status.Phase, finished.Status.Phase = corev1.PodRunning, corev1.PodSucceeded
	s := &streamingLW{pods: []corev1.Pod{running}, rv: 1, watching: make(chan *watch.FakeWatcher, 100)}
	rec := &recorder{}
	opts := testCacheOptions(rec)
	opts.Client = nil // a client that streams lists
	c := newPodCache(s.lw(), opts)
	runCache(t, c)
	waitFor(t, "the cache synced", c.HasSynced)
	if got := rec.take(); !slices.Equal(got, []string{"add ns/a 1"}) {
		t.Fatalf("first list: handler calls %q", got)
	}
	s.mu.Lock()
	streams0, lists0 := s.streams, s.lists
	s.pods, s.rv = []corev1.Pod{finished}, 2 // the pod finishes while the watch is down
	s.hold = make(chan struct{})             // and no WATCH request is answered from now on
	s.mu.Unlock()
	t.Cleanup(func() { close(s.hold) })
	if streams0 != 1 || lists0 != 0 {
		t.Errorf("the first list was not a streaming list: %d streaming lists, %d LISTs", streams0, lists0)
	}
	expired := apierrors.NewResourceExpired("too old resource version").Status()
	(<-s.watching).Error(&expired)

	var got []string
	deadline := time.Now().Add(5 * time.Second)
	for len(got) == 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
		got = rec.take()
	}
	s.mu.Lock()
	lists, streams := s.lists, s.streams
	s.mu.Unlock()
	if !slices.Equal(got, []string{"update ns/a 2"}) {
		t.Fatalf("handler calls %q within 5 s of the 410 while WATCH requests hang, want [update ns/a 2] (%d LISTs, %d streaming lists asked for)", got, lists, streams)
	}
	if lists != 1 {
		t.Errorf("%d LISTs after the 410, want 1", lists)
	}
	if p, ok, _ := c.Indexer().GetByKey("ns/a"); !ok || p.(*corev1.Pod).Status.Phase != corev1.PodSucceeded {
		t.Errorf("cached pod %v, want it Succeeded", p)
	}
}

// TestRelistDelayAfterListsWithNews: a LIST that brings news (a pod new to
// the cache, changed or gone) makes its cycle live, so the next relist
// comes after the back-off's first step even when the cycle's watch
// expired before it delivered anything (issue 19's harsh storm: every watch
// was answered after the next compaction, and the back-off grew to its cap
// while the LISTs kept finding finished pods); a LIST that brings nothing
// new, or a cycle whose WATCH request failed, lets the back-off grow.
func TestRelistDelayAfterListsWithNews(t *testing.T) {
	ms := time.Millisecond
	a1, a2, b5, c6 := testPod("a", "1"), testPod("a", "2"), testPod("b", "5"), testPod("c", "6")
	fl := newFakeLW()
	f := newFx(t, nil) // the default back-off: 100 ms doubling to 2 s, jitter 50 %
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	opts := f.ex.podCacheOptions("ns")
	opts.ReflectorClock = clk
	c := newPodCache(fl.lw(), opts)
	for i, step := range []struct {
		name     string
		cached   []corev1.Pod // the cache before the LIST
		listed   []corev1.Pod
		page     bool  // the LIST is a page of a longer list
		err      error // how the cycle ended: nil when its watch expired
		min, max time.Duration
	}{
		{"a new pod", nil, []corev1.Pod{a1}, false, nil, 100 * ms, 150 * ms},
		{"nothing new", []corev1.Pod{a1}, []corev1.Pod{a1}, false, nil, 200 * ms, 300 * ms},
		{"nothing new again", []corev1.Pod{a1}, []corev1.Pod{a1}, false, nil, 400 * ms, 600 * ms},
		{"a changed pod", []corev1.Pod{a1}, []corev1.Pod{a2}, false, nil, 100 * ms, 150 * ms},
		{"nothing new after it", []corev1.Pod{a2}, []corev1.Pod{a2}, false, nil, 200 * ms, 300 * ms},
		{"a pod gone", []corev1.Pod{a2}, nil, false, nil, 100 * ms, 150 * ms},
		{"a pod gone and a new one", []corev1.Pod{a2}, []corev1.Pod{b5}, false, nil, 100 * ms, 150 * ms},
		{"a page without news", []corev1.Pod{b5, c6}, []corev1.Pod{b5}, true, nil, 200 * ms, 300 * ms},
		{"news, but the WATCH request failed", []corev1.Pod{b5}, []corev1.Pod{c6}, false, errors.New("internal error"), 400 * ms, 600 * ms},
		{"news after it", []corev1.Pod{c6}, []corev1.Pod{a1}, false, nil, 100 * ms, 150 * ms},
	} {
		for _, p := range c.Indexer().List() {
			if err := c.Indexer().Delete(p); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range step.cached {
			if err := c.Indexer().Add(p.DeepCopy()); err != nil {
				t.Fatal(err)
			}
		}
		fl.setPods(step.listed...)
		lo := metav1.ListOptions{}
		if step.page {
			lo.Continue = "next"
		}
		if _, err := c.lw.ListWithContext(f.ctx, lo); err != nil {
			t.Fatal(err)
		}
		// The cycle's watch expires before it delivers anything, or its
		// request fails.
		c.endCycle(step.err)
		got := c.delay.next()
		if got < step.min || got > step.max {
			t.Errorf("step %d (%s): next relist after %s, want %s to %s", i, step.name, got, step.min, step.max)
		}
		clk.Step(got)
	}
}
