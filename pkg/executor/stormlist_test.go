package executor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// TestStormListsDue: a cache lists while a WATCH request is unanswered
// only in a 410 storm (for 10 s after a 410), every 500 ms
// after its last LIST while the LISTs bring news, each LIST without news
// doubling the wait, at most stormListsPerWatch times per WATCH request.
func TestStormListsDue(t *testing.T) {
	ms := time.Millisecond
	t0 := time.Unix(1_000_000, 0)
	none := time.Duration(-1)
	for _, tc := range []struct {
		name string
		// steps: "list@T" (a LIST with news at T ms), "quiet@T" (one
		// without), "410", "live", "watch" (a WATCH request sent)
		steps []string
		now   time.Duration // when due is asked
		want  time.Duration // none: no list
	}{
		{"no storm: a slow WATCH answer is waited on", []string{"list@0", "watch"}, 100 * ms, none},
		{"storm: 500 ms after the last LIST", []string{"410@0", "list@0", "watch"}, 100 * ms, 400 * ms},
		{"storm: a LIST overdue is due now", []string{"410@0", "list@0", "watch"}, 700 * ms, 0},
		{"a LIST without news doubles the wait", []string{"410@0", "quiet@0", "watch"}, 100 * ms, 900 * ms},
		{"and again", []string{"410@0", "quiet@0", "quiet@1000", "watch"}, 1000 * ms, 2000 * ms},
		{"news starts it again", []string{"410@0", "quiet@0", "quiet@1000", "list@3000", "watch"}, 3000 * ms, 500 * ms},
		{"a live watch starts it again", []string{"410@0", "quiet@0", "quiet@1000", "live", "watch"}, 1000 * ms, 500 * ms},
		{"a live watch does not end the storm", []string{"410@0", "list@2000", "live", "watch"}, 2200 * ms, 300 * ms},
		{"within 10 s of the last 410", []string{"410@0", "list@9000", "watch"}, 9200 * ms, 300 * ms},
		{"not due after the storm ended, 10 s after the last 410", []string{"410@0", "list@9700", "watch"}, 9800 * ms, none},
		{"a new 410 goes on with it", []string{"410@0", "410@9000", "list@9700", "watch"}, 9800 * ms, 400 * ms},
		{"at most stormListsPerWatch per WATCH request", []string{"410@0", "watch", "sent", "sent", "sent", "sent"}, 0, none},
		{"a new WATCH request may list again", []string{"410@0", "watch", "sent", "sent", "sent", "sent", "watch"}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStormLists()
			for _, step := range tc.steps {
				op, at, _ := strings.Cut(step, "@")
				var atMs int
				if at != "" {
					if _, err := fmt.Sscan(at, &atMs); err != nil {
						t.Fatal(err)
					}
				}
				now := t0.Add(time.Duration(atMs) * ms)
				switch op {
				case "list", "quiet":
					s.listed(now, op == "list")
				case "410":
					s.expired(now)
				case "live":
					s.live()
				case "watch":
					s.watchSent()
				case "sent":
					s.sent++
				default:
					t.Fatalf("unknown step %q", step)
				}
			}
			d, ok := s.due(t0.Add(tc.now))
			if !ok {
				d = none
			}
			if d != tc.want {
				t.Errorf("due %s, want %s", d, tc.want)
			}
		})
	}
}

// TestStormListsReachTheHandlerWhileTheWatchIsUnanswered: in a 410 storm
// whose WATCH requests are answered late (issue 19's harsh storm with WATCH
// answers 1 s late), a pod that finishes after the relist reaches the
// handler from a storm list while the WATCH request is still unanswered,
// not after its answer; the storm lists per WATCH request are bounded; and
// when the WATCH request is answered, its older events do not move the pod
// backwards. A watch that is only slow to answer, without a 410, gets no
// storm list.
func TestStormListsReachTheHandlerWhileTheWatchIsUnanswered(t *testing.T) {
	running, finished := testPod("a", "10"), testPod("a", "12")
	running.Status.Phase, finished.Status.Phase = corev1.PodRunning, corev1.PodSucceeded
	s := &streamingLW{pods: []corev1.Pod{running}, rv: 10, watching: make(chan *watch.FakeWatcher, 100)}
	rec := &recorder{}
	opts := testCacheOptions(rec)
	opts.StormListEvery = 50 * time.Millisecond
	c := newPodCache(s.lw(), opts)
	runCache(t, c)
	waitFor(t, "the cache synced", c.HasSynced)
	if got := rec.take(); !slices.Equal(got, []string{"add ns/a 10"}) {
		t.Fatalf("first list: handler calls %q", got)
	}
	lists := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.lists
	}

	// A slow WATCH answer without a 410: the relist after the ended
	// watch, and no storm list.
	first := <-s.watching
	s.mu.Lock()
	s.hold = make(chan struct{})
	s.mu.Unlock()
	lists0 := lists()
	first.Stop() // the watch ends (at once: client-go relists); the next WATCH request waits
	waitFor(t, "the relist", func() bool { return lists() > lists0 })
	time.Sleep(10 * opts.StormListEvery)
	if n := lists() - lists0; n != 1 {
		t.Errorf("%d LISTs while a WATCH request waited without a 410, want the relist only", n)
	}
	s.mu.Lock()
	close(s.hold)
	s.hold = nil
	s.mu.Unlock()
	lists0 = lists()

	// A 410: the relist, then a WATCH request that is not answered; the pod
	// finishes meanwhile.
	second := <-s.watching
	s.mu.Lock()
	s.hold = make(chan struct{})
	s.mu.Unlock()
	expired := apierrors.NewResourceExpired("too old resource version").Status()
	second.Error(&expired)
	waitFor(t, "the relist", func() bool { return lists() > lists0 })
	s.mu.Lock()
	s.pods, s.rv = []corev1.Pod{finished}, 12
	s.mu.Unlock()
	waitFor(t, "the finished pod reaches the handler", func() bool {
		got := rec.take()
		if len(got) > 0 && !slices.Equal(got, []string{"update ns/a 12"}) {
			t.Fatalf("handler calls %q, want [update ns/a 12]", got)
		}
		return len(got) > 0
	})
	// The WATCH request is still unanswered: the storm lists stop after
	// stormListsPerWatch.
	waitFor(t, "the storm lists end", func() bool { return lists()-lists0 == 1+stormListsPerWatch })
	time.Sleep(10 * opts.StormListEvery)
	if n := lists() - lists0; n != 1+stormListsPerWatch {
		t.Errorf("%d LISTs while one WATCH request waited after a 410, want the relist and %d", n, stormListsPerWatch)
	}

	// The WATCH request is answered, from the relist's version: an event
	// older than the storm list's does not move the pod backwards.
	s.mu.Lock()
	close(s.hold)
	s.hold = nil
	s.mu.Unlock()
	third := <-s.watching
	between := testPod("a", "11")
	between.Status.Phase = corev1.PodRunning
	third.Modify(&between)
	newer := testPod("a", "13")
	newer.Status.Phase = corev1.PodSucceeded
	third.Modify(&newer)
	waitFor(t, "the newer event", func() bool {
		got := rec.take()
		if len(got) > 0 && !slices.Equal(got, []string{"update ns/a 13"}) {
			t.Fatalf("handler calls %q, want [update ns/a 13] (the older event dropped)", got)
		}
		return len(got) > 0
	})
}

