package replica

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	coordv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/pkg/executor"
)

// slowClient is a clientset whose updates of the Lease named slow wait,
// while hold is set, until released or their context ends: an API server
// that takes long to write (etcd on a loaded machine). Everything else,
// the informer's watch included, answers at once.
type slowClient struct {
	kubernetes.Interface
	slow    string
	mu      sync.Mutex
	hold    bool
	release chan struct{}
	blocked chan struct{} // closed when an update first waits
	once    sync.Once
}

// IsWatchListSemanticsUnSupported passes on the fake clientset's answer,
// so that the informer lists and watches instead of waiting for a
// watch-list stream the fake never sends.
func (c *slowClient) IsWatchListSemanticsUnSupported() bool { return true }

func (c *slowClient) CoordinationV1() coordv1client.CoordinationV1Interface {
	return slowCoord{c.Interface.CoordinationV1(), c}
}

type slowCoord struct {
	coordv1client.CoordinationV1Interface
	c *slowClient
}

func (s slowCoord) Leases(ns string) coordv1client.LeaseInterface {
	return slowLeases{s.CoordinationV1Interface.Leases(ns), s.c}
}

type slowLeases struct {
	coordv1client.LeaseInterface
	c *slowClient
}

func (s slowLeases) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	s.c.mu.Lock()
	hold := s.c.hold && l.Name == s.c.slow
	s.c.mu.Unlock()
	if hold {
		s.c.once.Do(func() { close(s.c.blocked) })
		select {
		case <-s.c.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.LeaseInterface.Update(ctx, l, opts)
}

// settled records what the membership loop decided, each time.
type settled struct {
	mu    sync.Mutex
	n     int
	live  []string
	block func()        // when set, the next decision calls it first
	since chan struct{} // closed and replaced on every decision
}

func newSettled() *settled { return &settled{since: make(chan struct{})} }

func (s *settled) settle(_ context.Context, _ []int, live []string) {
	s.mu.Lock()
	if b := s.block; b != nil {
		s.block = nil
		s.mu.Unlock()
		b()
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	s.n++
	s.live = slices.Clone(live)
	slices.Sort(s.live)
	close(s.since)
	s.since = make(chan struct{})
}

// waitLive waits (real time) until the loop decided that live are the live
// members.
func (s *settled) waitLive(t *testing.T, within time.Duration, live ...string) {
	t.Helper()
	slices.Sort(live)
	deadline := time.After(within)
	for {
		s.mu.Lock()
		got, ch := s.live, s.since
		s.mu.Unlock()
		if slices.Equal(got, live) {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("the membership loop still sees members %v after %s, want %v", got, within, live)
		}
	}
}

// waitDecisions waits (real time) until the loop made n decisions.
func (s *settled) waitDecisions(t *testing.T, within time.Duration, n int) {
	t.Helper()
	deadline := time.After(within)
	for {
		s.mu.Lock()
		got, ch := s.n, s.since
		s.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("the membership loop made no decision for %s after the Leases changed", within)
		}
	}
}

// decisions returns how many decisions the loop made and the last one.
func (s *settled) decisions() (int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.live
}

func memberLease(identity, group string, renew time.Time, secs int32) *coordinationv1.Lease {
	l := lease(MemberLeaseName(group, identity), identity, renew, secs)
	l.Namespace = "ns"
	l.Labels = map[string]string{LabelGroup: group}
	return l
}

// testReplica is a Replica on client and clk whose decisions go to s
// instead of starting executors.
func testReplica(t *testing.T, client kubernetes.Interface, clk *clocktesting.FakeClock, s *settled) *Replica {
	t.Helper()
	cfg := Config{
		Client: client, Namespace: "ns", Group: "g", Identity: "me", Shards: 2,
		LeaseDuration: 6 * time.Second, RetryPeriod: time.Second, Clock: clk,
		Executor: func(int) executor.Config { return executor.Config{} },
		Logger:   slog.New(slog.DiscardHandler),
	}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	return &Replica{
		cfg: cfg, log: cfg.Logger, running: map[int]*shardRun{}, byID: map[string]int{},
		owned:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "test"}),
		settle: s.settle,
	}
}

// startReplica runs r until stop, which returns once Run returned; ctx is
// Run's.
func startReplica(r *Replica) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	return ctx, func() {
		cancel()
		<-done
	}
}

