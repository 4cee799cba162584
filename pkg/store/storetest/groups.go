package storetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kubetask/kubetask/pkg/store"
)

// RunGroups runs the conformance suite of store.Groups against the
// implementations that open returns: members and what they registered
// (lease namespace, shard count) as the last heartbeat said, Leave, age,
// the join order (Member.Joined: kept by a member that stays, new for one
// that joins anew), and Joins at once: of any two, the later one's answer
// holds the earlier one's member, which the replicas' refusal of mixed
// shard counts rests on. open is called once per subtest and must return
// an implementation without members; the records it counts are not
// tested here.
func RunGroups(t *testing.T, open func(t *testing.T) store.Groups) {
	t.Helper()
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, g store.Groups)
	}{
		{"HeartbeatsMakeMembers", testGroupsHeartbeats},
		{"JoinOrder", testGroupsJoinOrder},
		{"ConcurrentJoinsSeeEarlierOnes", testGroupsConcurrentJoins},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t)) })
	}
}

// ignoreAge leaves Age out of a comparison of members.
var ignoreAge = cmpopts.IgnoreFields(store.Member{}, "Age")

func members(t *testing.T, g store.Groups, group string, within time.Duration) []store.Member {
	t.Helper()
	got, err := g.Members(context.Background(), group, within)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func testGroupsHeartbeats(t *testing.T, g store.Groups) {
	ctx := context.Background()
	for _, m := range []store.Member{
		{Identity: "r0", LeaseNamespace: "a", Shards: 12},
		{Identity: "r1", LeaseNamespace: "a", Shards: 16},
		{Identity: "r0", LeaseNamespace: "b", Shards: 12},
	} {
		if err := g.Heartbeat(ctx, "g", m); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Heartbeat(ctx, "other", store.Member{Identity: "r9", LeaseNamespace: "z", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	got := members(t, g, "g", time.Minute)
	want := []store.Member{
		{Identity: "r0", LeaseNamespace: "b", Shards: 12, Joined: got[0].Joined},
		{Identity: "r1", LeaseNamespace: "a", Shards: 16, Joined: got[1].Joined},
	}
	if diff := cmp.Diff(want, got, ignoreAge); diff != "" {
		t.Fatalf("members, ordered by identity, as their last heartbeat said (-want +got):\n%s", diff)
	}
	if got[0].Joined <= 0 || got[1].Joined <= got[0].Joined {
		t.Errorf("joined %d (r0), %d (r1): want r0 first, both positive", got[0].Joined, got[1].Joined)
	}
	for _, m := range got {
		if m.Age < 0 || m.Age > 10*time.Second {
			t.Errorf("%s: age %s", m.Identity, m.Age)
		}
	}
	if err := g.Leave(ctx, "g", "r0"); err != nil {
		t.Fatal(err)
	}
	if got := members(t, g, "g", time.Minute); len(got) != 1 || got[0].Identity != "r1" {
		t.Fatalf("members after r0 left: %+v", got)
	}
	// r1's heartbeat was a call ago: more than a microsecond by the
	// store's clock.
	if got := members(t, g, "g", time.Microsecond); len(got) != 0 {
		t.Fatalf("members heard of in the last microsecond: %+v", got)
	}
	if got := members(t, g, "other", time.Minute); len(got) != 1 || got[0].Identity != "r9" {
		t.Fatalf("members of the other group: %+v", got)
	}
}

func testGroupsJoinOrder(t *testing.T, g store.Groups) {
	ctx := context.Background()
	join := func(id string, shards int, within time.Duration) []store.Member {
		t.Helper()
		got, err := g.Join(ctx, "g", store.Member{Identity: id, LeaseNamespace: "ns", Shards: shards}, within)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// place is id's Joined in answer, which must hold it.
	place := func(answer []store.Member, id string) int64 {
		t.Helper()
		i := slices.IndexFunc(answer, func(m store.Member) bool { return m.Identity == id })
		if i < 0 {
			t.Fatalf("%s is not in the answer of its own Join: %+v", id, answer)
		}
		return answer[i].Joined
	}
	a := place(join("a", 12, time.Minute), "a")
	answer := join("b", 12, time.Minute)
	b := place(answer, "b")
	if a <= 0 || b <= a || place(answer, "a") != a {
		t.Fatalf("a joined at %d, then b at %d (answer %+v): want 0 < a < b", a, b, answer)
	}
	steps := []struct {
		what   string
		do     func() []store.Member
		id     string
		moved  bool // to after every member present
		shards int
	}{
		{"a joins again: keeps its place", func() []store.Member { return join("a", 12, time.Minute) }, "a", false, 12},
		{"a heartbeats: keeps its place", func() []store.Member {
			if err := g.Heartbeat(ctx, "g", store.Member{Identity: "a", LeaseNamespace: "ns", Shards: 12}); err != nil {
				t.Fatal(err)
			}
			return members(t, g, "g", time.Minute)
		}, "a", false, 12},
		{"a joins with another count: joins anew", func() []store.Member { return join("a", 16, time.Minute) }, "a", true, 16},
		{"b joins, last heard of more than within ago: joins anew", func() []store.Member { return join("b", 12, time.Microsecond) }, "b", true, 12},
		{"b heartbeats with another count: joins anew", func() []store.Member {
			if err := g.Heartbeat(ctx, "g", store.Member{Identity: "b", LeaseNamespace: "ns", Shards: 4}); err != nil {
				t.Fatal(err)
			}
			return members(t, g, "g", time.Minute)
		}, "b", true, 4},
		{"c heartbeats, never joined: after the others", func() []store.Member {
			if err := g.Heartbeat(ctx, "g", store.Member{Identity: "c", LeaseNamespace: "ns", Shards: 4}); err != nil {
				t.Fatal(err)
			}
			return members(t, g, "g", time.Minute)
		}, "c", true, 4},
		{"b leaves and joins: after the others", func() []store.Member {
			if err := g.Leave(ctx, "g", "b"); err != nil {
				t.Fatal(err)
			}
			return join("b", 4, time.Minute)
		}, "b", true, 4},
	}
	before := members(t, g, "g", time.Minute)
	for _, st := range steps {
		after := st.do()
		got := place(after, st.id)
		var others []int64
		for _, m := range before {
			if m.Identity != st.id {
				others = append(others, m.Joined)
			}
		}
		was := int64(-1)
		if i := slices.IndexFunc(before, func(m store.Member) bool { return m.Identity == st.id }); i >= 0 {
			was = before[i].Joined
		}
		switch {
		case st.moved && len(others) > 0 && got <= slices.Max(others):
			t.Errorf("%s: %s at %d, not after every member present %v", st.what, st.id, got, others)
		case !st.moved && got != was:
			t.Errorf("%s: %s moved from %d to %d", st.what, st.id, was, got)
		}
		if i := slices.IndexFunc(after, func(m store.Member) bool { return m.Identity == st.id }); after[i].Shards != st.shards {
			t.Errorf("%s: %s has %d shards, want %d", st.what, st.id, after[i].Shards, st.shards)
		}
		before = members(t, g, "g", time.Minute)
	}
}

// testGroupsConcurrentJoins: members with two shard counts join at once;
// for every two of them, the one that joined later (larger Joined) saw the
// other in its answer. A replica that checks its answer for an earlier
// member with another count therefore never misses one.
func testGroupsConcurrentJoins(t *testing.T, g store.Groups) {
	const n = 16
	answers := make([][]store.Member, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i], errs[i] = g.Join(context.Background(), "g",
				store.Member{Identity: fmt.Sprintf("r%02d", i), LeaseNamespace: "ns", Shards: 12 + 4*(i%2)}, time.Minute)
		})
	}
	close(start)
	wg.Wait()
	joined := map[string]int64{}
	for i, answer := range answers {
		if errs[i] != nil {
			t.Fatalf("r%02d: %v", i, errs[i])
		}
		for _, m := range answer {
			if m.Identity == fmt.Sprintf("r%02d", i) {
				joined[m.Identity] = m.Joined
			}
		}
	}
	places := map[int64]string{}
	for id, j := range joined {
		if other, dup := places[j]; dup {
			t.Errorf("%s and %s both joined at %d", id, other, j)
		}
		places[j] = id
	}
	for i, answer := range answers {
		self := fmt.Sprintf("r%02d", i)
		seen := map[string]bool{}
		for _, m := range answer {
			seen[m.Identity] = true
		}
		for id, j := range joined {
			if j < joined[self] && !seen[id] {
				t.Errorf("%s (joined at %d) did not see %s, which joined before it (at %d)", self, joined[self], id, j)
			}
		}
	}
}
