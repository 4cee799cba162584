package simulation

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/placement"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// The clusters scenario (docs/multicluster.md): two executor instances,
// one per cluster, share the store: sim-east runs the tasks placed on
// cluster east, sim-west those on west. Their pods are in the one simulated
// API server, where each instance sees only its own (its pod caches select
// its label), so each is the whole of its cluster to the executor; a
// cluster's partition is the pause of its instance's processes (their
// steps wait, their Lease lapses). An operator declares east lost: first a
// new term of sim-east in the store (its writes on their way are fenced),
// then, one record at a time as the world steps, each unfinished record of
// east loses its attempt (executor.LoseAttempt, an unfenced compare-and-swap)
// when its pod is recorded, or is moved to west (store Move) when not; and
// a placer moves every unplaced record (the attempt after a loss) to west.
// East's instance runs on: when its partition ends it finds the pods of
// lost attempts in its cache and stops and releases them (the Returning
// pass). The checker allows a lost attempt's pod to run beside the next
// attempt's (the at-least-once a declaration is), and nothing else.
const (
	instEast = "sim-east"
	instWest = "sim-west"
)

// clusterPlan is the clusters scenario of a run.
type clusterPlan struct {
	// pauseAt and pauseFor: east's partition (pauseFor 0: none; the
	// declaration is then of a cluster that still answers).
	pauseAt, pauseFor time.Duration
	// loseAt: when the operator declares east lost.
	loseAt time.Duration
	// quiet: no declaration; while east is partitioned the placer moves
	// away the tasks of east that placement.Movable allows (placed, no
	// pod, no earlier pod that may still run there), as the service does
	// for an unreachable cluster.
	quiet    bool
	declared bool // the operator began: east takes no more tasks
	// returns: east, declared lost, is Ready again once its partition
	// ended and no pod of a lost attempt is left there (the Returning
	// pass done): the operator stops, and the placer places on either
	// cluster (back, a task may run on east again).
	returns  bool
	returned bool
	r        *rand.Rand // the placer's choices once east returned
	// tried are the records (ID and version) whose attempt LoseAttempt
	// refused to end, or that a move without a declaration tried: not
	// offered again at that version.
	tried  map[recVersion]bool
	paused bool // the partition began
	// balance: while both clusters answer and before a declaration, the
	// placer moves tasks without a pod from one cluster to the other, as
	// the service's rebalance gives one cluster's free slots to the tasks
	// waiting in the other's line: a move that races the live executor's
	// admission, claim and creation. Each task moves at most balanceMax
	// times (moves).
	balance bool
	moves   map[string]int
}

// balanceMax bounds the balance moves of one task.
const balanceMax = 2

// recVersion is a record at one version.
type recVersion struct {
	id      string
	version int64
}

func versionOf(r store.Record) recVersion { return recVersion{r.ID, r.Version} }

// partitionEnd is when east's partition ends (pauseAt when there is none).
func (cp *clusterPlan) partitionEnd() time.Duration { return cp.pauseAt + cp.pauseFor }

// drawClusters draws the clusters scenario from its own source (so that
// the runs that do not draw it keep the histories they had before it
// existed): a run of neither adoption nor replicas has it one time in
// three.
func (w *world) drawClusters() {
	r := rand.New(rand.NewPCG(uint64(w.opt.Seed), 0xc105e7)) //nolint:gosec // a seeded source that replays is the point
	on := r.IntN(3) == 0
	cp := &clusterPlan{tried: map[recVersion]bool{}, loseAt: time.Duration(1000+r.IntN(14000)) * time.Millisecond}
	if r.IntN(4) != 0 {
		cp.pauseFor = time.Duration(500+r.IntN(9000)) * time.Millisecond
		cp.pauseAt = max(cp.loseAt-time.Duration(r.IntN(4000))*time.Millisecond, 0)
	}
	east := make([]bool, 64)
	for i := range east {
		east[i] = r.IntN(3) != 0
	}
	cp.quiet = cp.pauseFor > 0 && (r.IntN(3) == 0 || w.opt.QuietMoves)
	cp.returns = r.IntN(2) == 0
	cp.r = r
	// Its own source: the runs without it keep the histories they had.
	cp.balance = rand.New(rand.NewPCG(uint64(w.opt.Seed), 0xba1a)).IntN(2) == 0 //nolint:gosec // a seeded source that replays is the point
	cp.moves = map[string]int{}
	if !on || w.opt.NoClusters || w.adopt || w.repl != nil {
		return
	}
	w.cl = cp
	for i, p := range w.plans {
		p.instance = instWest
		if east[i%len(east)] {
			p.instance = instEast
		}
	}
}

