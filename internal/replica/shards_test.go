package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
)

// unrun returns the shards below min(from, to) that nobody runs while a
// replica old with from shards and a replica neu with to shards are the
// live members, each running its own assignment (what a mixed group did
// before a replica refused to join one).
func unrun(old, neu string, from, to int) []int {
	live := []string{old, neu}
	as, bs := Assign(live, from), Assign(live, to)
	var out []int
	for k := range min(from, to) {
		if as[k] != old && bs[k] != neu {
			out = append(out, k)
		}
	}
	return out
}

// TestJoinRefusedBesideAnotherShardCount (issue 31, item 6): a rolling
// update that changes --shards starts a replica of the new count beside a
// live one of the old count. Their assignments of the shards disagree, and
// some shard would be run by nobody while both live; so the new replica
// does not join while the old one lives: it waits, not ready, saying both
// counts and how to change --shards, and joins once the old one left. In
// both directions: raising the count and lowering it.
func TestJoinRefusedBesideAnotherShardCount(t *testing.T) {
	for _, tc := range []struct {
		from, to int
		old, neu string // names with which some shard would go unrun
	}{{12, 16, "kubetask-old", "kubetask-new"}, {16, 12, "kubetask-1", "kubetask-0"}} {
		t.Run(fmt.Sprintf("%d to %d", tc.from, tc.to), func(t *testing.T) {
			if len(unrun(tc.old, tc.neu, tc.from, tc.to)) == 0 {
				t.Fatalf("with %d and %d shards every shard has an owner: the case shows nothing", tc.from, tc.to)
			}
			g := newFakeGroups(store.Member{Identity: tc.old, LeaseNamespace: "leases", Shards: tc.from, Joined: 1})
			r := shardsReplica(t, fake.NewClientset(), g, tc.neu, tc.to)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.checkGroup(ctx) }()

			// It joined the store, looked, and looks again: it waits.
			deadline := time.Now().Add(10 * time.Second)
			for joins := 0; joins < 2; {
				select {
				case err := <-done:
					t.Fatalf("a replica with --shards %d joined a group with a live member of --shards %d (err %v): shards %v would be run by nobody",
						tc.to, tc.from, err, unrun(tc.old, tc.neu, tc.from, tc.to))
				case <-time.After(time.Millisecond): // polled: the fake has no signal
				}
				g.mu.Lock()
				joins = g.joins
				g.mu.Unlock()
				if time.Now().After(deadline) {
					t.Fatal("the replica did not look at the group twice in 10 s")
				}
			}
			err := r.Ready()
			for _, want := range []string{
				fmt.Sprintf("replica %s of group g runs with --shards %d, this one with --shards %d", tc.old, tc.from, tc.to),
				"stop every replica with --shards " + fmt.Sprint(tc.from) + " first",
				"a Deployment with strategy Recreate, or scale to 0 then up",
			} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Ready() = %v, want an error that says %q", err, want)
				}
			}
			var mixed *MixedShardsError
			if !errors.As(err, &mixed) || mixed.Shards != tc.to || mixed.Other.Shards != tc.from {
				t.Errorf("Ready() = %#v, want a *MixedShardsError of %d beside %d", err, tc.to, tc.from)
			}

			// The old replica leaves: the new one joins.
			if err := g.Leave(ctx, "g", tc.old); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("after the old replica left: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the replica did not join within 10 s of the old one leaving")
			}
			if err := r.Ready(); err != nil && !strings.Contains(err.Error(), "not yet a member") {
				t.Errorf("Ready() after joining the store = %v, want only that its Lease is not yet renewed", err)
			}
		})
	}
}

// TestJoinWaitEndsWithContext: a replica waiting to join forgets its entry
// in the store when its context ends, so that it keeps nobody waiting.
func TestJoinWaitEndsWithContext(t *testing.T) {
	g := newFakeGroups(store.Member{Identity: "old", LeaseNamespace: "leases", Shards: 12, Joined: 1})
	r := shardsReplica(t, fake.NewClientset(), g, "new", 16)
	ctx, cancel := context.WithCancel(context.Background())
	g.beforeJoin = func(store.Member) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.joins > 0 {
			cancel()
		}
	}
	if err := r.checkGroup(ctx); err != nil {
		t.Fatal(err)
	}
	ms, _ := g.Members(context.Background(), "g", time.Hour)
	if len(ms) != 1 || ms[0].Identity != "old" {
		t.Fatalf("members after the waiting replica stopped: %+v, want old alone", ms)
	}
}

