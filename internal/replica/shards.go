package replica

import (
	"fmt"
	"time"

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
	return fmt.Sprintf("replica %s of group %s runs with --shards %d, this one with --shards %d (%s joined before this one, heard of %s ago): "+
		"replicas of one group must use one shard count, or some shards are run by nobody; this one runs no shard until no replica with --shards %d is live. "+
		"To change --shards, stop every replica with --shards %d first (e.g. a Deployment with strategy Recreate, or scale to 0 then up), "+
		"or start this one with --shards %d",
		e.Other.Identity, e.Group, e.Other.Shards, e.Shards, e.Other.Identity, e.Other.Age.Round(time.Second), e.Other.Shards, e.Other.Shards, e.Other.Shards)
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