// clusterOf is the cluster of an executor instance ("" outside the
// clusters scenario).
func clusterOf(instance string) string {
	switch instance {
	case instEast:
		return "east"
	case instWest:
		return "west"
	}
	return ""
}

// instances are the executor instances the run keeps alive once the
// faults stop.
func (w *world) instances() []string {
	switch {
	case w.cl != nil:
		return []string{instEast, instWest}
	case w.adopt && w.now() < w.oldGone:
		return []string{"old"}
	}
	return []string{"sim"}
}

// clusterHousekeeping starts east's partition and the operator's
// declaration when they are due.
func (w *world) clusterHousekeeping(now time.Time) {
	cp := w.cl
	if cp.pauseFor > 0 && !cp.paused && w.now() >= cp.pauseAt {
		cp.paused = true
		for _, p := range w.procs {
			if p.instance == instEast && !p.dead {
				p.paused = now.Add(cp.pauseFor)
			}
		}
		note := fmt.Sprintf("cluster east partitioned from the service for %s", cp.pauseFor)
		if cp.quiet {
			note += "; the placer moves its movable tasks to west meanwhile"
		}
		w.hist.add(Event{Kind: KFault, Note: note})
	}
	if !cp.declared && !cp.quiet && w.now() >= cp.loseAt {
		cp.declared = true
		e, err := w.mem.BeginTerm(context.Background(), instEast)
		if err != nil {
			panic(err)
		}
		w.hist.add(Event{Kind: KFault, Note: fmt.Sprintf("the operator declares cluster east lost (began term %d of %s)", e, instEast)})
		w.reroute(func(p *plan) bool { return p.instance == instEast }, instWest) // users submit to the clusters there are
	}
	if cp.declared && cp.returns && !cp.returned && w.now() >= cp.partitionEnd() && !w.lostPodsOnEast() {
		cp.returned = true
		w.hist.add(Event{Kind: KFault, Note: "cluster east is Ready again: no pod of a lost attempt is left there"})
		w.reroute(func(*plan) bool { return cp.r.IntN(2) == 0 }, instEast) // users submit to east again
	}
}

// reroute sends the users' tasks not submitted yet that pick chooses to
// instance inst.
func (w *world) reroute(pick func(*plan) bool, inst string) {
	w.umu.Lock()
	defer w.umu.Unlock()
	for _, p := range w.plans {
		if !p.submitted && pick(p) {
			p.instance = inst
		}
	}
}

// operatorChoices are the operator's and the placer's next writes: one
// record each, so that the seed interleaves them with the executors'
// steps.
func (w *world) operatorChoices() []choice {
	if w.cl == nil {
		return nil
	}
	cp := w.cl
	if cp.quiet && cp.paused && w.now() < cp.partitionEnd() {
		return w.quietMoves()
	}
	if !cp.declared {
		if cp.balance && (!cp.paused || w.now() >= cp.partitionEnd()) {
			return w.balanceMoves()
		}
		return nil
	}
	recs, err := w.mem.List(context.Background(), store.ListOptions{NonTerminal: true})
	if err != nil {
		panic(err)
	}
	var cs []choice
	for _, r := range recs {
		r := r
		switch {
		case r.Executor == instEast && !cp.returned && !cp.tried[versionOf(r)]:
			cs = append(cs, choice{100, func() { w.declareLost(r) }})
		case r.Executor == "":
			cs = append(cs, choice{100, func() { w.place(r) }})
		}
	}
	return cs
}

// quietMoves are the placer's moves of east's tasks while east does not
// answer (no declaration): only what placement.Movable allows, each a
// compare-and-swap that sees no pod claimed.
func (w *world) quietMoves() []choice {
	recs, err := w.mem.List(context.Background(), store.ListOptions{Executor: instEast, NonTerminal: true})
	if err != nil {
		panic(err)
	}
	var cs []choice
	for _, r := range recs {
		r := r
		if placement.Movable(r) && !w.cl.tried[versionOf(r)] {
			cs = append(cs, choice{100, func() {
				w.cl.tried[versionOf(r)] = true
				w.move(r)
			}})
		}
	}
	return cs
}

