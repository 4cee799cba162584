package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/bench/benchresult"
)

// replicaSetup is one configuration of BenchmarkServeReplicas: a store and
// a number of `kubetask serve` replicas sharing it.
type replicaSetup struct {
	name     string
	postgres bool // else SQLite (one replica)
	replicas int
}

// replicaSetups are the benchmark's configurations, SQLite (the default
// store, one process) first as the baseline.
var replicaSetups = []replicaSetup{
	{"sqlite-1", false, 1},
	{"postgres-1", true, 1},
	{"postgres-2", true, 2},
	{"postgres-3", true, 3},
}

// replicaShards is the group's shard count: divisible by 1, 2 and 3.
const replicaShards = 12

// replicaSize is the shape of one run of one setup.
type replicaSize struct {
	tasks, clients int
	qps            float32 // each replica's executor client limit
	timeout        time.Duration
}

// replicaResult is what one run measured.
type replicaResult struct {
	setup replicaSetup
	size  replicaSize
	// first submission sent to: the last outcome on the watch, the last pod
	// gone.
	outcomes, podsGone time.Duration
	// main container seen terminated (pod informer) -> the outcome on the
	// watch of replica 0 (which, with several replicas, runs only a third or
	// half of the tasks: the others' outcomes reach it shared through the
	// store).
	lags      []time.Duration
	submits   []time.Duration
	rowWrites int64 // PostgreSQL: rows inserted, updated and deleted in the database
	cpu       string
	cpuTotal  time.Duration
	// The API server's requests on pods (all clients, but for the pod
	// status and binding subresources: kwok's and the scheduler's) and on
	// Leases (membership and shard Leases of the replicas).
	podReqs, leaseReqs float64
}

func (r replicaResult) tasksPerSecond() float64 { return float64(r.size.tasks) / r.outcomes.Seconds() }

func (r replicaResult) summary() string {
	s := fmt.Sprintf("%s: %d tasks from %d clients, QPS %g per replica: every outcome after %.1f s (%.1f tasks/s), every pod gone after %.1f s;\n"+
		"  outcome lag (main terminated -> outcome on replica 0's watch) p50 %.0f ms p99 %.0f ms; submit p50 %.1f ms p99 %.1f ms;\n"+
		"  API requests on pods %.0f (%.2f per task), on Leases %.0f; CPU %s",
		r.setup.name, r.size.tasks, r.size.clients, r.size.qps, r.outcomes.Seconds(), r.tasksPerSecond(), r.podsGone.Seconds(),
		ms(percentile(r.lags, 0.5)), ms(percentile(r.lags, 0.99)), ms(percentile(r.submits, 0.5)), ms(percentile(r.submits, 0.99)),
		r.podReqs, r.podReqs/float64(r.size.tasks), r.leaseReqs, r.cpu)
	if r.setup.postgres {
		s += fmt.Sprintf("\n  PostgreSQL row writes: %d (%.1f per task, %.0f/s)", r.rowWrites, float64(r.rowWrites)/float64(r.size.tasks), float64(r.rowWrites)/r.outcomes.Seconds())
	}
	return s
}

// BenchmarkServeReplicas runs the same tasks through 1, 2 and 3 replicas of
// `kubetask serve` on one PostgreSQL store, and through one on SQLite, all
// at the same client QPS per replica, on the same cluster: 1,000 tasks
// (KUBETASK_BENCH_REPLICA_TASKS) from 32 clients, each submitted to the
// replicas in turn, each task's only container completing with 0 on a kwok
// node as soon as its pod runs. It reports tasks/s to the last outcome, the
// outcome lag, PostgreSQL's row writes and each configuration's tasks/s
// against SQLite's single process in the same run.
//
//	go test ./test/bench/serve -run '^$' -bench BenchmarkServeReplicas -benchtime 1x -timeout 60m
func BenchmarkServeReplicas(b *testing.B) {
	res := benchresult.Start(b, "serve")
	sz := replicaSize{
		tasks: envInt("KUBETASK_BENCH_REPLICA_TASKS", 1000), clients: 32,
		qps: float32(envInt("KUBETASK_BENCH_REPLICA_QPS", 50)), timeout: 30 * time.Minute,
	}
	for range b.N {
		var results []replicaResult
		for _, setup := range replicaSetups {
			r := runReplicas(b, setup, sz)
			fmt.Println(r.summary())
			results = append(results, r)
		}
		fmt.Println(replicaTable(results))
		for _, r := range results {
			res.Report(b, r.tasksPerSecond(), r.setup.name+"-tasks/s")
			res.Report(b, ms(percentile(r.lags, 0.99)), r.setup.name+"-lag-p99-ms")
		}
	}
}