// TestRelistReadsNoOlderThanAStormList: the Reflector's relist from a
// resourceVersion asks for the last storm list's when it is newer.
func TestRelistReadsNoOlderThanAStormList(t *testing.T) {
	c := newPodCache(newFakeLW().lw(), testCacheOptions(&recorder{}))
	c.floor = "20"
	for _, tc := range []struct {
		opts metav1.ListOptions
		want string
	}{
		{metav1.ListOptions{ResourceVersion: "10"}, "20"},
		{metav1.ListOptions{ResourceVersion: "30"}, "30"},
		{metav1.ListOptions{ResourceVersion: ""}, ""},   // the latest already
		{metav1.ListOptions{ResourceVersion: "0"}, "0"}, // the first list: any
		{metav1.ListOptions{ResourceVersion: "10", Continue: "next"}, "10"},
		{metav1.ListOptions{ResourceVersion: "10", ResourceVersionMatch: metav1.ResourceVersionMatchExact}, "10"},
	} {
		if got := c.relistVersion(tc.opts); got != tc.want {
			t.Errorf("relist with %+v asks for %q, want %q", tc.opts, got, tc.want)
		}
	}
}

// TestStormListInFlightIsHandedOverBeforeTheWatch: a storm list sent
// before the WATCH request is answered, and answered after it (a LIST slow
// under load), is still handed over, and before any event of the watch: the
// watch's older event does not move the pod backwards and its deletion
// comes after. (Cut at the answer, the finished pod waited for the relist
// after the next 410: seen in the harsh storm at machine load 20-30.)
func TestStormListInFlightIsHandedOverBeforeTheWatch(t *testing.T) {
	running, finished := testPod("a", "10"), testPod("a", "12")
	running.Status.Phase, finished.Status.Phase = corev1.PodRunning, corev1.PodSucceeded
	s := &streamingLW{pods: []corev1.Pod{running}, rv: 10, watching: make(chan *watch.FakeWatcher, 100)}
	lw := s.lw()
	list := lw.ListWithContextFunc
	var listN atomic.Int32
	listHold, listing := make(chan struct{}), make(chan struct{}, 10)
	lw.ListWithContextFunc = func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		if listN.Add(1) >= 3 { // the storm lists: held
			listing <- struct{}{}
			select {
			case <-listHold:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return list(ctx, opts)
	}
	rec := &recorder{}
	opts := testCacheOptions(rec)
	opts.StormListEvery = time.Second // also how long the answer waits for a storm list in flight
	c := newPodCache(lw, opts)
	runCache(t, c)
	waitFor(t, "the cache synced", c.HasSynced)
	rec.take()

	first := <-s.watching
	s.mu.Lock()
	s.hold = make(chan struct{})
	s.mu.Unlock()
	expired := apierrors.NewResourceExpired("too old resource version").Status()
	first.Error(&expired)
	select { // the relist, then the storm list, held
	case <-listing:
	case <-time.After(10 * time.Second):
		t.Fatal("no storm list within 10 s of the 410")
	}
	s.mu.Lock()
	s.pods, s.rv = []corev1.Pod{finished}, 12
	close(s.hold) // the WATCH request is answered while the storm list is in flight
	s.hold = nil
	s.mu.Unlock()
	second := <-s.watching
	close(listHold)
	between := testPod("a", "11")
	second.Modify(&between)
	gone := testPod("a", "13")
	second.Delete(&gone)
	want := []string{"update ns/a 12", "delete ns/a 13"}
	var got []string
	waitFor(t, "the watch's deletion", func() bool {
		got = append(got, rec.take()...)
		return len(got) >= 2 || slices.Contains(got, "delete ns/a 13")
	})
	if !slices.Equal(got, want) {
		t.Errorf("handler calls %q, want %q", got, want)
	}
}
