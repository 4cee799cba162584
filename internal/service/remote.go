package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Pull (docs/multicluster.md, "Push, and pull where the service cannot
// reach"): a cluster marked agent is run by `kubetask serve --agent NAME`
// in that cluster, against the service's PostgreSQL store. The store is
// all the two share: the service records the tasks it places there for
// the cluster's instances (remoteCluster: RecordOnly executors; the agent
// hears of them from the store's change feed, as a replica hears of a
// shard's), and the process that runs a cluster's executors says so in
// the store every checkInterval while they answer (heartbeat: the group
// clusterGroup(instance) of store.Groups). To the service, an agent's
// cluster answers while its heartbeats are fresh; to an agent, every
// cluster but its own is another process's and is not its to check.

// clusterGroup is the store group whose members are the processes that
// run cluster instance's executors.
func clusterGroup(instance string) string { return "cluster/" + instance }

// remoteWithin is how recent a heartbeat must be for the cluster to answer
// (three beats).
const remoteWithin = 3 * checkInterval

// remoteCluster is the server.Executor of a cluster another process runs:
// submissions are recorded for the instance that runs each task (its
// shard's, with shards), reads and cancellations go through the store.
type remoteCluster struct {
	instanceFor func(id string) string
	records     map[string]*executor.Executor // by instance
	// parallelism is the cluster's (the agent's configuration is the
	// service's): free slots are it less the unfinished tasks placed there.
	parallelism int

	mu    sync.Mutex
	alive bool // a heartbeat within remoteWithin, as last read
	used  int  // unfinished tasks of its instances, as last counted
}

var _ server.Executor = (*remoteCluster)(nil)

func (rc *remoteCluster) of(id string) *executor.Executor { return rc.records[rc.instanceFor(id)] }

func (rc *remoteCluster) SubmitCreated(ctx context.Context, id string, t *task.Task, opts ...executor.SubmitOption) (store.Record, bool, error) {
	return rc.of(id).SubmitCreated(ctx, id, t, opts...)
}

func (rc *remoteCluster) Get(ctx context.Context, id string) (store.Record, error) {
	return rc.of(id).Get(ctx, id)
}

func (rc *remoteCluster) Cancel(ctx context.Context, id string, opts ...executor.CancelOption) error {
	return rc.of(id).Cancel(ctx, id, opts...)
}

// Healthy is nil: what the agent sees is the agent's.
func (rc *remoteCluster) Healthy() error { return nil }

func (rc *remoteCluster) ready() error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !rc.alive {
		return fmt.Errorf("no process that runs it said so in the last %s (its agent: kubetask serve --agent)", remoteWithin)
	}
	return nil
}

// free is the cluster's parallelism less its unfinished tasks, as last
// counted (for any namespace: the agent's namespace limits are not known
// here). Advice, as an executor's Free is.
func (rc *remoteCluster) free(string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.parallelism - rc.used
}

// newRemoteCluster builds the clusterRun of cluster name, run by another
// process: RecordOnly executors for its instance (or its shard
// instances), cluster name.
func (r *router) newRemoteCluster(cfg Config, name string, labels map[string]string, ec executor.Config) (*clusterRun, *remoteCluster, error) {
	c := r.unconfigured(name)
	c.labels = labels
	rc := &remoteCluster{instanceFor: func(string) string { return c.instance }, records: map[string]*executor.Executor{}, parallelism: cfg.Parallelism}
	if rc.parallelism == 0 {
		rc.parallelism = 100
	}
	if cfg.Shards > 0 {
		c.instanceFor = func(id string) string { return replica.ShardID(c.instance, replica.ShardOf(id, cfg.Shards)) }
		rc.instanceFor = c.instanceFor
	}
	for _, inst := range c.all() {
		rec := ec
		rec.RESTConfig, rec.Client, rec.Execer = nil, nil, nil
		rec.RecordOnly, rec.InstanceID, rec.Cluster = true, inst, name
		rec.OnEvent, rec.CaptureLogs = nil, nil
		ex, err := executor.New(rec)
		if err != nil {
			return nil, nil, fmt.Errorf("cluster %s: %w", name, err)
		}
		rc.records[inst] = ex
	}
	c.remote = true
	c.run = &runner{api: rc, ready: rc.ready, start: func(ctx context.Context) error {
		<-ctx.Done() // nothing runs here: the agent runs it
		return nil
	}}
	c.free = rc.free
	return c, rc, nil
}

// heartbeat says, for each cluster this process runs whose executors
// answer, that it runs it (the group clusterGroup of its instance).
func (r *router) heartbeat(ctx context.Context) error {
	var errs []error
	for _, c := range r.clusters {
		if c.remote || c.run.ready() != nil {
			continue
		}
		m := store.Member{Identity: r.identity, LeaseNamespace: r.leaseNamespace, Shards: r.shards}
		if err := r.groups.Heartbeat(ctx, clusterGroup(c.instance), m); err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", c.name, err))
		}
	}
	return errors.Join(errs...)
}

