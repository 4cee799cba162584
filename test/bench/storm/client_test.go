package storm

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// stormClient is the executor's client (Config.Client) with the storm's
// fault and its measurement:
//
//   - Drop ends every pod watch the executor has open, as a connection reset
//     or an API server rollout does, and holds the watches that resume from
//     a resourceVersion until Release. A watch that is up is not ended by an
//     etcd compaction (etcd cancels only the watchers that are behind), so
//     the storm drops them and compacts meanwhile: each then resumes from
//     its last resourceVersion, which the compaction made too old, and gets
//     410 Expired. (Without the hold, a pod event between the compaction and
//     the resumption would bring the watch past the compaction: no 410.)
//   - SetWatchDelay makes every pod WATCH request of the executor (a
//     resumption or a streaming list) wait that long before it is sent, as
//     an API server or a proxy that is slow to answer watches does; LISTs
//     are not delayed.
//   - The trace notes when the executor's pod watches delivered 410
//     Expired, when its pod LISTs succeeded, and from that how long the
//     executor could not see pod changes (see watchTrace); it keeps a
//     timeline of these steps (watchTrace.timeline).
type stormClient struct {
	kubernetes.Interface
	trace *watchTrace
}

func newStormClient(c kubernetes.Interface) *stormClient {
	return &stormClient{Interface: c, trace: &watchTrace{open: map[*tracedWatch]struct{}{}}}
}

// Drop ends every pod watch the executor has open; a watch that resumes
// from a resourceVersion waits until Release.
func (c *stormClient) Drop() { c.trace.drop() }

// HoldAfterList makes the next successful pod LIST hold the WATCH requests
// that resume from a resourceVersion until Release, as an API server slow
// to answer them would: after a drop that ends in 410 Expired, the relist's
// WATCH request stays unanswered.
func (c *stormClient) HoldAfterList() {
	c.trace.mu.Lock()
	defer c.trace.mu.Unlock()
	c.trace.holdAfterList = true
}

// Held returns how many WATCH requests are held now, and how many pod LISTs
// were sent while one was: consistent reads (resourceVersion "") and others.
func (c *stormClient) Held() (waiting, consistentLists, otherLists int) {
	c.trace.mu.Lock()
	defer c.trace.mu.Unlock()
	return c.trace.waiting, c.trace.heldLists, c.trace.heldOtherLists
}

// Release lets the watches that Drop held go on.
func (c *stormClient) Release() { c.trace.release() }

// SetWatchDelay delays every pod WATCH request of the executor by d from now
// on (0: none).
func (c *stormClient) SetWatchDelay(d time.Duration) {
	c.trace.mu.Lock()
	defer c.trace.mu.Unlock()
	c.trace.delay = d
}

func (c *stormClient) CoreV1() corev1client.CoreV1Interface {
	return tracedCore{CoreV1Interface: c.Interface.CoreV1(), trace: c.trace}
}

type tracedCore struct {
	corev1client.CoreV1Interface
	trace *watchTrace
}

func (c tracedCore) Pods(ns string) corev1client.PodInterface {
	return tracedPods{PodInterface: c.CoreV1Interface.Pods(ns), trace: c.trace}
}

type tracedPods struct {
	corev1client.PodInterface
	trace *watchTrace
}

func (p tracedPods) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	p.trace.note("LIST rv=%q", opts.ResourceVersion)
	p.trace.mu.Lock()
	if p.trace.waiting > 0 {
		if opts.ResourceVersion == "" {
			p.trace.heldLists++
		} else {
			p.trace.heldOtherLists++
		}
	}
	p.trace.mu.Unlock()
	l, err := p.PodInterface.List(ctx, opts)
	if err == nil {
		p.trace.note("LIST done: %d pods at rv %s", len(l.Items), l.ResourceVersion)
		p.trace.listed()
	} else {
		p.trace.note("LIST failed: %v", err)
	}
	return l, err
}

func (p tracedPods) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	streaming := opts.SendInitialEvents != nil && *opts.SendInitialEvents
	p.trace.note("WATCH rv=%q streaming=%v", opts.ResourceVersion, streaming)
	if !streaming && opts.ResourceVersion != "" {
		if err := p.trace.held(ctx); err != nil {
			return nil, err
		}
	}
	if err := p.trace.delayed(ctx); err != nil {
		return nil, err
	}
	w, err := p.PodInterface.Watch(ctx, opts)
	if err != nil {
		p.trace.note("WATCH refused: %v", err)
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			p.trace.expired()
		}
		return w, err
	}
	p.trace.note("WATCH sent")
	return p.trace.add(w, streaming), nil
}

// watchTrace records what the executor's pod watches and LISTs did.
//
// The executor is blind from the moment Drop ended its watches (or, without
// a drop, a watch delivered 410 Expired) until it again has a view of the
// pods that is current: a LIST succeeded (or a streaming list delivered its
// initial-events-end bookmark), or a watch opened after the drop delivered a
// change (it resumed without a gap). blind holds those intervals.
type watchTrace struct {
	mu         sync.Mutex
	open       map[*tracedWatch]struct{}
	generation int       // Drop calls so far; a watch opened after the last one resumes the view
	blindSince time.Time // zero while the executor sees pod changes
	nExpired   int       // 410 Expired on the executor's pod watches
	nLists     int       // successful LISTs and streaming lists
	blind      []interval
	hold       chan struct{} // while not nil, resumed watches wait until it is closed
	delay      time.Duration // every WATCH request waits this long before it is sent
	relists    []time.Time   // when each successful LIST or streaming list ended
	steps      []step        // the timeline

	// holdAfterList: the next successful LIST holds the WATCH requests
	// that resume from a resourceVersion until Release (HoldAfterList).
	holdAfterList bool
	waiting       int // WATCH requests held now
	// LISTs sent while a WATCH request was held: consistent reads
	// (resourceVersion "", the pod cache's storm lists) and the others.
	heldLists, heldOtherLists int
}