// TestServeReplicasTiny runs BenchmarkServeReplicas's code at a tiny size,
// on SQLite and with two replicas.
func TestServeReplicasTiny(t *testing.T) {
	sz := replicaSize{tasks: 12, clients: 4, qps: 50, timeout: 3 * time.Minute}
	var results []replicaResult
	for _, setup := range []replicaSetup{replicaSetups[0], replicaSetups[2]} {
		r := runReplicas(t, setup, sz)
		t.Log(r.summary())
		results = append(results, r)
	}
	t.Log("\n" + replicaTable(results))
}

// replicaTable renders the results as a Markdown table, each setup's tasks/s
// against the first's.
func replicaTable(rs []replicaResult) string {
	var b strings.Builder
	b.WriteString("| setup | tasks/s | vs " + rs[0].setup.name + " | outcome lag p50 | p99 | pod API requests/task | PostgreSQL row writes/s | CPU-s per 1,000 tasks |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rs {
		writes := "-"
		if r.setup.postgres {
			writes = fmt.Sprintf("%.0f", float64(r.rowWrites)/r.outcomes.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %.1f | %.2fx | %.0f ms | %.0f ms | %.2f | %s | %.0f |\n", r.setup.name, r.tasksPerSecond(),
			r.tasksPerSecond()/rs[0].tasksPerSecond(), ms(percentile(r.lags, 0.5)), ms(percentile(r.lags, 0.99)),
			r.podReqs/float64(r.size.tasks), writes, r.cpuTotal.Seconds()*1000/float64(r.size.tasks))
	}
	return b.String()
}

// runReplicas starts setup's replicas in a namespace of their own, waits for
// the shards to be balanced, submits sz.tasks, and measures until every
// outcome is on replica 0's watch and every pod is gone. It fails tb unless
// every task succeeds with exactly one outcome.
func runReplicas(tb testing.TB, setup replicaSetup, sz replicaSize) replicaResult {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := clustertest.New(tb)
	tb.Cleanup(func() { releaseLeftovers(tb, env) }) // after the services stopped
	r := replicaResult{setup: setup, size: sz}

	common := []string{"--parallelism", strconv.Itoa(sz.tasks),
		"--qps", strconv.FormatFloat(float64(sz.qps), 'f', -1, 32), "--burst", strconv.Itoa(int(2 * sz.qps))}
	var environ []string
	var storeURL string
	if setup.postgres {
		storeURL = pgtest.Database(tb)
		environ = []string{"KUBETASK_STORE_URL=" + storeURL}
		common = append(common, "--store", "postgres", "--auth", "none", "--shards", strconv.Itoa(replicaShards),
			"--lease-namespace", env.Namespace)
	}
	var svcs []*service
	for i := range setup.replicas {
		args := common
		if setup.postgres {
			args = append(append([]string(nil), common...), "--replica-id", fmt.Sprintf("r%d", i))
		}
		svcs = append(svcs, startServiceEnv(tb, env, environ, args...))
	}
	if setup.postgres {
		waitBalanced(ctx, tb, env, setup.replicas)
	}

	tr := trackMains(ctx, tb, env)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	cursor, err := svcs[0].cursor(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	w := svcs[0].watch(wctx, cursor)

	docs := make([][]byte, sz.tasks)
	for i := range docs {
		if docs[i], err = json.Marshal(quickTask(fmt.Sprintf("quick-%d", i))); err != nil {
			tb.Fatal(err)
		}
	}
	cpu := newCPUMeter(nil)
	for i, s := range svcs {
		cpu.add(fmt.Sprintf("kubetask serve %d", i), s.cmd.Process.Pid)
	}
	writes0 := rowWrites(ctx, tb, storeURL)
	reqs0 := apiserverRequests(tb)
	ids := make([]string, sz.tasks)
	start := time.Now()
	var errs []error
	r.submits, _, errs = concurrently(sz.tasks, sz.clients, func(i int) error {
		var err error
		ids[i], err = svcs[i%len(svcs)].submit(ctx, docs[i])
		return err
	})
	if len(errs) > 0 {
		tb.Fatalf("%d of %d submissions failed; the first: %v", len(errs), sz.tasks, errs[0])
	}
	if err := w.wait(sz.timeout, "every task's outcome on replica 0's watch", func(terminal, _ int) bool { return terminal >= sz.tasks }); err != nil {
		tb.Fatal(err)
	}
	last, outcomes := w.last(ids, false)
	r.outcomes = last.Sub(start)
	poll(tb, sz.timeout, "every pod to be gone", func() bool { return tr.gone() >= sz.tasks })
	r.podsGone = tr.lastGone().Sub(start)
	r.cpu, r.cpuTotal = cpu.report()
	r.rowWrites = rowWrites(ctx, tb, storeURL) - writes0
	r.podReqs, r.leaseReqs = podAndLeaseRequests(reqs0, apiserverRequests(tb))
	if len(outcomes) != sz.tasks {
		tb.Fatalf("%d outcomes of the %d tasks submitted", len(outcomes), sz.tasks)
	}
	for _, o := range outcomes {
		if o.ev.Phase != "Succeeded" {
			tb.Fatalf("task %s: %s/%s %s, want Succeeded", o.ev.TaskID, o.ev.Phase, o.ev.Reason, o.ev.Message)
		}
		if seen, ok := tr.terminatedAt(o.ev.TaskID); ok {
			r.lags = append(r.lags, o.at.Sub(seen))
		}
	}
	if len(r.lags) < sz.tasks*9/10 {
		tb.Errorf("the main container's end seen for %d of %d tasks only", len(r.lags), sz.tasks)
	}
	for _, s := range svcs {
		s.stop(tb)
	}
	return r
}

// waitBalanced waits until every shard Lease of env's group (the
// services' instance ID) is held by one of the replicas r0..r<n-1>, each
// holding its share.
func waitBalanced(ctx context.Context, tb testing.TB, env *clustertest.Env, n int) {
	tb.Helper()
	group := "bench-" + env.Namespace
	lo, hi := replicaShards/n, (replicaShards+n-1)/n
	poll(tb, 2*time.Minute, "the shards to be balanced", func() bool {
		load := map[string]int{}
		for k := range replicaShards {
			l, err := env.Client.CoordinationV1().Leases(env.Namespace).Get(ctx, executor.LeaseName(replica.ShardID(group, k)), metav1.GetOptions{})
			if err != nil || l.Spec.HolderIdentity == nil {
				return false
			}
			load[*l.Spec.HolderIdentity]++
		}
		for i := range n {
			if c := load[fmt.Sprintf("r%d", i)]; c < lo || c > hi {
				return false
			}
		}
		return true
	})
}

// podAndLeaseRequests sums the API server's requests between two reads
// (apiserverRequests) on pods, but for the status and binding
// subresources, and on Leases.
func podAndLeaseRequests(before, after map[string]float64) (pods, leases float64) {
	for k, v := range after {
		f := strings.Fields(k)
		if len(f) < 2 {
			continue
		}
		d := v - before[k]
		switch f[1] {
		case "pods", "pods/eviction", "pods/log", "pods/exec":
			pods += d
		case "leases":
			leases += d
		}
	}
	return pods, leases
}

// rowWrites is PostgreSQL's count of rows inserted, updated and deleted in
// the database of url (0 without one). The statistics reach the view within
// about a second of each transaction: call it after a quiet moment.
func rowWrites(ctx context.Context, tb testing.TB, url string) int64 {
	tb.Helper()
	if url == "" {
		return 0
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, `SELECT tup_inserted + tup_updated + tup_deleted FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// mainTracker records, from a pod informer, when each task's main
// container was first seen terminated and when its pods were gone.
type mainTracker struct {
	mu         sync.Mutex
	terminated map[string]time.Time
	deleted    int
	last       time.Time
}

func trackMains(ctx context.Context, tb testing.TB, env *clustertest.Env) *mainTracker {
	tb.Helper()
	tr := &mainTracker{terminated: map[string]time.Time{}}
	f := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace(env.Namespace))
	inf := f.Core().V1().Pods().Informer()
	seen := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Terminated == nil {
				continue
			}
			id := p.Labels[task.LabelRun]
			tr.mu.Lock()
			if _, ok := tr.terminated[id]; !ok {
				tr.terminated[id] = time.Now()
			}
			tr.mu.Unlock()
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, o any) { seen(o) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			seen(obj) // a pod that ended and went between two events
			tr.mu.Lock()
			tr.deleted++
			tr.last = time.Now()
			tr.mu.Unlock()
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	f.Start(ctx.Done())
	tb.Cleanup(f.Shutdown)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		tb.Fatal("the benchmark's pod informer did not sync")
	}
	return tr
}

func (tr *mainTracker) terminatedAt(id string) (time.Time, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	t, ok := tr.terminated[id]
	return t, ok
}

func (tr *mainTracker) gone() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.deleted
}

func (tr *mainTracker) lastGone() time.Time {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.last
}