// TestShardConflict: whether a replica may run shards beside the group's
// members as the store answered its Join, and if not, which member keeps it
// waiting. The rule: a member of another known shard count that joined
// before it (smaller Joined; the identity breaks a tie) keeps it waiting,
// the earliest such member is named; one that joined after it waits for
// it. Members of an unknown count (0: registered by a kubetask before the
// count was recorded) are taken to agree; an entry of its own identity is
// itself.
func TestShardConflict(t *testing.T) {
	m := func(id string, shards int, joined int64) store.Member {
		return store.Member{Identity: id, LeaseNamespace: "ns", Shards: shards, Joined: joined}
	}
	for _, tc := range []struct {
		name    string
		self    store.Member
		members []store.Member
		want    string // identity of the member that keeps self waiting; "" to join
	}{
		{"alone", m("me", 12, 1), nil, ""},
		{"same count, earlier", m("me", 12, 5), []store.Member{m("a", 12, 1), m("b", 12, 3)}, ""},
		{"raising: 12 joined earlier, this one 16", m("me", 16, 5), []store.Member{m("a", 12, 1)}, "a"},
		{"lowering: 16 joined earlier, this one 12", m("me", 12, 5), []store.Member{m("a", 16, 1)}, "a"},
		{"another count joined later: it waits, not this one", m("me", 16, 1), []store.Member{m("a", 12, 5)}, ""},
		{"the earliest of several is named", m("me", 16, 9), []store.Member{m("c", 12, 7), m("a", 12, 2), m("b", 16, 1)}, "a"},
		{"older kubetask (count unknown): taken to agree", m("me", 16, 5), []store.Member{m("a", 0, 0), m("b", 0, 1)}, ""},
		{"own entry of another count: itself", m("me", 16, 5), []store.Member{m("me", 12, 1)}, ""},
		{"same place: the smaller identity first", m("me", 16, 0), []store.Member{m("a", 12, 0)}, "a"},
		{"same place: a larger identity waits", m("a", 16, 0), []store.Member{m("me", 12, 0)}, ""},
		{"a waiting member of another count also keeps this one waiting", m("me", 12, 9), []store.Member{m("a", 12, 1), m("b", 16, 4)}, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := shardConflict(tc.self, append(tc.members, tc.self))
			switch {
			case tc.want == "" && got != nil:
				t.Errorf("kept waiting by %+v, want to join", *got)
			case tc.want != "" && got == nil:
				t.Errorf("joins, want to wait for %s", tc.want)
			case tc.want != "" && got.Identity != tc.want:
				t.Errorf("kept waiting by %s, want %s", got.Identity, tc.want)
			}
		})
	}
}

// TestConcurrentJoinsOfTwoCounts: two replicas of different --shards
// start at the same moment, their Joins meeting in the store. Never do
// both run shards: the one the store took first runs all of its shards,
// the other waits, not ready, naming both counts; once the first leaves,
// the other runs all of its own. Run for both orders of the counts.
func TestConcurrentJoinsOfTwoCounts(t *testing.T) {
	for _, counts := range [][2]int{{12, 16}, {16, 12}, {2, 3}, {3, 2}} {
		t.Run(fmt.Sprintf("%d and %d", counts[0], counts[1]), func(t *testing.T) {
			g := newFakeGroups()
			mon := &runMonitor{shards: map[string]int{}, running: map[string][]int{}}
			// Both Joins wait here until both arrived.
			var arrived sync.WaitGroup
			arrived.Add(2)
			var once sync.Map
			g.beforeJoin = func(m store.Member) {
				if _, again := once.LoadOrStore(m.Identity, true); !again {
					arrived.Done()
					arrived.Wait()
				}
			}
			g.onLeave = mon.stopped
			client := fake.NewClientset()
			ids := []string{"r-a", "r-b"}
			rs := map[string]*Replica{}
			stops := map[string]func(){}
			for i, id := range ids {
				r := shardsReplica(t, client, g, id, counts[i])
				mon.shards[id] = counts[i]
				r.settle = func(_ context.Context, want []int, _ []string) { mon.settle(id, want) }
				rs[id] = r
				_, stops[id] = startReplica(r)
			}
			defer func() {
				for _, stop := range stops {
					stop()
				}
			}()

			winner := mon.waitRunning(t, 10*time.Second)
			loser := ids[0]
			if loser == winner {
				loser = ids[1]
			}
			if got, want := mon.shardsOf(winner), mon.shards[winner]; len(got) != want {
				t.Errorf("%s runs shards %v, want all %d", winner, got, want)
			}
			ms, _ := g.Members(context.Background(), "g", time.Hour)
			for _, m := range ms {
				if m.Identity == loser && !slices.ContainsFunc(ms, func(o store.Member) bool { return o.Identity == winner && o.Joined < m.Joined }) {
					t.Errorf("%s runs, though %s joined the store first: %+v", winner, loser, ms)
				}
			}
			err := waitNotReady(t, rs[loser], 10*time.Second)
			if want := fmt.Sprintf("runs with --shards %d, this one with --shards %d", mon.shards[winner], mon.shards[loser]); !strings.Contains(err.Error(), want) {
				t.Errorf("%s not ready: %v; want it to say %q", loser, err, want)
			}

			stops[winner]()
			delete(stops, winner)
			mon.waitShards(t, 10*time.Second, loser, mon.shards[loser])
			if v := mon.violations(); len(v) > 0 {
				t.Fatalf("both counts ran shards at once:\n%s", strings.Join(v, "\n"))
			}
		})
	}
}

