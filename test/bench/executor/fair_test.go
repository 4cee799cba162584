package executor

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/bench/benchresult"
	"github.com/kubetask/kubetask/test/exectest"
)

// fairSize is one fairness comparison: namespace A submits a tasks, then,
// once A's tasks fill every slot and the rest of them wait, namespace B
// submits b; parallelism slots.
type fairSize struct{ a, b, parallelism int }

// fairFull is the run: 2,000 quick tasks of A, then 10 of B.
var fairFull = fairSize{a: 2000, b: 10, parallelism: 100}

// fairTiny is CI's run of the same code (TestFairShareTiny).
var fairTiny = fairSize{a: 80, b: 3, parallelism: 4}

// fairRow is what one run measured, from B's submission (the end of it).
type fairRow struct {
	order executor.SlotOrder
	size  fairSize
	// bFirstPod: to B's first PodCreated; bLast: to B's last outcome;
	// aLast: to A's last outcome.
	bFirstPod, bLast, aLast time.Duration
	// turnover is one slot turnover: the mean interval between two of A's
	// outcomes over A's whole run.
	turnover time.Duration
	// lifetime is the median time from a pod's creation to its release.
	lifetime time.Duration
	// aBeforeB is how many of A's pods were created after B's submission
	// and before B's first.
	aBeforeB int
	// writes is the record writes (Create and Update) over the whole run,
	// slotWaits the updates that recorded WaitingForSlot, waited the tasks
	// that ever waited for a slot (a WaitingForSlot event, or a Submitted
	// one that says so).
	writes, slotWaits, waited int
}

// countingStore counts the record writes (Create, Update) of the store it
// wraps, and the updates that record WaitingForSlot.
type countingStore struct {
	store.Store
	writes, slotWaits atomic.Int64
}

func (c *countingStore) Create(ctx context.Context, rec store.Record) (store.Record, bool, error) {
	c.writes.Add(1)
	return c.Store.Create(ctx, rec)
}

func (c *countingStore) Update(ctx context.Context, rec store.Record) (store.Record, error) {
	c.writes.Add(1)
	if rec.Reason == "WaitingForSlot" {
		c.slotWaits.Add(1)
	}
	return c.Store.Update(ctx, rec)
}

// fairEvents records, per task, the time of its first event of each type.
type fairEvents struct {
	mu    sync.Mutex
	first map[string]map[executor.EventType]time.Time
	// all is every event of each task, in order, for the explanation of a
	// run that does not end.
	all map[string][]executor.Event
}

func (f *fairEvents) add(ev executor.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.all[ev.ID] = append(f.all[ev.ID], ev)
	m := f.first[ev.ID]
	if m == nil {
		m = map[executor.EventType]time.Time{}
		f.first[ev.ID] = m
	}
	typ := ev.Type
	if ev.Terminal {
		typ = "Terminal"
	}
	if (ev.Type == executor.EventState || ev.Type == executor.EventSubmitted) && ev.Reason == "WaitingForSlot" {
		typ = "WaitingForSlot"
	}
	if _, ok := m[typ]; !ok {
		m[typ] = time.Now()
	}
}

// times returns the time of typ of every task whose ID starts with prefix.
func (f *fairEvents) times(prefix string, typ executor.EventType) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []time.Time
	for id, m := range f.first {
		if t, ok := m[typ]; ok && strings.HasPrefix(id, prefix) {
			out = append(out, t)
		}
	}
	return out
}