// refreshRemote reads, for each cluster another process runs, whether it
// said so lately and how many unfinished tasks its instances have.
func (r *router) refreshRemote(ctx context.Context) error {
	var remotes []*clusterRun
	for _, c := range r.clusters {
		if c.remote {
			remotes = append(remotes, c)
		}
	}
	if len(remotes) == 0 {
		return nil
	}
	counts, err := r.groups.UnfinishedByExecutor(ctx)
	if err != nil {
		return fmt.Errorf("counting the clusters' unfinished tasks: %w", err)
	}
	var errs []error
	for _, c := range remotes {
		members, err := r.groups.Members(ctx, clusterGroup(c.instance), remoteWithin)
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", c.name, err))
			continue
		}
		used := 0
		for _, inst := range c.all() {
			used += counts[inst]
		}
		rc := c.run.api.(*remoteCluster)
		rc.mu.Lock()
		rc.alive, rc.used = len(members) > 0, used
		rc.mu.Unlock()
	}
	return errors.Join(errs...)
}

// followChanges tells this process's single executors of the tasks
// another process recorded for them, or cancelled (the store's change
// feed: an agent's executor hears so of the tasks the service placed on
// its cluster), and has them look at every task again when the feed says
// changes may have been missed. A replica group's executors follow the
// feed themselves.
func (r *router) followChanges(ctx context.Context, ch store.Changes) {
	err := ch.WatchChanges(ctx, func(chg store.Change) {
		for _, c := range r.clusters {
			if c.remote || c.resyncAll == nil {
				continue
			}
			switch {
			case chg.ID == "":
				if err := c.resyncAll(ctx); err != nil && ctx.Err() == nil {
					r.log.Warn("resync after the store's change feed reconnected", "cluster", c.name, "err", err)
				}
			case c.has(chg.Executor):
				c.resync(chg.ID)
			}
		}
	})
	if err != nil && ctx.Err() == nil {
		r.log.Error("the store's change feed ended", "err", err)
	}
}

// processIdentity names this process among those that run a cluster:
// its ReplicaID, else host name and process ID.
func processIdentity(cfg Config) string {
	if cfg.ReplicaID != "" {
		return cfg.ReplicaID
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s_%d", host, os.Getpid())
}

// remoteEvery runs the heartbeats and the reads of the other processes'
// clusters every checkInterval until ctx ends (with a store that keeps
// groups: PostgreSQL).
func (r *router) remoteEvery(ctx context.Context) {
	if r.groups == nil {
		return
	}
	beat := func(ctx context.Context) error {
		return errors.Join(r.heartbeat(ctx), r.refreshRemote(ctx))
	}
	if err := beat(ctx); err != nil && ctx.Err() == nil {
		r.log.Warn("the clusters' heartbeats", "err", err)
	}
	r.every(ctx, checkInterval, "the clusters' heartbeats", beat)
}

// One process decides for the router (the clusters' states, the moves off
// a quiet cluster, the rebalance, the placement of unplaced tasks): with
// replicas every one could, and the store's compare-and-swap writes would
// keep two decisions from both landing, but under a partition that only
// some replicas see, a cluster's state would go back and forth between
// their views, and every replica would read the store for nothing. The
// leader is the member of the router's group (store.Groups) that joined
// first among those heard of within remoteWithin; the others follow the
// states it writes. A leader that dies is followed by the next within
// remoteWithin; two leaders for a moment decide as two replicas would.

// routerGroup is the group of the processes that share the router's
// decisions: the service's replicas, or one agent's.
func (r *router) routerGroup() string {
	if r.agent != "" {
		return "router/" + r.instanceID + "/agent/" + r.agent
	}
	return "router/" + r.instanceID
}

// leads reports whether this process makes the router's decisions: always
// without replicas (or without a store that keeps groups).
func (r *router) leads() bool {
	if r.shards == 0 || r.groups == nil {
		return true
	}
	return r.leader.Load()
}

// elect says, in the router's group, that this process runs, and reads
// whether it leads: the member that joined first of those heard of lately.
func (r *router) elect(ctx context.Context) error {
	m := store.Member{Identity: r.identity, LeaseNamespace: r.leaseNamespace, Shards: r.shards}
	members, err := r.groups.Join(ctx, r.routerGroup(), m, remoteWithin)
	if err != nil {
		r.leader.Store(false) // unheard of: another may lead meanwhile
		return fmt.Errorf("the router's group: %w", err)
	}
	first := m
	for i, o := range members {
		if i == 0 || o.Joined < first.Joined || o.Joined == first.Joined && o.Identity < first.Identity {
			first = o
		}
	}
	was := r.leader.Swap(first.Identity == r.identity)
	if now := first.Identity == r.identity; now != was {
		r.log.Info("the router's decisions", "leads", now, "leader", first.Identity)
	}
	return nil
}