// shardsReplica is a replica of group g with shards shards on client and
// the real clock, checking the group in groups; its decisions go to its
// settle when set (else it starts no executors: the test sets it).
func shardsReplica(t *testing.T, client kubernetes.Interface, groups store.Groups, id string, shards int) *Replica {
	t.Helper()
	cfg := Config{
		Client: client, Namespace: "leases", Group: "g", Identity: id, Shards: shards,
		LeaseDuration: time.Second, RetryPeriod: 10 * time.Millisecond,
		Executor: func(int) executor.Config { return executor.Config{} },
		Groups:   groups,
		Logger:   slog.New(slog.DiscardHandler),
	}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	return &Replica{
		cfg: cfg, log: cfg.Logger, running: map[int]*shardRun{}, byID: map[string]int{},
		owned:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "test"}),
		settle: func(context.Context, []int, []string) {},
	}
}

// waitNotReady waits (real time) until r reports not ready for a reason
// other than not having renewed its Lease yet, and returns it.
func waitNotReady(t *testing.T, r *Replica, within time.Duration) error {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := r.Ready()
		if err != nil && !strings.Contains(err.Error(), "not yet a member") {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still says %v after %s", r.cfg.Identity, err, within)
		}
		time.Sleep(time.Millisecond) // polled: Ready has no signal
	}
}

// runMonitor follows the shards each replica's membership loop decided to
// run, and notes every moment two replicas of different counts ran some.
type runMonitor struct {
	mu      sync.Mutex
	shards  map[string]int   // replica -> its --shards
	running map[string][]int // replica -> shards it runs
	bad     []string
	changed chan struct{} // closed and replaced on every change
}

func (m *runMonitor) settle(id string, want []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.running[id] = slices.Clone(want)
	if len(want) > 0 {
		for other, ks := range m.running {
			if other != id && len(ks) > 0 && m.shards[other] != m.shards[id] {
				m.bad = append(m.bad, fmt.Sprintf("%s (%d shards) runs %v while %s (%d shards) runs %v", id, m.shards[id], want, other, m.shards[other], ks))
			}
		}
	}
	m.notifyLocked()
}

// stopped is the store's Leave of id: a replica leaves the store after its
// executors stopped.
func (m *runMonitor) stopped(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.running, id)
	m.notifyLocked()
}

func (m *runMonitor) notifyLocked() {
	if m.changed != nil {
		close(m.changed)
	}
	m.changed = make(chan struct{})
}

func (m *runMonitor) wait() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.changed == nil {
		m.changed = make(chan struct{})
	}
	return m.changed
}

func (m *runMonitor) shardsOf(id string) []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.running[id])
}

func (m *runMonitor) violations() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.bad)
}

// waitRunning waits until some replica runs shards and returns it.
func (m *runMonitor) waitRunning(t *testing.T, within time.Duration) string {
	t.Helper()
	deadline := time.After(within)
	for {
		ch := m.wait()
		m.mu.Lock()
		for id, ks := range m.running {
			if len(ks) > 0 {
				m.mu.Unlock()
				return id
			}
		}
		m.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no replica runs shards after %s", within)
		}
	}
}

// waitShards waits until id runs n shards.
func (m *runMonitor) waitShards(t *testing.T, within time.Duration, id string, n int) {
	t.Helper()
	deadline := time.After(within)
	for {
		ch := m.wait()
		if len(m.shardsOf(id)) == n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s runs shards %v after %s, want %d", id, m.shardsOf(id), within, n)
		}
	}
}

