package replica

import (
	"context"
	"maps"
	"slices"

	"github.com/kubetask/kubetask/pkg/executor"
)

// What a service with several clusters asks of one cluster's replica
// group (one Replica per cluster in each process: its Group names the
// cluster, its Leases are in that cluster): which shard instance runs a
// task, and what the shards this replica runs there see. The group's other
// shards run in other processes; the answers that sum over shards are
// this replica's part, scaled where a placement needs the whole.

// Instance is the shard instance that runs task id: ShardID of its shard.
func (r *Replica) Instance(id string) string {
	return ShardID(r.cfg.Group, ShardOf(id, r.cfg.Shards))
}

// Owns reports whether instance is one of the group's shard instances.
func (r *Replica) Owns(instance string) bool {
	_, ok := r.byID[instance] // written by New only
	return ok
}

// Instances returns the group's shard instances, by shard.
func (r *Replica) Instances() []string {
	out := make([]string, r.cfg.Shards)
	for k := range out {
		out[k] = ShardID(r.cfg.Group, k)
	}
	return out
}

// running returns the executors of the shards this replica runs, by shard.
func (r *Replica) runningExecutors() []*executor.Executor {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*executor.Executor, 0, len(r.running))
	for _, k := range slices.Sorted(maps.Keys(r.running)) {
		out = append(out, r.running[k].ex)
	}
	return out
}

// Free estimates how many more pods of namespace ns the group would start
// now: the shards this replica runs see their Free (executor.Free: each
// has its part of the limits), and the group's is their sum scaled to
// every shard; 0 when it runs none (the group's capacity is not known
// here). Like Free it is advice, for placement.
func (r *Replica) Free(ns string) int {
	runs := r.runningExecutors()
	if len(runs) == 0 {
		return 0
	}
	sum := 0
	for _, ex := range runs {
		sum += ex.Free(ns)
	}
	return sum * r.cfg.Shards / len(runs)
}

// Resync makes the executor of task id's shard look at it again soon,
// when this replica runs that shard (another replica's hears of it from
// the store's change feed).
func (r *Replica) Resync(id string) {
	k := ShardOf(id, r.cfg.Shards)
	r.mu.Lock()
	run := r.running[k]
	r.mu.Unlock()
	if run != nil {
		run.ex.Resync(id)
	}
}

// Stranded sums executor.Stranded over the shards this replica runs.
func (r *Replica) Stranded(ctx context.Context) (int, error) {
	n := 0
	for _, ex := range r.runningExecutors() {
		m, err := ex.Stranded(ctx)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// NextInLine is executor.NextInLine over the shards this replica runs, in
// shard order, at most n in all.
func (r *Replica) NextInLine(n int, room func(ns string) int, skip func(id string) bool) []string {
	var out []string
	for _, ex := range r.runningExecutors() {
		if len(out) >= n {
			break
		}
		out = append(out, ex.NextInLine(n-len(out), room, skip)...)
	}
	return out
}
