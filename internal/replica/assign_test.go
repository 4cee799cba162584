package replica

import (
	"fmt"
	"slices"
	"testing"
)

func members(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("kubetask-7d9f8c-%c%d", 'a'+i, i))
	}
	return out
}

// TestAssignBalances: every shard has one owner among the members, loads
// differ by at most one, and the answer depends only on the set of members.
func TestAssignBalances(t *testing.T) {
	for _, tc := range []struct{ members, shards int }{
		{1, 1}, {1, 12}, {2, 12}, {3, 12}, {5, 12}, {7, 12}, {12, 12}, {13, 12}, {3, 64}, {10, 256}, {4, 3},
	} {
		t.Run(fmt.Sprintf("%d members %d shards", tc.members, tc.shards), func(t *testing.T) {
			ms := members(tc.members)
			a := Assign(ms, tc.shards)
			if len(a) != tc.shards {
				t.Fatalf("%d shards assigned, want %d", len(a), tc.shards)
			}
			load := map[string]int{}
			for k, m := range a {
				if k < 0 || k >= tc.shards || !slices.Contains(ms, m) {
					t.Fatalf("shard %d -> %q", k, m)
				}
				load[m]++
			}
			lo, hi := tc.shards, 0
			for _, m := range ms {
				lo, hi = min(lo, load[m]), max(hi, load[m])
			}
			if hi-lo > 1 {
				t.Errorf("loads %v: differ by %d", load, hi-lo)
			}
			rev := slices.Clone(ms)
			slices.Reverse(rev)
			if b := Assign(append(rev, ms[0]), tc.shards); fmt.Sprint(b) != fmt.Sprint(a) {
				t.Errorf("order or duplicates of members changed the assignment:\n%v\n%v", a, b)
			}
		})
	}
	if Assign(nil, 12) != nil {
		t.Error("Assign with no members is not nil")
	}
}

// TestAssignMovesFewShards: a member joining or leaving moves few shards
// (an even split moves shards/members; a modulo split would move most).
func TestAssignMovesFewShards(t *testing.T) {
	for _, tc := range []struct{ from, to, shards, maxMoved int }{
		{2, 3, 12, 6}, {3, 2, 12, 6}, {3, 4, 12, 5}, {1, 2, 12, 6}, {3, 4, 64, 28}, {5, 4, 64, 26},
	} {
		ms := members(max(tc.from, tc.to))
		a, b := Assign(ms[:tc.from], tc.shards), Assign(ms[:tc.to], tc.shards)
		moved := 0
		for k := range tc.shards {
			if a[k] != b[k] {
				moved++
			}
		}
		t.Logf("%d -> %d members, %d shards: %d moved", tc.from, tc.to, tc.shards, moved)
		if moved > tc.maxMoved {
			t.Errorf("%d -> %d members, %d shards: %d shards moved, want at most %d", tc.from, tc.to, tc.shards, moved, tc.maxMoved)
		}
	}
}

func TestShardOfSpreads(t *testing.T) {
	count := make([]int, 12)
	for i := range 12000 {
		count[ShardOf(fmt.Sprintf("task-%d", i), 12)]++
	}
	for k, c := range count {
		if c < 800 || c > 1200 {
			t.Errorf("shard %d has %d of 12000 tasks", k, c)
		}
	}
}