// balanceMoves are the placer's moves of tasks without a pod between the
// two clusters while both answer (the service's rebalance): only what
// placement.Movable allows, each a compare-and-swap that sees no pod
// claimed, and both instances told, as the service tells them.
func (w *world) balanceMoves() []choice {
	recs, err := w.mem.List(context.Background(), store.ListOptions{NonTerminal: true})
	if err != nil {
		panic(err)
	}
	var cs []choice
	for _, r := range recs {
		r := r
		to := map[string]string{instEast: instWest, instWest: instEast}[r.Executor]
		if to == "" || !placement.Movable(r) || w.cl.tried[versionOf(r)] || w.cl.moves[r.ID] >= balanceMax {
			continue
		}
		cs = append(cs, choice{20, func() {
			w.cl.tried[versionOf(r)] = true
			w.cl.moves[r.ID]++
			w.moveTo(r, to)
			w.resync(r.Executor, r.ID) // the instance it leaves, as the service tells it
		}})
	}
	return cs
}

// operator is the store view of the operator's and the placer's writes:
// straight to the store (no steps), into the history.
func (w *world) operator() *simStore {
	return &simStore{inner: w.mem, steps: w.steps, hist: w.hist, actor: "operator", seen: w.seen}
}

// declareLost ends rec's attempt on east (its pod recorded) or moves rec to
// west (none), as `kubetask cluster lose east` does, from the record as it
// is now: a write that finds it changed since it was listed is tried again
// at the next choice.
func (w *world) declareLost(rec store.Record) {
	if !rec.PodCreated {
		w.move(rec)
		return
	}
	lost, err := executor.LoseAttempt(rec, "east", time.Now())
	if err != nil {
		w.cl.tried[versionOf(rec)] = true
		w.hist.add(Event{Kind: KFault, Task: w.hist.name(rec.ID, rec.Nonce), Note: "the operator's declaration refused: " + err.Error()})
		return
	}
	out, err := w.mem.Update(context.Background(), lost)
	switch {
	case errors.Is(err, store.ErrConflict):
		return // changed since the list: the next choice reads it again
	case err != nil:
		panic(err)
	}
	w.operator().note(out)
	w.hist.add(Event{Kind: KFault, Task: w.hist.name(out.ID, out.Nonce), Attempt: rec.Attempt, UID: rec.PodUID, Note: "the operator declared the attempt lost with cluster east"})
}

// place moves an unplaced record to west, the cluster left.
func (w *world) place(rec store.Record) {
	if w.cl.returned && w.cl.r.IntN(2) == 0 {
		w.moveTo(rec, instEast)
		return
	}
	w.move(rec)
}

// lostPodsOnEast reports whether east holds a pod of an attempt declared
// lost that is not gone: running, or held by kubetask's finalizer.
func (w *world) lostPodsOnEast() bool {
	w.srv.mu.Lock()
	var left []*corev1.Pod
	for _, pod := range w.srv.pods {
		if w.srv.podScope[pod.UID] == "east" && (slices.Contains(pod.Finalizers, task.Finalizer) || pod.Spec.NodeName != "" && !stoppedPod(pod)) {
			left = append(left, pod.DeepCopy())
		}
	}
	w.srv.mu.Unlock()
	for _, pod := range left {
		id, n, err := task.IdentityFromPod(pod)
		if err != nil {
			continue
		}
		rec, err := w.mem.Get(context.Background(), id.RunID)
		if err != nil || rec.Nonce != id.Nonce {
			continue
		}
		if n < len(rec.Attempts) && rec.Attempts[n].Reason == "ClusterLost" && rec.Attempts[n].PodUID == string(pod.UID) {
			return true
		}
	}
	return false
}

// move moves rec to west (a compare-and-swap at its version that sees no
// pod claimed) and tells west's live process of it, as the service's
// placer does.
func (w *world) move(rec store.Record) { w.moveTo(rec, instWest) }

// moveTo moves rec to inst's cluster, as move does.
func (w *world) moveTo(rec store.Record, inst string) {
	rec.Epoch = 0 // the operator's move is unfenced: the version is its guard
	out, err := w.mem.(store.Clusters).Move(context.Background(), rec, inst, clusterOf(inst))
	switch {
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrClaimed):
		return // changed since the list: the next choice reads it again
	case err != nil:
		panic(err)
	}
	w.operator().note(out)
	w.hist.add(Event{Kind: KFault, Task: w.hist.name(out.ID, out.Nonce), Attempt: out.Attempt, Note: fmt.Sprintf("placed on cluster %s (from %q)", clusterOf(inst), rec.Cluster)})
	w.resync(inst, out.ID)
}

// resync tells instance inst's live process, if any, to look at task id
// again (executor Resync), as the service's placer does after a move.
func (w *world) resync(inst, id string) {
	if p := w.live(inst); p != nil {
		if ex, ok := p.api.(interface{ Resync(string) }); ok {
			ex.Resync(id)
		}
	}
}
