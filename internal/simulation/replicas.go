package simulation

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

// group is the replica group of the replicas scenario; its shards' instance
// IDs are replica.ShardID(group, k).
const group = "g"

// members is the store's table of replica group members (store.Groups, as
// PostgreSQL keeps it: storetest.Members), shared by every replica.
type members struct {
	mu    sync.Mutex
	table storetest.Members
	// records counts unfinished records by executor (UnfinishedByExecutor).
	records store.Store
}

func newMembers(records store.Store) *members {
	return &members{records: records}
}

// groupsView is one process's store.Groups: every call is a step and its
// answer another, as the process's store calls are (st nil: no steps).
type groupsView struct {
	g  *members
	st *simStore
}

var _ store.Groups = groupsView{}

// call runs fn under the table's lock between the call's two steps.
func (v groupsView) call(ctx context.Context, what string, fn func()) error {
	if v.st != nil {
		if err := v.st.before(ctx, what); err != nil {
			return err
		}
	}
	v.g.mu.Lock()
	fn()
	v.g.mu.Unlock()
	if v.st != nil {
		return v.st.after(ctx, what)
	}
	return nil
}

func (v groupsView) Join(ctx context.Context, name string, m store.Member, within time.Duration) ([]store.Member, error) {
	var out []store.Member
	err := v.call(ctx, "join "+name, func() {
		v.g.table.Register(name, m, within, time.Now())
		out = v.g.table.List(name, within, m.Identity, time.Now())
	})
	return out, err
}

func (v groupsView) Heartbeat(ctx context.Context, name string, m store.Member) error {
	return v.call(ctx, "heartbeat "+name, func() { v.g.table.Register(name, m, 0, time.Now()) })
}

func (v groupsView) Leave(ctx context.Context, name, identity string) error {
	return v.call(ctx, "leave "+name, func() { v.g.table.Leave(name, identity) })
}

func (v groupsView) Members(ctx context.Context, name string, within time.Duration) ([]store.Member, error) {
	var out []store.Member
	err := v.call(ctx, "members "+name, func() { out = v.g.table.List(name, within, "", time.Now()) })
	return out, err
}

func (v groupsView) UnfinishedByExecutor(ctx context.Context) (map[string]int, error) {
	var out map[string]int
	var lerr error
	err := v.call(ctx, "unfinished", func() {
		recs, err := v.g.records.List(context.Background(), store.ListOptions{NonTerminal: true})
		if err != nil {
			lerr = err
			return
		}
		out = map[string]int{}
		for _, r := range recs {
			out[r.Executor]++
		}
	})
	if err != nil {
		return nil, err
	}
	return out, lerr
}

// feed is the store's change feed (store.Changes, PostgreSQL's NOTIFY): a
// record created or cancelled by any process is told to every listener,
// each delivery a step of the listener's process.
type feed struct {
	mu   sync.Mutex
	subs []*listener
}

type listener struct {
	queue []store.Change // under feed.mu
	wake  chan struct{}
}

