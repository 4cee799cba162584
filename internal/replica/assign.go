package replica

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
)

// ShardID is the executor instance ID of shard k of group: its pods' label,
// its records' executor and its Lease's name.
func ShardID(group string, k int) string { return fmt.Sprintf("%s-shard-%d", group, k) }

// ShardOf is the shard of task id among n shards.
func ShardOf(id string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(uint64(h.Sum32()) % uint64(max(n, 1))) //nolint:gosec // n > 0; the result is below n
}

// Assign gives each of n shards to one of members: rendezvous hashing with a
// bounded load, so that every member gets n/len(members) shards, rounded
// down or up, and a member joining or leaving moves few shards. It depends
// only on the set of members, so replicas that see the same members agree.
// With no members it returns nil.
func Assign(members []string, n int) map[int]string {
	if len(members) == 0 || n <= 0 {
		return nil
	}
	ms := slices.Clone(members)
	slices.Sort(ms)
	ms = slices.Compact(ms)
	limit := (n + len(ms) - 1) / len(ms) // ceil
	// Members with the ceiling: n - (limit-1)*len(ms) of them; the others
	// stop at limit-1. The first shards to pick take the ceiling seats.
	full := n - (limit-1)*len(ms)
	load := map[string]int{}
	atCeiling := 0
	out := make(map[int]string, n)
	for k := range n {
		ranked := slices.Clone(ms)
		sort.SliceStable(ranked, func(i, j int) bool { return score(ranked[i], k) > score(ranked[j], k) })
		for _, m := range ranked {
			capacity := limit - 1
			if atCeiling < full {
				capacity = limit
			}
			if load[m] < capacity {
				load[m]++
				if load[m] == limit {
					atCeiling++
				}
				out[k] = m
				break
			}
		}
	}
	return out
}

func score(member string, k int) uint64 {
	h := fnv.New64a()
	_, _ = fmt.Fprintf(h, "%s/%d", member, k)
	return mix(h.Sum64())
}

// mix is splitmix64's finalizer: FNV alone ranks similar names alike.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Owned returns the shards assignment gives to member, in order.
func Owned(assignment map[int]string, member string) []int {
	var out []int
	for k, m := range assignment {
		if m == member {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