// step is one line of the trace's timeline.
type step struct {
	at   time.Time
	what string
}

// note adds a step to the timeline.
func (t *watchTrace) note(format string, args ...any) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.steps = append(t.steps, step{now, fmt.Sprintf(format, args...)})
}

// timeline returns the steps in [from, to).
func (t *watchTrace) timeline(from, to time.Time) []step {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []step
	for _, s := range t.steps {
		if !s.at.Before(from) && s.at.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// relistsIn returns when each successful relist in [from, to) ended.
func (t *watchTrace) relistsIn(from, to time.Time) []time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []time.Time
	for _, at := range t.relists {
		if !at.Before(from) && at.Before(to) {
			out = append(out, at)
		}
	}
	return out
}

// delayed waits for the watch delay.
func (t *watchTrace) delayed(ctx context.Context) error {
	t.mu.Lock()
	d := t.delay
	t.mu.Unlock()
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// interval is one period the executor was blind.
type interval struct{ start, end time.Time }

func (i interval) length() time.Duration { return i.end.Sub(i.start) }

func (t *watchTrace) add(w watch.Interface, streaming bool) watch.Interface {
	t.mu.Lock()
	defer t.mu.Unlock()
	tw := &tracedWatch{inner: w, trace: t, generation: t.generation, streaming: streaming,
		result: make(chan watch.Event), stopped: make(chan struct{})}
	t.open[tw] = struct{}{}
	go tw.forward()
	return tw
}

func (t *watchTrace) drop() {
	t.note("drop")
	t.mu.Lock()
	open := t.open
	t.open = map[*tracedWatch]struct{}{}
	t.generation++
	if t.hold == nil {
		t.hold = make(chan struct{})
	}
	if t.blindSince.IsZero() && len(open) > 0 {
		t.blindSince = time.Now()
	}
	t.mu.Unlock()
	for w := range open {
		w.end()
	}
}

func (t *watchTrace) release() {
	t.note("release")
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.hold != nil {
		close(t.hold)
		t.hold = nil
	}
}

// held waits while a drop holds resumed watches.
func (t *watchTrace) held(ctx context.Context) error {
	t.mu.Lock()
	hold := t.hold
	if hold != nil {
		t.waiting++
		defer func() {
			t.mu.Lock()
			t.waiting--
			t.mu.Unlock()
		}()
	}
	t.mu.Unlock()
	if hold == nil {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-hold:
		return nil
	}
}

func (t *watchTrace) expired() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nExpired++
	if t.blindSince.IsZero() {
		t.blindSince = time.Now()
	}
}

func (t *watchTrace) listed() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holdAfterList {
		t.holdAfterList = false
		if t.hold == nil {
			t.hold = make(chan struct{})
		}
	}
	t.nLists++
	t.relists = append(t.relists, time.Now())
	t.seeing()
}

// seeing ends a blind interval; t.mu is held.
func (t *watchTrace) seeing() {
	if !t.blindSince.IsZero() {
		t.blind = append(t.blind, interval{t.blindSince, time.Now()})
		t.blindSince = time.Time{}
	}
}

// counts returns the 410s and the successful lists so far.
func (t *watchTrace) counts() (expired, lists int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nExpired, t.nLists
}

// blindIn returns the blind intervals that started in [from, to), an
// interval still open at to ending at to.
func (t *watchTrace) blindIn(from, to time.Time) []interval {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []interval
	all := t.blind
	if !t.blindSince.IsZero() {
		all = append(all[:len(all):len(all)], interval{t.blindSince, to})
	}
	for _, i := range all {
		if !i.start.Before(from) && i.start.Before(to) {
			out = append(out, i)
		}
	}
	return out
}

// tracedWatch is one pod watch of the executor. Ended by a drop, it closes
// its result channel without an error, as a watch whose connection was
// reset does (client-go then resumes from its last resourceVersion); what
// the underlying watch reports after that (a decoding error of the closed
// body) is not passed on.
type tracedWatch struct {
	inner      watch.Interface
	trace      *watchTrace
	generation int
	streaming  bool
	result     chan watch.Event
	stopped    chan struct{}
	once       sync.Once
}

func (w *tracedWatch) forward() {
	defer close(w.result)
	defer w.inner.Stop()
	for {
		select {
		case <-w.stopped:
			return
		case ev, ok := <-w.inner.ResultChan():
			if !ok {
				w.trace.note("WATCH ended by the server")
				return
			}
			w.event(ev)
			select {
			case <-w.stopped:
				return
			case w.result <- ev:
			}
		}
	}
}

func (w *tracedWatch) event(ev watch.Event) {
	t := w.trace
	switch {
	case ev.Type == watch.Error:
		err := apierrors.FromObject(ev.Object)
		t.note("WATCH error event: %v", err)
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			t.expired()
		}
	case w.streaming:
		if m, ok := ev.Object.(metav1.Object); ok && ev.Type == watch.Bookmark && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
			t.note("streaming list done at rv %s", m.GetResourceVersion())
			t.listed()
		}
	case ev.Type != watch.Bookmark:
		t.mu.Lock()
		if w.generation == t.generation {
			t.seeing()
		}
		t.mu.Unlock()
	}
}

func (w *tracedWatch) end() { w.once.Do(func() { close(w.stopped) }) }

// ResultChan is the watch's events.
func (w *tracedWatch) ResultChan() <-chan watch.Event { return w.result }

// Stop is the executor ending the watch itself.
func (w *tracedWatch) Stop() {
	w.trace.mu.Lock()
	delete(w.trace.open, w)
	w.trace.mu.Unlock()
	w.end()
}
