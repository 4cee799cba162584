package replica

import (
	"context"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	coordlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/pkg/executor"
)

func lease(name, holder string, renew time.Time, secs int32) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if holder != "" {
		l.Spec.HolderIdentity = &holder
	}
	if !renew.IsZero() {
		rt := metav1.NewMicroTime(renew)
		l.Spec.RenewTime = &rt
	}
	l.Spec.LeaseDurationSeconds = &secs
	return l
}

// TestLiveMembers: a member is live while its renew time changed within
// its duration by this process's clock (the renew time's own value, from
// another machine's clock, is never compared with ours).
func TestLiveMembers(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	far := t0.Add(-time.Hour) // a remote clock far behind: does not matter
	for _, tc := range []struct {
		name     string
		steps    [][]*coordinationv1.Lease // lease lists seen at t0, t0+5s, t0+10s...
		leaving  bool
		want     []string // at the last step
		wantSeen int      // observations kept
	}{
		{name: "self only", steps: [][]*coordinationv1.Lease{nil}, want: []string{"me"}},
		{name: "leaving: not self", steps: [][]*coordinationv1.Lease{nil}, leaving: true, want: nil},
		{name: "a new lease counts at once, whatever its renew time", steps: [][]*coordinationv1.Lease{{lease("a", "A", far, 15)}}, want: []string{"me", "A"}, wantSeen: 1},
		{name: "renewed: stays", steps: [][]*coordinationv1.Lease{
			{lease("a", "A", far, 15)}, {lease("a", "A", far.Add(2*time.Second), 15)}, {lease("a", "A", far.Add(4*time.Second), 15)}, {lease("a", "A", far.Add(6*time.Second), 15)},
		}, want: []string{"me", "A"}, wantSeen: 1},
		{name: "not renewed for its duration: gone", steps: [][]*coordinationv1.Lease{
			{lease("a", "A", far, 15)}, {lease("a", "A", far, 15)}, {lease("a", "A", far, 15)}, {lease("a", "A", far, 15)},
		}, want: []string{"me"}, wantSeen: 1},
		{name: "released (no holder)", steps: [][]*coordinationv1.Lease{{lease("a", "", far, 15)}}, want: []string{"me"}, wantSeen: 1},
		{name: "deleted: forgotten", steps: [][]*coordinationv1.Lease{{lease("a", "A", far, 15)}, nil}, want: []string{"me"}},
		{name: "a stale lease of my own identity counts once", steps: [][]*coordinationv1.Lease{{lease("m", "me", far, 15), lease("b", "B", far, 15)}}, want: []string{"me", "B"}, wantSeen: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			observed := map[string]observation{}
			var got []string
			for i, ls := range tc.steps {
				got = liveMembers(ls, observed, "me", tc.leaving, t0.Add(time.Duration(i)*5*time.Second))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("live = %v, want %v", got, tc.want)
			}
			if len(observed) != tc.wantSeen {
				t.Errorf("%d observations kept, want %d", len(observed), tc.wantSeen)
			}
		})
	}
}