// fairRun runs one comparison with the executor's slot order: A's tasks in
// one namespace, B's in another, one executor over both.
func fairRun(tb testing.TB, order executor.SlotOrder, sz fairSize) fairRow {
	tb.Helper()
	envA, envB := clustertest.New(tb), clustertest.New(tb)
	evs := &fairEvents{first: map[string]map[executor.EventType]time.Time{}, all: map[string][]executor.Event{}}
	st := &countingStore{Store: store.NewMemory()}
	ex, stop := exectest.StartExecutor(tb, envA, executor.Config{
		InstanceID: "fair", Namespaces: []string{envA.Namespace, envB.Namespace},
		Parallelism: sz.parallelism, SlotOrder: order, Workers: 16, CreateConcurrency: 8,
		Store: st, OnEvent: evs.add,
	})
	defer stop()
	ctx := context.Background()
	aStart := time.Now()
	for i := range sz.a {
		id := fmt.Sprintf("a%05d", i)
		t := quickTask(id)
		t.Namespace = envA.Namespace
		if _, err := ex.Submit(ctx, id, t); err != nil {
			tb.Fatalf("submitting %s: %v", id, err)
		}
	}
	// B comes once A's pods have filled the slots for a few turnovers and
	// at least half of A's tasks still wait.
	waitFor(tb, 10*time.Minute, "A fills the slots", func() (bool, string) {
		done := len(evs.times("a", "Terminal"))
		return done >= sz.parallelism, fmt.Sprintf("%d of A's tasks done", done)
	})
	if done := len(evs.times("a", "Terminal")); done > sz.a/2 {
		tb.Fatalf("%d of A's %d tasks were done before B could come: too few to measure (KUBETASK_FAIR_A)", done, sz.a)
	}
	bSubmit := time.Now()
	for i := range sz.b {
		id := fmt.Sprintf("b%05d", i)
		t := quickTask(id)
		t.Namespace = envB.Namespace
		if _, err := ex.Submit(ctx, id, t); err != nil {
			tb.Fatalf("submitting %s: %v", id, err)
		}
	}
	bSubmitted := time.Now()
	waitFor(tb, 20*time.Minute, "every task", func() (bool, string) {
		a, b := len(evs.times("a", "Terminal")), len(evs.times("b", "Terminal"))
		released := len(evs.times("", executor.EventPodReleased))
		done := a == sz.a && b == sz.b && released == sz.a+sz.b
		progress := fmt.Sprintf("%s: %d of A's and %d of B's tasks done, %d pods released",
			time.Since(aStart).Round(time.Second), a, b, released)
		if !done && a+b == sz.a+sz.b {
			progress += evs.unreleased(ctx, st, envA, envB)
		}
		return done, progress
	})
	r := fairRow{order: order, size: sz}
	bPods := evs.times("b", executor.EventPodCreated)
	first := earliest(bPods)
	r.bFirstPod = first.Sub(bSubmitted)
	r.bLast = latest(evs.times("b", "Terminal")).Sub(bSubmitted)
	r.aLast = latest(evs.times("a", "Terminal")).Sub(bSubmitted)
	if aDone := evs.times("a", "Terminal"); len(aDone) > 1 {
		n := len(aDone)
		r.turnover = latest(aDone).Sub(earliest(aDone)) / time.Duration(n-1)
	}
	for _, t := range evs.times("a", executor.EventPodCreated) {
		if t.After(bSubmit) && t.Before(first) {
			r.aBeforeB++
		}
	}
	evs.mu.Lock()
	var lifetimes []time.Duration
	for _, m := range evs.first {
		if c, ok := m[executor.EventPodCreated]; ok {
			if rel, ok := m[executor.EventPodReleased]; ok {
				lifetimes = append(lifetimes, rel.Sub(c))
			}
		}
	}
	evs.mu.Unlock()
	r.lifetime = percentile(lifetimes, 0.5)
	r.writes, r.slotWaits = int(st.writes.Load()), int(st.slotWaits.Load())
	r.waited = len(evs.times("", "WaitingForSlot"))
	stop()
	exectest.WaitNoTaskPods(tb, envA, 2*time.Minute)
	exectest.WaitNoTaskPods(tb, envB, 2*time.Minute)
	return r
}

// unreleased describes the tasks that ended without a PodReleased event:
// their events, their records' outcomes and their pods as the API server
// shows them now.
func (f *fairEvents) unreleased(ctx context.Context, st store.Store, envs ...*clustertest.Env) string {
	f.mu.Lock()
	var ids []string
	for id, m := range f.first {
		if _, ok := m[executor.EventPodReleased]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var b strings.Builder
	for _, id := range ids[:min(len(ids), 3)] {
		fmt.Fprintf(&b, "\n      task %s: events", id)
		for _, ev := range f.all[id] {
			fmt.Fprintf(&b, " %s(%d %s %s %s)", ev.Type, ev.Attempt, ev.Phase, ev.Reason, ev.Pod)
		}
	}
	f.mu.Unlock()
	for _, id := range ids[:min(len(ids), 3)] {
		if rec, err := st.Get(ctx, id); err == nil {
			fmt.Fprintf(&b, "\n      task %s: record %s %s attempt %d, outcomes %+v", id, rec.Phase, rec.Reason, rec.Attempt, rec.Attempts)
		}
		for _, env := range envs {
			pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.LabelRun + "=" + id})
			if err != nil {
				fmt.Fprintf(&b, "\n      listing pods of %s: %v", id, err)
				continue
			}
			for _, p := range pods.Items {
				fmt.Fprintf(&b, "\n      pod %s: phase %s, node %q, deleting %v, finalizers %v, labels %v, statuses %+v",
					p.Name, p.Status.Phase, p.Spec.NodeName, p.DeletionTimestamp != nil, p.Finalizers, p.Labels, p.Status.ContainerStatuses)
			}
		}
	}
	return b.String()
}

func earliest(ts []time.Time) time.Time {
	var e time.Time
	for _, t := range ts {
		if e.IsZero() || t.Before(e) {
			e = t
		}
	}
	return e
}