// countLease is a membership Lease of holder that says it runs with shards
// shards and joined at joined (no annotations when shards is 0: an older
// kubetask's).
func countLease(holder string, shards int, joined int64) *coordinationv1.Lease {
	l := memberLease(holder, "g", time.Unix(1_000_000, 0), 6)
	l.Name = MemberLeaseName("g", holder)
	if shards > 0 {
		l.Annotations = map[string]string{AnnotationShards: fmt.Sprint(shards), AnnotationJoined: fmt.Sprint(joined)}
	}
	return l
}

// TestPeers: while it runs, a replica reads the live members' shard counts
// in their membership Leases: it assigns the shards among those of its own
// count (or an unknown one), and runs none while one of another count that
// joined before it lives: the rule of joining, kept.
func TestPeers(t *testing.T) {
	self := store.Member{Identity: "me", Shards: 12, Joined: 5}
	for _, tc := range []struct {
		name    string
		live    []string
		leases  []*coordinationv1.Lease
		same    []string
		blocker string
	}{
		{"one count", []string{"me", "a", "b"}, []*coordinationv1.Lease{countLease("me", 12, 5), countLease("a", 12, 1), countLease("b", 12, 7)}, []string{"me", "a", "b"}, ""},
		{"an older kubetask's Lease: count unknown, assigned shards", []string{"me", "a"}, []*coordinationv1.Lease{countLease("a", 0, 0)}, []string{"me", "a"}, ""},
		{"another count joined after: left out of the assignment", []string{"me", "a", "b"}, []*coordinationv1.Lease{countLease("a", 12, 1), countLease("b", 16, 7)}, []string{"me", "a"}, ""},
		{"another count joined before: no shard for this one", []string{"me", "a", "b"}, []*coordinationv1.Lease{countLease("a", 12, 1), countLease("b", 16, 2)}, []string{"me", "a"}, "b"},
		{"lowering: 16 joined before 12", []string{"me", "b"}, []*coordinationv1.Lease{countLease("b", 16, 2)}, []string{"me"}, "b"},
		{"a member that is not live is not looked at", []string{"me"}, []*coordinationv1.Lease{countLease("b", 16, 2)}, []string{"me"}, ""},
		{"this one's own stale Lease of another count: itself", []string{"me"}, []*coordinationv1.Lease{countLease("me", 16, 1)}, []string{"me"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			same, blocker := peers(self, tc.live, tc.leases)
			if !slices.Equal(same, tc.same) {
				t.Errorf("shards assigned among %v, want %v", same, tc.same)
			}
			switch {
			case tc.blocker == "" && blocker != nil:
				t.Errorf("runs no shard because of %+v, want to run", *blocker)
			case tc.blocker != "" && (blocker == nil || blocker.Identity != tc.blocker):
				t.Errorf("kept from running by %v, want %s", blocker, tc.blocker)
			}
		})
	}
}

// TestRunsNoShardBesideAnEarlierCountInTheLeases: the store let this
// replica in (the other's heartbeats had not reached it for two lease
// durations), but the other's membership Lease is live and says it runs
// with another count and joined first: this replica runs no shard and is
// not ready, until that Lease goes.
func TestRunsNoShardBesideAnEarlierCountInTheLeases(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	other := countLease("B", 3, 1)
	other.Namespace = "ns"
	fc := fake.NewClientset(other)
	g := &fakeGroups{}
	g.table.Put("g", store.Member{Identity: "B", LeaseNamespace: "ns", Shards: 3, Joined: 1}, time.Now().Add(-time.Hour)) // quiet in the store
	r := testReplica(t, fc, clk, newSettled())
	r.cfg.Groups = g
	mon := &runMonitor{shards: map[string]int{"me": 2}, running: map[string][]int{}}
	var ran []int
	r.settle = func(_ context.Context, want []int, _ []string) {
		mon.settle("me", want)
		mon.mu.Lock()
		ran = append(ran, want...)
		mon.mu.Unlock()
	}
	ctx, stop := startReplica(r)
	defer stop()
	err := waitNotReady(t, r, 10*time.Second)
	var mixed *MixedShardsError
	if !errors.As(err, &mixed) || mixed.Other.Identity != "B" || mixed.Other.Shards != 3 {
		t.Fatalf("not ready: %v; want a MixedShardsError naming B with 3 shards", err)
	}
	if err := fc.CoordinationV1().Leases("ns").Delete(ctx, other.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mon.waitShards(t, 10*time.Second, "me", 2)
	mon.mu.Lock()
	defer mon.mu.Unlock()
	if n := len(ran); n != 2 {
		t.Errorf("shards run, over every decision: %v; want [0 1] once B's Lease went, none before", ran)
	}
	if err := r.Ready(); err != nil {
		t.Errorf("Ready() once B's Lease went: %v", err)
	}
}
