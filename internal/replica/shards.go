package replica

import (
	"fmt"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/kubetask/kubetask/pkg/store"
)

// MixedShardsError is why a replica runs no shards: a live member of its
// group, which joined before it, runs with another shard count. The two
// would assign the shards differently, and some shard would be run by
// nobody while both live. The replica waits (not ready, with this error)
// until no such member lives.
type MixedShardsError struct {
	// Group is the replica group; Shards this replica's count.
	Group  string
	Shards int
	// Other is the earliest member with another count (Other.Shards).
	Other store.Member
}

func (e *MixedShardsError) Error() string {
	heard := ""
	if e.Other.Age > 0 {
		heard = fmt.Sprintf(", heard of %s ago", e.Other.Age.Round(time.Second))
	}
	return fmt.Sprintf("replica %s of group %s runs with --shards %d, this one with --shards %d (%s joined before this one%s): "+
		"replicas of one group must use one shard count, or some shards are run by nobody; this one runs no shard until no replica with --shards %d is live. "+
		"To change --shards, stop every replica with --shards %d first (e.g. a Deployment with strategy Recreate, or scale to 0 then up), "+
		"or start this one with --shards %d",
		e.Other.Identity, e.Group, e.Other.Shards, e.Shards, e.Other.Identity, heard, e.Other.Shards, e.Other.Shards, e.Other.Shards)
}

// joinedBefore orders members by their place in the join order (Joined),
// then by identity: the same order for every replica that sees them.
func joinedBefore(a, b store.Member) bool {
	if a.Joined != b.Joined {
		return a.Joined < b.Joined
	}
	return a.Identity < b.Identity
}

// shardConflict returns the member that keeps self from running shards,
// nil if none does: the earliest of members (live ones, self's own entry
// ignored) that runs with a known shard count other than self's and joined
// before self.
//
// Of two members with different counts, the one that joined later waits,
// whether the earlier one runs shards or waits itself: join order is fixed,
// so two counts never both run, and the earliest live member always may,
// so a group always gets going. The store makes the rule safe against
// joins at once: a replica registers (Groups.Join) before it looks, and of
// two Joins the later one's answer holds the earlier member. A member of
// unknown count (Shards 0: registered by a kubetask from before the count
// was recorded) is taken to agree: it cannot be told apart from one that
// does, and refusing it would stall every rolling upgrade from such a
// version (docs/replicas.md: do not change --shards in that upgrade).
func shardConflict(self store.Member, members []store.Member) *store.Member {
	var first *store.Member
	for i, m := range members {
		if m.Identity == self.Identity || m.Shards == 0 || m.Shards == self.Shards || !joinedBefore(m, self) {
			continue
		}
		if first == nil || joinedBefore(m, *first) {
			first = &members[i]
		}
	}
	return first
}

// The annotations of a membership Lease that say with which shard count its
// replica runs and its place in the store's join order (store.Member's
// Shards and Joined), so that the members see each other's counts in the
// Leases too, not only in the store at joining.
const (
	AnnotationShards = "kubetask.io/replica-shards"
	AnnotationJoined = "kubetask.io/replica-joined"
)

// memberOfLease is the member a membership Lease of holder describes:
// Shards 0 (unknown) when the Lease has no shard count (an older
// kubetask's).
func memberOfLease(holder string, l *coordinationv1.Lease) store.Member {
	m := store.Member{Identity: holder, LeaseNamespace: l.Namespace}
	m.Shards, _ = strconv.Atoi(l.Annotations[AnnotationShards])
	m.Joined, _ = strconv.ParseInt(l.Annotations[AnnotationJoined], 10, 64)
	m.Shards, m.Joined = max(m.Shards, 0), max(m.Joined, 0)
	return m
}

// peers reads the shard counts of the live members (live, self among them)
// in their membership Leases (leases): it returns those among whom self
// assigns the shards, the live members of self's count or of an unknown
// one, and the member that keeps self from running any shard
// (shardConflict), nil if none does.
//
// It is the same rule as at joining (checkGroup), kept while the replica
// runs: a live member of another count that joined before this one never
// runs beside it, even if the store's check let both in (a member whose
// heartbeats did not reach the store for two lease durations, while its
// Leases were renewed), and members of another count are left out of the
// assignment, so that no shard is assigned to a replica that will not run
// it.
func peers(self store.Member, live []string, leases []*coordinationv1.Lease) (same []string, blocker *store.Member) {
	byHolder := map[string]store.Member{}
	for _, l := range leases {
		if l.Spec.HolderIdentity != nil {
			byHolder[*l.Spec.HolderIdentity] = memberOfLease(*l.Spec.HolderIdentity, l)
		}
	}
	var members []store.Member
	for _, id := range live {
		m := store.Member{Identity: id} // no Lease: count unknown
		if id == self.Identity {
			m = self
		} else if lm, ok := byHolder[id]; ok {
			m = lm
		}
		members = append(members, m)
		if m.Shards == 0 || m.Shards == self.Shards {
			same = append(same, id)
		}
	}
	return same, shardConflict(self, members)
}
