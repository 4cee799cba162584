// Package replica runs one `kubetask serve` replica among several that share
// a PostgreSQL store.
//
// Tasks belong to a fixed number of shards (a hash of the task ID); shard k
// is run by an executor whose instance ID is ShardID(group, k), so its pods,
// its records and its instance Lease are those of that ID. Each replica
// holds a membership Lease (labelled LabelGroup=group) and runs the executors
// of the shards Assign gives it among the live members: replicas balance the
// shards as they join and leave, without a restart. The members of a group
// must run with one shard count, or their assignments disagree and some
// shard is run by nobody: a replica that finds a live member of another
// count that joined the group before it (in the store, Config.Groups, and
// in the membership Leases) runs no shard and is not ready until that
// member is gone (MixedShardsError). A replica that dies
// loses its shards when their Leases expire; the new owner's executor adopts
// the shard's pods with one LIST per namespace and its unfinished records.
// On the end of Run's context the replica deletes its membership Lease and
// releases its shard Leases at once, so the others take over without
// waiting for expiry.
//
// The Lease is never what keeps an outcome single: two replicas that both
// believe they own a shard derive the same pod names and write records by
// compare-and-swap, so they create no second pod and record no second
// outcome (test/e2e/replica forces that split brain).
package replica
