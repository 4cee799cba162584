package storetest

import (
	"slices"
	"strings"
	"time"

	"github.com/kubetask/kubetask/pkg/store"
)

// Members is the member table of replica groups kept in memory, with the
// rules PostgreSQL's kubetask_members keeps (store.Groups): a member keeps
// its place in the join order while heard of within the window with the
// same shard count, else it joins anew after every member present. Fakes
// of store.Groups build on it. It is not safe for concurrent use: its
// callers hold their own lock (their Joins are serial).
type Members struct {
	groups map[string]map[string]*memberSeen // group -> identity
}

type memberSeen struct {
	store.Member
	seen time.Time
}

func (m *Members) group(name string) map[string]*memberSeen {
	if m.groups == nil {
		m.groups = map[string]map[string]*memberSeen{}
	}
	if m.groups[name] == nil {
		m.groups[name] = map[string]*memberSeen{}
	}
	return m.groups[name]
}

// Put records mem of group as it is (its Joined and Shards), heard of at
// now: a table's starting state.
func (m *Members) Put(group string, mem store.Member, now time.Time) {
	m.group(group)[mem.Identity] = &memberSeen{Member: mem, seen: now}
}

// Register records that mem of group runs at now (Join with within > 0,
// Heartbeat with within <= 0: the place is kept however long it was quiet).
func (m *Members) Register(group string, mem store.Member, within time.Duration, now time.Time) {
	ms := m.group(group)
	old := ms[mem.Identity]
	keep := old != nil && old.Shards == mem.Shards && old.Joined > 0 && (within <= 0 || now.Sub(old.seen) < within)
	joined := int64(1)
	for _, o := range ms {
		joined = max(joined, o.Joined+1)
	}
	if keep {
		joined = old.Joined
	}
	ms[mem.Identity] = &memberSeen{Member: store.Member{Identity: mem.Identity, LeaseNamespace: mem.LeaseNamespace, Shards: mem.Shards, Joined: joined}, seen: now}
}

// List returns the members of group heard of within the last within
// before now, and self whenever it was heard of, ordered by identity, with
// their ages.
func (m *Members) List(group string, within time.Duration, self string, now time.Time) []store.Member {
	var out []store.Member
	for id, ms := range m.group(group) {
		if age := now.Sub(ms.seen); age < within || id == self {
			mm := ms.Member
			mm.Age = age
			out = append(out, mm)
		}
	}
	slices.SortFunc(out, func(a, b store.Member) int { return strings.Compare(a.Identity, b.Identity) })
	return out
}

// Leave forgets identity of group.
func (m *Members) Leave(group, identity string) {
	delete(m.group(group), identity)
}
