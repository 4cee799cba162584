package chaos

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/logcapture"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/faults/chaos/history"
)

// The group's shape: three replicas, 12 shards, a 6 s lease.
var replicaIDs = []string{"r0", "r1", "r2"}

const (
	shards = 12
	lease  = 6 * time.Second
)

// result is what a run found.
type result struct {
	report  *history.Report
	summary string
}

// runChaos runs one chaos run of size sz and judges it.
func runChaos(tb testing.TB, sz size) result {
	tb.Helper()
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("KUBETASK_CHAOS_SEED"), 10, 64); err == nil {
		seed = s
	}
	tb.Logf("chaos %s: seed %d (KUBETASK_CHAOS_SEED=%d replays its choices)", sz.name, seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	dir, err := os.MkdirTemp("", "kubetask-chaos-")
	if err != nil {
		tb.Fatal(err)
	}
	defer func() {
		if tb.Failed() || os.Getenv("KUBETASK_CHAOS_KEEP") != "" {
			if a := clustertest.Cluster().AuditLogPath(); a != "" {
				_ = copyFile(a, filepath.Join(dir, "audit.log"))
			}
			_ = os.Remove(filepath.Join(dir, "kubetask")) // the binary: 160 MB
			tb.Logf("kept the run directory (replica logs, audit log): %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()

	env := clustertest.New(tb)
	pg, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = pg.Stop() }()
	_, url, err := pg.CreateDatabase(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	bin, err := clustertest.BuildKubetask(ctx, dir)
	if err != nil {
		tb.Fatal(err)
	}
	g := &group{tb: tb, env: env, bin: bin, dir: dir, storeURL: url, name: "chaos", shards: shards, lease: lease,
		extra:    []string{"--qps", strconv.Itoa(sz.qps), "--burst", strconv.Itoa(sz.qpsBurst)},
		replicas: map[string]*replicaProc{}}
	defer g.stopAll()
	for _, id := range replicaIDs {
		if _, err := g.start(ctx, id); err != nil {
			tb.Fatal(err)
		}
	}
	if err := g.waitHeldBy(ctx, 2*time.Minute, replicaIDs...); err != nil {
		tb.Fatal(err)
	}
	st, err := store.OpenPostgres(ctx, url, store.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	defer st.Close()

	w := &workload{g: g, ns: env.Namespace, rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), byKind: map[string]int{}}
	inj := &injector{g: g, w: w, c: env.Cluster, pg: pg, st: st, rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), begin: time.Now(), burst: sz.burst}
	plan := planFaults(tb, rng, sz)
	tb.Logf("fault plan: %s", strings.Join(plan, "; "))

	// The stream of tasks and the faults, at once.
	var wg sync.WaitGroup
	var streamErr error
	faultsDone := make(chan struct{})
	wg.Go(func() { streamErr = stream(ctx, w, sz, faultsDone) })
	var faults []fault
	for _, kind := range plan {
		gap := sz.gap[0] + time.Duration(rng.Int64N(int64(sz.gap[1]-sz.gap[0])+1))
		select {
		case <-ctx.Done():
		case <-time.After(gap): // the pause between faults is part of the plan
		}
		f := inj.inject(ctx, kind)
		tb.Logf("fault %d at %s: %s: %s (%v)", len(faults)+1, secs(f.start), f.kind, f.note, f.err)
		faults = append(faults, f)
	}
	close(faultsDone)
	wg.Wait()
	if streamErr != nil {
		tb.Errorf("submitting: %v", streamErr)
	}
	// Every replica running again (a fault that failed half-way).
	for _, id := range replicaIDs {
		if r := g.get(id); r.stopped {
			_ = g.signal(id, syscall.SIGCONT)
		} else if r.exited() {
			if _, err := g.start(ctx, id); err != nil {
				tb.Error(err)
			}
		}
	}
	ids := w.all()
	finishStart := time.Now()
	if err := waitFor(ctx, sz.finish, func(ctx context.Context) error { return terminal(ctx, st, ids) }); err != nil {
		tb.Logf("waiting for every task to finish: %v (the checker reports them)", err)
	}
	finished := time.Since(finishStart)
	pods := env.Client.CoreV1().Pods(env.Namespace)
	// A log whose node does not serve it holds its pod for up to 5
	// minutes (logcapture.DefaultGiveUpAfter): wait longer than that.
	if err := waitFor(ctx, logcapture.DefaultGiveUpAfter+time.Minute, func(ctx context.Context) error {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if err == nil && len(l.Items) > 0 {
			err = fmt.Errorf("%d task pods left", len(l.Items))
		}
		return err
	}); err != nil {
		tb.Logf("waiting for the task pods to go: %v (the checker reports them)", err)
	}
	g.stopAll()

	// The history, from the outside.
	left, err := pods.List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
	if err != nil {
		tb.Fatal(err)
	}
	f, err := os.Open(env.Cluster.AuditLogPath())
	if err != nil {
		tb.Fatal(err)
	}
	audit, err := history.ReadAudit(f)
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	tasks, err := history.ReadStore(ctx, st)
	if err != nil {
		tb.Fatal(err)
	}
	in := history.Input{Audit: audit, Tasks: tasks, Namespaces: []string{env.Namespace}, Left: left.Items}
	rep := history.Check(in)
	for i := range faults {
		if f := &faults[i]; f.fence != nil {
			f.fence.gated = len(audit.Fenced(inj.begin.Add(f.start), inj.begin.Add(f.end), f.fence.executors...))
			f.note += fmt.Sprintf("; gated pods of its shards never bound (audit log): %d", f.fence.gated)
		}
	}
	defer func() {
		// What the checker read besides the audit log, for
		// `go test ./test/faults/chaos/history -run TestRecheck` on a kept run.
		if tb.Failed() || os.Getenv("KUBETASK_CHAOS_KEEP") != "" {
			if err := history.SaveInput(dir, in); err != nil {
				tb.Logf("saving the store's records: %v", err)
			}
		}
	}()
	res := result{report: rep}
	res.summary = summary(sz, seed, w, faults, rep, inj.begin, finished)
	if len(rep.Violations) > 0 {
		tb.Errorf("%d violations:\n%s", len(rep.Violations), rep.Examples(5))
	}
	for i, f := range faults {
		switch {
		case f.err != nil:
			tb.Errorf("fault %d (%s) failed: %v", i+1, f.kind, f.err)
		case f.fence != nil && !f.fence.exercised():
			// As test/bench/storm fails a storm without a 410: a SIGSTOP after
			// which nothing was refused proved nothing about the fence.
			tb.Errorf("fault %d (%s) did not exercise the fence: after SIGCONT %s's log shows no creation refused for a newer term, no store write fenced and no gated pod discarded, and the audit log no gated pod of its shards (%s) that never ran; the fault tested nothing",
				i+1, f.kind, f.fence.victim, strings.Join(f.fence.executors, ", "))
		}
	}
	if len(tasks) != len(ids) {
		tb.Errorf("the store has %d records, %d tasks were submitted", len(tasks), len(ids))
	}
	return res
}

// planFaults is the run's faults in order: a SIGSTOP first, then, shuffled,
// sz.stops-1 more SIGSTOPs and sz.faults others: each kind once (as many
// as fit), the rest drawn at random. The kinds are every kind, or those that
// KUBETASK_CHAOS_FAULTS names (comma-separated short names: stop, kill,
// term, apiserver, storm, postgres, force, evict, node).
func planFaults(tb testing.TB, rng *rand.Rand, sz size) []string {
	kinds := faultKinds
	if env := os.Getenv("KUBETASK_CHAOS_FAULTS"); env != "" {
		kinds = nil
		for _, n := range strings.Split(env, ",") {
			k, ok := faultNames[strings.TrimSpace(n)]
			if !ok {
				tb.Fatalf("KUBETASK_CHAOS_FAULTS: no fault %q (want some of stop, kill, term, apiserver, storm, postgres, force, evict, node)", n)
			}
			kinds = append(kinds, k)
		}
	}
	others := slices.DeleteFunc(slices.Clone(kinds), func(k string) bool { return k == faultStop })
	if len(others) == 0 {
		others = kinds
	}
	rng.Shuffle(len(others), func(i, j int) { others[i], others[j] = others[j], others[i] })
	rest := others[:min(sz.faults, len(others))]
	for len(rest) < sz.faults {
		rest = append(rest, kinds[rng.IntN(len(kinds))])
	}
	for range sz.stops - 1 {
		rest = append(rest, faultStop)
	}
	rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	return append([]string{faultStop}, rest...)
}

// stream submits sz.tasks tasks evenly over sz.stream, then on at that
// pace until faultsDone is closed: every fault meets tasks that run.
func stream(ctx context.Context, w *workload, sz size, faultsDone <-chan struct{}) error {
	const tick = time.Second
	steps := max(int(sz.stream/tick), 1)
	for i := 0; ; i++ {
		if i >= steps {
			select {
			case <-faultsDone:
				return nil
			default:
			}
		}
		n := sz.tasks*(i+1)/steps - sz.tasks*i/steps
		if _, err := w.submit(ctx, n, nil); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(tick): // the pace of the stream
		}
	}
}

// summary is the run's table.
func summary(sz size, seed uint64, w *workload, faults []fault, rep *history.Report, begin time.Time, finished time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos %s, seed %d: %d replicas, %d shards, lease %s, replica QPS %d/%d, kwok nodes and a local node\n\n",
		sz.name, seed, len(replicaIDs), shards, lease, sz.qps, sz.qpsBurst)
	fmt.Fprintf(&b, "| tasks submitted | count |\n| --- | --- |\n")
	for _, k := range slices.Sorted(maps.Keys(w.byKind)) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, w.byKind[k])
	}
	fmt.Fprintf(&b, "| all (submissions sent again to another replica) | %d (%d) |\n\n", len(w.all()), w.retried.Load())
	byKind := map[string]int{}
	for _, f := range faults {
		byKind[f.kind]++
	}
	fmt.Fprintf(&b, "| faults by kind | count |\n| --- | --- |\n")
	for _, k := range faultKinds {
		fmt.Fprintf(&b, "| %s | %d |\n", k, byKind[k])
	}
	fmt.Fprintf(&b, "\n| # | at | took | fault | what it did | violations of 1-3 attributed |\n| --- | --- | --- | --- | --- | --- |\n")
	attributed := attribute(faults, rep, begin)
	for i, f := range faults {
		note := f.note
		if f.err != nil {
			note += fmt.Sprintf(" (error: %v)", f.err)
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %d |\n", i+1, secs(f.start), secs(f.end-f.start), f.kind, note, attributed[i])
	}
	fmt.Fprintf(&b, "\nafter the faults, every task finished within %s\n\n", secs(finished))
	b.WriteString(rep.Table())
	return b.String()
}

// attribute counts the violations of invariants 1-3 by the last fault that
// started before the offending pod was created (or bound).
func attribute(faults []fault, rep *history.Report, begin time.Time) map[int]int {
	out := map[int]int{}
	for _, v := range rep.Violations {
		if v.At.IsZero() {
			continue
		}
		last := -1
		for i, f := range faults {
			if !begin.Add(f.start).After(v.At) {
				last = i
			}
		}
		if last >= 0 {
			out[last]++
		}
	}
	return out
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