func latest(ts []time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

// writesTable formats the record writes of the runs: all of them per
// task, and those that recorded WaitingForSlot (what showing it in lists
// costs) per task that waited and as a share of all.
func writesTable(rows []fairRow) string {
	var b strings.Builder
	b.WriteString("| slot order | tasks | record writes | per task | tasks that waited | WaitingForSlot updates | per task that waited | share of the writes |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		n := r.size.a + r.size.b
		fmt.Fprintf(&b, "| %s | %d | %d | %.2f | %d | %d | %.2f | %.1f %% |\n", r.order, n, r.writes, float64(r.writes)/float64(n),
			r.waited, r.slotWaits, float64(r.slotWaits)/float64(max(r.waited, 1)), 100*float64(r.slotWaits)/float64(max(r.writes, 1)))
	}
	return b.String()
}

// fairTable formats the runs, each against the first (the FIFO baseline).
func fairTable(rows []fairRow) string {
	var b strings.Builder
	b.WriteString("| slot order | A tasks, then B tasks | parallelism | slot turnover (A's outcomes apart) | pod lifetime p50 | B's first pod | A's pods created before it | B's last outcome | A's last outcome | B's last vs FIFO |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		vs := "-"
		if rows[0].bLast > 0 {
			vs = fmt.Sprintf("%.3fx", r.bLast.Seconds()/rows[0].bLast.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %d, then %d | %d | %s | %s | %s | %d | %s | %s | %s |\n",
			r.order, r.size.a, r.size.b, r.size.parallelism, durString(r.turnover), durString(r.lifetime),
			durString(r.bFirstPod), r.aBeforeB, durString(r.bLast), durString(r.aLast), vs)
	}
	return b.String()
}

func fairSizeFromEnv() fairSize {
	sz := fairFull
	for _, f := range []struct {
		name string
		v    *int
	}{{"A", &sz.a}, {"B", &sz.b}, {"PARALLELISM", &sz.parallelism}} {
		if n, err := strconv.Atoi(os.Getenv("KUBETASK_FAIR_" + f.name)); err == nil && n > 0 {
			*f.v = n
		}
	}
	return sz
}

// BenchmarkFairShare: namespace A submits 2,000 quick tasks on kwok nodes,
// then namespace B submits 10, with one executor (Parallelism 100) over
// both: how long B waits for its first pod and its last outcome, from its
// submission, with the slots in one FIFO line (the baseline) and shared
// between the namespaces (SlotOrderFair), in the same process.
//
//	go test ./test/bench/executor -run '^$' -bench BenchmarkFairShare -benchtime 1x -timeout 30m
//
// KUBETASK_FAIR_A, KUBETASK_FAIR_B and KUBETASK_FAIR_PARALLELISM change the
// sizes.
func BenchmarkFairShare(b *testing.B) {
	sz := fairSizeFromEnv()
	ensureSimNodes(b, benchNodes)
	res := benchresult.Start(b, "fair", "size", fmt.Sprintf("A %d, B %d, parallelism %d", sz.a, sz.b, sz.parallelism))
	for i := 0; i < b.N; i++ {
		rows := []fairRow{fairRun(b, executor.SlotOrderFIFO, sz), fairRun(b, executor.SlotOrderFair, sz)}
		fmt.Print("\n" + fairTable(rows) + "\n" + writesTable(rows))
		res.Report(b, rows[1].bFirstPod.Seconds(), "s-B-first-pod-fair")
		res.Report(b, rows[0].bFirstPod.Seconds(), "s-B-first-pod-fifo")
		res.Report(b, rows[1].bLast.Seconds(), "s-B-last-fair")
		res.Report(b, rows[0].bLast.Seconds(), "s-B-last-fifo")
		res.Report(b, float64(rows[1].slotWaits)/float64(max(rows[1].waited, 1)), "slot-wait-writes/waiting-task-fair")
	}
}

// TestFairShareTiny runs BenchmarkFairShare's code with a few tasks, so it
// cannot rot. Its times mean nothing; the order of events is checked:
// under SlotOrderFair few of A's pods are created after B's submission and
// before B's first (those admitted already, at most one per slot, and a
// creation that overtook B's on another creator), and B finishes before
// A's backlog does; under FIFO B's first pod waits for A's backlog (at
// least half of A's tasks).
func TestFairShareTiny(t *testing.T) {
	fifo := fairRun(t, executor.SlotOrderFIFO, fairTiny)
	fair := fairRun(t, executor.SlotOrderFair, fairTiny)
	t.Log("\n" + fairTable([]fairRow{fifo, fair}) + "\n" + writesTable([]fairRow{fifo, fair}))
	for _, r := range []fairRow{fifo, fair} {
		// Recorded by the submission of a task that waits from it, else
		// when it starts waiting, and again only when another limit holds
		// it (here there is one: Parallelism): at most one update each.
		if r.waited == 0 || r.slotWaits > r.waited {
			t.Errorf("%s: %d WaitingForSlot updates for %d tasks that waited, want at least one task and at most one update each", r.order, r.slotWaits, r.waited)
		}
	}
	bound := 2 * fairTiny.parallelism
	if fair.aBeforeB > bound {
		t.Errorf("fair: %d of A's pods were created after B's submission and before B's first, want at most %d", fair.aBeforeB, bound)
	}
	if fair.bLast >= fair.aLast {
		t.Errorf("fair: B's last outcome %s after its submission, A's %s: B should finish first", fair.bLast, fair.aLast)
	}
	if fifo.aBeforeB <= bound {
		t.Errorf("fifo: only %d of A's pods came before B's first: the baseline is not one line behind A's backlog", fifo.aBeforeB)
	}
}