// TestExpiredShards: a shard Lease is free to take only when its holder is
// not a live member and its renew time has not changed, as this process
// saw it, for the Lease's duration.
func TestExpiredShards(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	r := &Replica{cfg: Config{Group: "g", Shards: 3, Namespace: "ns", Identity: "me"}}
	name := func(k int) string { return executor.LeaseName(ShardID("g", k)) }
	for _, tc := range []struct {
		name   string
		leases func(step int) []*coordinationv1.Lease
		live   []string
		steps  int
		want   []int
		wait   []int         // shards held by a gone holder, not yet expired
		every  time.Duration // between steps; default 3 s
	}{
		{name: "dead holder, not renewed for the duration", steps: 3, live: []string{"me"},
			leases: func(int) []*coordinationv1.Lease { return []*coordinationv1.Lease{lease(name(0), "dead", t0, 6)} }, want: []int{0}},
		{name: "dead holder, first seen now: wait", steps: 1, live: []string{"me"},
			leases: func(int) []*coordinationv1.Lease { return []*coordinationv1.Lease{lease(name(0), "dead", t0, 6)} }, wait: []int{0}},
		{name: "dead holder, 1 ms before expiry: wait", steps: 2, every: 3*time.Second - time.Millisecond, live: []string{"me"},
			leases: func(int) []*coordinationv1.Lease { return []*coordinationv1.Lease{lease(name(0), "dead", t0, 3)} }, wait: []int{0}},
		{name: "holder still renews", steps: 3, live: []string{"me"},
			leases: func(i int) []*coordinationv1.Lease {
				return []*coordinationv1.Lease{lease(name(1), "slow", t0.Add(time.Duration(i)*time.Second), 6)}
			}, wait: []int{1}},
		{name: "holder a live member", steps: 3, live: []string{"me", "other"},
			leases: func(int) []*coordinationv1.Lease { return []*coordinationv1.Lease{lease(name(2), "other", t0, 6)} }},
		{name: "released or mine", steps: 3, live: []string{"me"},
			leases: func(int) []*coordinationv1.Lease {
				return []*coordinationv1.Lease{lease(name(0), "", t0, 6), lease(name(1), "me", t0, 6)}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			observed := map[string]observation{}
			var (
				got     map[int]*coordinationv1.Lease
				waiting map[int]bool
			)
			for i := range tc.steps {
				idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
				for _, l := range tc.leases(i) {
					l.Namespace = "ns"
					_ = idx.Add(l)
				}
				every := 3 * time.Second
				if tc.every != 0 {
					every = tc.every
				}
				got, waiting = r.expiredShards(coordlisters.NewLeaseLister(idx), observed, tc.live, t0.Add(time.Duration(i)*every))
			}
			var ks []int
			for k := range got {
				ks = append(ks, k)
			}
			slices.Sort(ks)
			if !slices.Equal(ks, tc.want) {
				t.Errorf("expired shards %v, want %v", ks, tc.want)
			}
			ks = nil
			for k := range waiting {
				ks = append(ks, k)
			}
			slices.Sort(ks)
			if !slices.Equal(ks, tc.wait) {
				t.Errorf("waiting shards %v, want %v", ks, tc.wait)
			}
		})
	}
}

// TestStartable: a shard whose Lease a gone holder still holds unexpired
// starts only once it expired, unless its executor already runs.
func TestStartable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		want    []int
		waiting map[int]bool
		running []int
		out     []int
	}{
		{"nothing waits", []int{0, 1, 2}, nil, nil, []int{0, 1, 2}},
		{"a gone holder's Lease not expired", []int{0, 1, 2}, map[int]bool{1: true}, []int{0}, []int{0, 2}},
		{"already running keeps running", []int{0, 1}, map[int]bool{0: true, 1: true}, []int{1}, []int{1}},
		{"waiting but not wanted", []int{0}, map[int]bool{3: true}, nil, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := startable(tc.want, tc.waiting, tc.running); !slices.Equal(got, tc.out) {
				t.Errorf("startable = %v, want %v", got, tc.out)
			}
		})
	}
}

// TestMembershipPerGroup: one process in two groups (a service over two
// clusters, two names for one cluster: their Leases in one namespace)
// keeps a membership Lease in each, each labelled with its group, and
// renewing one leaves the other as it was.
func TestMembershipPerGroup(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	fc := fake.NewClientset()
	east, west := testReplica(t, fc, clk, &settled{}), testReplica(t, fc, clk, &settled{})
	east.cfg.Group, west.cfg.Group = "svc-east", "svc-west"
	le, err := east.renewMember(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	lw, err := west.renewMember(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if le.Name == lw.Name {
		t.Fatalf("both groups' memberships are Lease %s", le.Name)
	}
	if _, err := west.renewMember(ctx, lw); err != nil {
		t.Fatal(err)
	}
	got, err := fc.CoordinationV1().Leases("ns").Get(ctx, le.Name, metav1.GetOptions{})
	if err != nil || got.Labels[LabelGroup] != "svc-east" {
		t.Errorf("east's membership after west's renewal: %v, %v; want it labelled svc-east", got.GetLabels(), err)
	}
}