// publish tells every listener of c.
func (f *feed) publish(c store.Change) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.subs {
		l.queue = append(l.queue, c)
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// feedView is one process's store.Changes.
type feedView struct {
	f     *feed
	steps *steps
	actor string
}

var _ store.Changes = feedView{}

// WatchChanges starts with the zero Change (look at every record), as the
// real feed does each time it listens, then delivers what is published,
// each change a step, until ctx ends.
func (v feedView) WatchChanges(ctx context.Context, fn func(store.Change)) error {
	l := &listener{queue: []store.Change{{}}, wake: make(chan struct{}, 1)}
	v.f.mu.Lock()
	v.f.subs = append(v.f.subs, l)
	v.f.mu.Unlock()
	defer func() {
		v.f.mu.Lock()
		v.f.subs = slices.DeleteFunc(v.f.subs, func(x *listener) bool { return x == l })
		v.f.mu.Unlock()
	}()
	for {
		v.f.mu.Lock()
		if len(l.queue) == 0 {
			v.f.mu.Unlock()
			select {
			case <-l.wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		c := l.queue[0]
		l.queue = l.queue[1:]
		v.f.mu.Unlock()
		what := "all"
		if c.ID != "" {
			what = c.Executor + "/" + c.ID
		}
		if err := v.steps.wait(ctx, v.actor, fmt.Sprintf("%s changes< %s", v.actor, what)); err != nil {
			if !errors.Is(err, errInjected) {
				return ctx.Err()
			}
			// The connection was lost: what was queued is missed, and the
			// feed listens again with the zero Change first.
			v.f.mu.Lock()
			l.queue = []store.Change{{}}
			v.f.mu.Unlock()
			continue
		}
		fn(c)
	}
}

// replicaPlan is the replicas scenario: the tasks of one group shared by
// shards among replicas (internal/replica) that join, leave, crash and, in
// half the runs, go through a rolling update that raises --shards by one:
// the new replicas wait while an old one lives (MixedShardsError), the old
// ones leave one by one.
type replicaPlan struct {
	shards   int           // the shard count replicas start with now
	initial  int           // replicas at the start
	updateAt time.Duration // a rolling update begins then (0: none)
	updating bool          // the update began
	nextRoll time.Time     // the update replaces its next old replica then
}

// drawReplicas draws the replicas scenario from a stream of its own, so
// that the other scenarios' draws stay what the seed drew before it
// existed.
func (w *world) drawReplicas() {
	r := rand.New(rand.NewPCG(uint64(w.opt.Seed), 0x4e91)) //nolint:gosec // a seeded source that replays is the point
	pick := r.IntN(3) == 0
	pl := &replicaPlan{shards: 2 + r.IntN(2), initial: 1 + r.IntN(3)}
	if r.IntN(2) == 0 {
		pl.updateAt = time.Duration(2000+r.IntN(12000)) * time.Millisecond
	}
	if pick && !w.adopt && !w.opt.NoReplicas {
		w.repl = pl
		w.hist.add(Event{Kind: KProcess, Note: fmt.Sprintf("replicas of group %s: %d to start, --shards %d, rolling update to %d at %s",
			group, pl.initial, pl.shards, pl.shards+1, pl.updateAt)})
	}
}

// startReplica starts a replica of the group with shards shards, as a
// process of its own (its own clients, store view, change feed and
// membership).
func (w *world) startReplica(shards int) *process {
	w.nproc++
	name := fmt.Sprintf("p%d", w.nproc)
	p := &process{name: name, instance: group, shards: shards, done: make(chan error, 1), logs: &bytes.Buffer{}}
	st := &simStore{inner: w.mem, steps: w.steps, hist: w.hist, actor: name, seen: w.seen, feed: w.feed}
	log := slog.New(slog.NewTextHandler(p.logs, &slog.HandlerOptions{Level: w.logLevel()}))
	rep, err := replica.New(replica.Config{
		Client: w.srv.client(name), Namespace: ns, Group: group, Identity: name, Shards: shards,
		LeaseDuration: 3 * time.Second, RetryPeriod: time.Second,
		Executor: func(int) executor.Config {
			cl := w.srv.client(name)
			return executor.Config{Client: cl, Execer: noExec{}, Namespaces: []string{ns}, Store: st,
				Workers: 1, CreateConcurrency: 1, PlainList: true, ResyncPeriod: 30 * time.Second,
				CaptureLogs: capture(cl, st, log)}
		},
		Changes: feedView{f: w.feed, steps: w.steps, actor: name},
		Groups:  groupsView{g: w.members, st: st},
		Logger:  log,
	})
	if err != nil {
		panic(err)
	}
	w.launch(p, rep, rep.Run, fmt.Sprintf("%s started: a replica of group %s with --shards %d", name, group, shards))
	return p
}

// restartReplica starts a replica in place of one that crashed: with its
// shard count, or the new one once the rolling update began (the update
// replaces the pod).
func (w *world) restartReplica(shards int) {
	if w.repl.updating {
		shards = w.repl.shards
	}
	w.startReplica(shards)
}

// leave makes replica p leave its group: its context ends, and it deletes
// its membership Lease and stops its shards' executors, each releasing its
// Lease (steps of p's as any).
func (w *world) leave(p *process) {
	p.leaving = true
	p.cancel()
	w.hist.add(Event{Kind: KProcess, Note: p.name + " leaves the group"})
}

// replicas are the live replicas that are not leaving, in start order.
func (w *world) replicas() []*process {
	var out []*process
	for _, p := range w.procs {
		if p.shards > 0 && !p.dead && !p.leaving {
			out = append(out, p)
		}
	}
	return out
}

// serving is the replica a user's request about task id goes to (a load
// balancer's choice, by the ID), nil when none lives.
func (w *world) serving(id string) *process {
	rs := w.replicas()
	if len(rs) == 0 {
		return nil
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return rs[int(h.Sum32())%len(rs)]
}

// replicaHousekeeping does what the scenario makes due: the rolling
// update's steps, and once the faults are over a live replica of the
// current shard count.
func (w *world) replicaHousekeeping(now time.Time) {
	r := w.repl
	if r.updateAt > 0 && !r.updating && w.now() >= r.updateAt {
		r.updating = true
		r.shards++
		w.hist.add(Event{Kind: KProcess, Note: fmt.Sprintf("a rolling update raises --shards to %d", r.shards)})
		w.startReplica(r.shards)
		r.nextRoll = now.Add(time.Duration(1000+w.rng.IntN(3000)) * time.Millisecond)
	}
	if r.updating && !r.nextRoll.IsZero() && !now.Before(r.nextRoll) {
		r.nextRoll = time.Time{}
		for _, p := range w.replicas() {
			if p.shards != r.shards {
				w.leave(p)
				w.startReplica(r.shards)
				r.nextRoll = now.Add(time.Duration(1000+w.rng.IntN(3000)) * time.Millisecond)
				break
			}
		}
	}
	if !w.faulty() && len(w.restarts) == 0 && !slices.ContainsFunc(w.replicas(), func(p *process) bool { return p.shards == r.shards }) {
		w.restarts = append(w.restarts, restart{at: now, instance: group, shards: r.shards})
	}
}

// replicaChoices are the group's changes of size while the faults last: a
// replica joins (up to 3), or one leaves (down to 1).
func (w *world) replicaChoices() []choice {
	rs := w.replicas()
	var cs []choice
	if len(rs) < 3 {
		cs = append(cs, choice{w.level, func() { w.startReplica(w.repl.shards) }})
	}
	if len(rs) > 1 {
		cs = append(cs, choice{w.level, func() { w.leave(rs[w.rng.IntN(len(rs))]) }})
	}
	return cs
}