// TestExpiryNoticedWhileRenewalHangs: another member's Lease that stops
// being renewed is judged expired when its duration has passed since this
// process saw its last renewal, also while this replica's own renewal
// hangs in a slow API server (it took 2.6 s more than the lease under load
// in TestReplicasFailOver when the renewal held up the look at expiry);
// and not one instant before.
func TestExpiryNoticedWhileRenewalHangs(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	fc := fake.NewClientset(memberLease("B", "g", t0.Add(-time.Hour), 6))
	client := &slowClient{Interface: fc, slow: MemberLeaseName("g", "me"), release: make(chan struct{}), blocked: make(chan struct{})}
	s := newSettled()
	r := testReplica(t, client, clk, s)
	ctx, stop := startReplica(r)
	defer stop()
	defer close(client.release)              // before stop: a renewal may hang in it
	s.waitLive(t, 10*time.Second, "me", "B") // B seen renewed at t0

	// From now on this replica's renewals hang; time passes until one of
	// them is stuck.
	client.mu.Lock()
	client.hold = true
	client.mu.Unlock()
	deadline := time.After(10 * time.Second)
	for stuck := false; !stuck; {
		select {
		case <-client.blocked:
			stuck = true
		case <-deadline:
			t.Fatal("no renewal of the membership lease after 10 s")
		case <-time.After(5 * time.Millisecond):
			if clk.Since(t0) < 4*time.Second {
				clk.Step(50 * time.Millisecond)
			}
		}
	}

	// Just before B's duration has passed: B still counts, however often
	// the loop looks (a change of another Lease makes it look).
	clk.SetTime(t0.Add(6*time.Second - time.Millisecond))
	n, _ := s.decisions()
	if _, err := fc.CoordinationV1().Leases("ns").Create(ctx, memberLease("C", "other-group", t0, 6), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitDecisions(t, 10*time.Second, n+1)
	if _, live := s.decisions(); !slices.Equal(live, []string{"B", "me"}) {
		t.Fatalf("1 ms before B's lease expired the loop decided members %v: B taken for gone too early", live)
	}

	// At expiry: B is gone, at once, though the renewal still hangs.
	waitTimer(t, clk)
	clk.SetTime(t0.Add(6 * time.Second))
	s.waitLive(t, 5*time.Second, "me")
}

// waitTimer waits (real time) until the membership loop, after its last
// decision, waits on its timer: the fake clock then has two waiters, that
// timer and the renewal's ticker. A clock set before the loop made its timer
// would leave the timer due a whole step after the new time, on a clock that
// no longer moves (TestExpiryNoticedWhileRenewalHangs failed so once in 9
// runs at load 30).
func waitTimer(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for clk.Waiters() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the membership loop set no timer: %d waiters on the clock", clk.Waiters())
		}
		time.Sleep(time.Millisecond) // polled: the fake clock has no hook for a new waiter
	}
}

// blockNext makes the next decision of s wait until the returned
// release is called; entered is closed when it waits.
func (s *settled) blockNext() (entered chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	entered, gate := make(chan struct{}), make(chan struct{})
	s.block = func() {
		close(entered)
		<-gate
	}
	var once sync.Once
	return entered, func() { once.Do(func() { close(gate) }) }
}

// TestRenewalStampedWhenItArrives: a renewal of another member's Lease
// that arrives while the membership loop is busy (starting executors,
// freeing Leases on a slow API server) counts from its arrival, not from
// when the loop gets to it: else expiry is judged late by as long as the
// loop was busy.
func TestRenewalStampedWhenItArrives(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	b := memberLease("B", "g", t0.Add(-time.Hour), 6)
	fc := fake.NewClientset(b)
	s := newSettled()
	r := testReplica(t, fc, clk, s)
	ctx, stop := startReplica(r)
	defer stop()
	s.waitLive(t, 10*time.Second, "me", "B")
	// The loop gets busy on its next look (a change of another Lease).
	entered, release := s.blockNext()
	defer release()
	if _, err := fc.CoordinationV1().Leases("ns").Create(ctx, memberLease("C", "other-group", t0, 6), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the membership loop made no second decision")
	}

	// B renews at t1 while the loop is busy; the loop gets to it 2 s later.
	t1 := t0.Add(time.Second)
	clk.SetTime(t1)
	b = b.DeepCopy()
	renew := metav1.NewMicroTime(t0.Add(-time.Hour + time.Second))
	b.Spec.RenewTime = &renew
	if _, err := fc.CoordinationV1().Leases("ns").Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	obs := r.obs
	r.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		obs.mu.Lock()
		o := obs.members[b.Name]
		obs.mu.Unlock()
		if o.renew == renew.UTC().Format(time.RFC3339Nano) {
			if !o.at.Equal(t1) {
				t.Fatalf("B's renewal stamped %s, want its arrival %s", o.at, t1)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B's renewal not noted 10 s after it was written while the membership loop was busy")
		}
		time.Sleep(5 * time.Millisecond) // polled: the informer's delivery has no hook
	}
	clk.SetTime(t1.Add(2 * time.Second))
	n, _ := s.decisions()
	release()
	s.waitDecisions(t, 10*time.Second, n+1)
	if _, live := s.decisions(); !slices.Equal(live, []string{"B", "me"}) {
		t.Fatalf("B renewed 2 s ago, the loop decided members %v", live)
	}

	// B's duration after its renewal arrived: gone, though the loop saw
	// the renewal 2 s later.
	waitTimer(t, clk)
	clk.SetTime(t1.Add(6 * time.Second))
	s.waitLive(t, 5*time.Second, "me")
}
