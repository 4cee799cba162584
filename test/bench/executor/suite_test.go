package executor

import (
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/test/bench/benchresult"
)

// suiteSize is how many tasks each part of the suite runs.
type suiteSize struct {
	// base: the floor clients (S0, minimal and equal-work) and the
	// executor without a rate limit.
	base int
	// pairs: how many times the equal-work S0 and the executor run one
	// after the other at base, alternating (ABAB).
	pairs int
	// cmp: the executor and the Job controller at QPS 200 and unlimited.
	cmp int
	// slow: both at QPS 50, and the executor at its defaults.
	slow int
	// jobDefaults: the Job controller at kube-controller-manager's
	// defaults (QPS 20, burst 30), about 2 tasks/s.
	jobDefaults int
	// scale: the executor without a rate limit, compared with base.
	scale int
	// memory: running realistic pods tracked at once.
	memory int
	// storeFor: how long each SQLite write measurement runs.
	storeFor time.Duration
}

// fullSize is `make bench`: about 19 minutes on a 2-core machine.
var fullSize = suiteSize{base: 2000, pairs: 3, cmp: 1000, slow: 500, jobDefaults: 200, scale: 10000, memory: 10000, storeFor: 5 * time.Second}

// tinySize is CI's run of the same code (TestBenchTiny).
var tinySize = suiteSize{base: 20, pairs: 1, cmp: 20, slow: 10, jobDefaults: 6, scale: 40, memory: 30, storeFor: 200 * time.Millisecond}

// sizeFromEnv is fullSize with KUBETASK_BENCH_<PART> overrides (BASE, PAIRS,
// CMP, SLOW, JOB_DEFAULTS, SCALE, MEMORY), or tinySize for
// KUBETASK_BENCH_SIZE=tiny.
func sizeFromEnv() suiteSize {
	sz := fullSize
	if os.Getenv("KUBETASK_BENCH_SIZE") == "tiny" {
		sz = tinySize
	}
	for _, f := range []struct {
		name string
		v    *int
	}{{"BASE", &sz.base}, {"PAIRS", &sz.pairs}, {"CMP", &sz.cmp}, {"SLOW", &sz.slow}, {"JOB_DEFAULTS", &sz.jobDefaults}, {"SCALE", &sz.scale}, {"MEMORY", &sz.memory}} {
		if n, err := strconv.Atoi(os.Getenv("KUBETASK_BENCH_" + f.name)); err == nil && n > 0 {
			*f.v = n
		}
	}
	return sz
}

// BenchmarkExecutor is the whole comparison, run by `make bench`, on one
// local cluster with kwok nodes, and prints one table:
//   - S0, the ceiling: a minimal client sending create, delete and release
//     per task with no rate limit and no bookkeeping (floorRun), and the
//     equal-work S0, which sends the executor's floor of requests (gated
//     create, ungate, delete, release);
//   - the equal-work S0 and the executor without a rate limit, one after
//     the other, alternating, sz.pairs times (ABAB: the machine drifts
//     10-25 % from run to run, docs/benchmarks.md), each pair's ratio;
//   - the executor at QPS 200 and 50, and at its defaults; the Job
//     controller (kube-controller-manager restarted with the same client
//     limits) with its default 5 concurrent Job syncs and with the
//     executor's 16 workers, and at its defaults;
//   - the executor at scale (10,000 tasks), against the equal-work S0 at
//     the same scale;
//   - memory per tracked pod with 10,000 realistic running pods: the
//     executor, a plain informer, kube-controller-manager;
//   - the SQLite store's durable outcome writes, from 1 and 64 writers.
//
// Every figure goes into the run's results file (test/bench/benchresult), from
// which make bench-docs writes docs/benchmarks.md's tables. Run it with:
//
//	make bench
//	make bench KUBETASK_BENCH_SIZE=tiny KUBETASK_BENCH_PAIRS=3   # a smoke run, minutes
//	go test ./test/bench/executor -run '^$' -bench BenchmarkExecutor -benchtime 1x -timeout 90m
func BenchmarkExecutor(b *testing.B) {
	sz := sizeFromEnv()
	size := "full"
	if sz != fullSize {
		size = fmt.Sprintf("smaller than make bench's, a smoke run whose figures mean little: base %d, pairs %d, cmp %d, slow %d, job-defaults %d, scale %d, memory %d",
			sz.base, sz.pairs, sz.cmp, sz.slow, sz.jobDefaults, sz.scale, sz.memory)
	}
	res := benchresult.Start(b, "bench", "size", size)
	for i := 0; i < b.N; i++ {
		rows := runSuite(b, sz)
		fmt.Print("\n" + table(rows))
		record(b, res, rows)
		s0 := rowNamed(rows, "S0 minimal", "unlimited")
		var ratios []float64
		for _, r := range rows {
			if r.key == "Executor/kubetask/unlimited" && r.equalS0 > 0 {
				ratios = append(ratios, r.tasksPerSecond()/r.equalS0)
			}
			if r.key == "Executor/kubetask/unlimited" && s0.tasksPerSecond() > 0 {
				b.ReportMetric(r.tasksPerSecond()/s0.tasksPerSecond(), "executor/S0")
			}
		}
		if len(ratios) > 0 {
			fmt.Printf("executor / equal-work S0, pair by pair: %.2f (median %.2f)\n", ratios, benchresult.Median(ratios))
			b.ReportMetric(benchresult.Median(ratios), "executor/S0-equal")
		}
	}
}

// BenchmarkPairs is the suite's pairs alone: the equal-work S0 and the
// executor without a rate limit, alternating, KUBETASK_BENCH_PAIRS times
// with KUBETASK_BENCH_BASE tasks each (or the scale runs, with
// KUBETASK_BENCH_SCALE). It prints its table and writes no
// results file: it is for looking into the executor's cost per task, with
// KUBETASK_BENCH_PROFILES (profilesDir) above all:
//
//	KUBETASK_BENCH_PROFILES=/tmp/prof KUBETASK_BENCH_PAIRS=1 go test ./test/bench/executor -run '^$' -bench BenchmarkPairs -benchtime 1x -timeout 30m
func BenchmarkPairs(b *testing.B) {
	sz := sizeFromEnv()
	for i := 0; i < b.N; i++ {
		// With KUBETASK_BENCH_SCALE set, the pairs are the suite's scale
		// runs: that many tasks, at most KUBETASK_BENCH_BASE at once.
		n, inFlight := sz.base, 0
		if os.Getenv("KUBETASK_BENCH_SCALE") != "" {
			n, inFlight = sz.scale, sz.base
		}
		var rows []row
		for range max(sz.pairs, 1) {
			eq := floorRun(b, n, inFlight, true)
			ex := executorRun(b, "kubetask", "unlimited", executor.Config{Parallelism: sz.base, Workers: suiteWorkers, CreateConcurrency: 8, QPS: executor.Unlimited}, n)
			ex.equalS0 = eq.tasksPerSecond()
			rows = append(rows, eq, ex)
		}
		fmt.Print("\n" + table(rows))
	}
}

// TestBenchTiny runs the suite with a few tasks, so the benchmark's code is
// exercised in CI; its numbers mean nothing.
func TestBenchTiny(t *testing.T) {
	rows := runSuite(t, tinySize)
	t.Log("\n" + table(rows))
	for _, r := range rows {
		switch {
		case r.store:
			if r.tasksPerSecond() <= 0 {
				t.Errorf("%s: %v writes/s", r.name, r.tasksPerSecond())
			}
		case r.heap != 0:
			// A few pods are within the heap's noise (the executor's own
			// rows may even come out negative); a plain informer's whole
			// pods are not.
			if strings.Contains(r.name, "plain") && !(r.heap > 0) {
				t.Errorf("%s: heap per pod %v", r.name, r.heap)
			}
		case r.tasksPerSecond() <= 0 || r.lags == 0 || r.allReq <= 0 || math.IsNaN(r.clientReq) || r.clientReq <= 0:
			t.Errorf("%s at %s: tasks/s %v, %d lags, %v client and %v apiserver requests per task", r.name, r.qps, r.tasksPerSecond(), r.lags, r.clientReq, r.allReq)
		}
	}
}

// suiteWorkers is the executor's Workers in every run of the suite, and the
// Job controller's concurrent Job syncs at equal concurrency.
const suiteWorkers = 16

func runSuite(tb testing.TB, sz suiteSize) []row {
	tb.Helper()
	defer setControllerManagerLimit(tb, 1000, 1000, 0)
	const workers = suiteWorkers
	cfg := func(n int, qps float32, burst int) executor.Config {
		return executor.Config{Parallelism: n, Workers: workers, CreateConcurrency: 8, QPS: qps, Burst: burst}
	}
	var rows []row
	defer func() {
		if tb.Failed() && len(rows) > 0 { // a later part failed: keep what was measured
			fmt.Fprint(os.Stderr, "\nmeasured before the failure:\n"+table(rows))
		}
	}()
	add := func(r row, limit, key string) row {
		r.limit, r.key = limit, key
		rows = append(rows, r)
		return r
	}
	s0 := add(floorRun(tb, sz.base, 0, false), "unlimited", "Executor/S0-minimal/unlimited")
	var base row
	for range max(sz.pairs, 1) {
		eq := add(floorRun(tb, sz.base, 0, true), "unlimited", "Executor/S0-equal-work/unlimited")
		ex := executorRun(tb, "kubetask", "unlimited", cfg(sz.base, executor.Unlimited, 0), sz.base)
		ex.equalS0 = eq.tasksPerSecond()
		ex = add(ex, "unlimited", "Executor/kubetask/unlimited")
		if base.tasks == 0 {
			base = ex
		}
	}
	add(executorRun(tb, "kubetask", "200/400", cfg(sz.cmp, 200, 400), sz.cmp), "200", "Executor/kubetask/200")
	add(executorRun(tb, "kubetask", "50/100", cfg(sz.slow, 50, 100), sz.slow), "50", "Executor/kubetask/50")
	add(executorRun(tb, "kubetask defaults", "50/100 (default)",
		executor.Config{QPS: executor.DefaultQPS, Burst: executor.DefaultBurst}, sz.slow), "default", "Executor/kubetask-defaults/default")
	// The Job controller with its default 5 concurrent Job syncs, and with
	// as many as the executor has workers; ordered so that
	// kube-controller-manager restarts as few times as it can.
	add(jobRun(tb, "Job controller", "unlimited (100000)", 100000, 100000, 0, sz.cmp), "unlimited", "Executor/Job-controller/unlimited")
	add(jobRun(tb, "Job controller, 16 syncs", "unlimited (100000)", 100000, 100000, workers, sz.cmp), "unlimited", "Executor/Job-controller-16-syncs/unlimited")
	add(jobRun(tb, "Job controller, 16 syncs", "200/400", 200, 400, workers, sz.cmp), "200", "Executor/Job-controller-16-syncs/200")
	add(jobRun(tb, "Job controller", "200/400", 200, 400, 0, sz.cmp), "200", "Executor/Job-controller/200")
	add(jobRun(tb, "Job controller", "50/100", 50, 100, 0, sz.slow), "50", "Executor/Job-controller/50")
	add(jobRun(tb, "Job controller defaults", "20/30 (default)", 20, 30, 0, sz.jobDefaults), "default", "Executor/Job-controller-defaults/default")
	setControllerManagerLimit(tb, 1000, 1000, 0)
	// At scale both the executor and S0 keep as many pods at once as in
	// the base run (the executor's Parallelism), as a scheduler bounds its
	// tasks in flight: with all 10,000 pods created at once, kwok and
	// kube-apiserver spend more per pod on the backlog (measured: 0.79x),
	// which is the cluster's cost, not the executor's. The equal-work S0 at
	// the same scale right before is what this cluster and machine give a
	// client that sends the executor's requests and has no cost per task of
	// its own: the executor's cost per task is flat when its share of S0 is
	// the same at both sizes.
	s0Scale := floorRun(tb, sz.scale, sz.base, true)
	scale := executorRun(tb, "kubetask at scale", "unlimited", cfg(sz.base, executor.Unlimited, 0), sz.scale)
	scale.equalS0 = s0Scale.tasksPerSecond()
	s0Scale.note += fmt.Sprintf("; %.2fx the tasks/s of the minimal S0 with %d", s0Scale.tasksPerSecond()/s0.tasksPerSecond(), s0.tasks)
	scale.note = fmt.Sprintf("Parallelism %d; %.2fx the tasks/s of the first %d-task run; %.2fx the equal-work S0 at scale, against %.2fx in the first pair",
		sz.base, scale.tasksPerSecond()/base.tasksPerSecond(), base.tasks,
		scale.tasksPerSecond()/s0Scale.tasksPerSecond(), base.tasksPerSecond()/base.equalS0)
	add(s0Scale, "", "Executor/S0-equal-work-at-scale")
	add(scale, "", "Executor/kubetask-at-scale")
	for _, r := range memoryRun(tb, sz.memory) {
		add(r, "", "Memory/"+metricName(strings.TrimPrefix(r.name, "memory: ")))
	}
	one := add(storeRun(tb, 1, sz.storeFor), "", "Store/SQLite-1-writers")
	many := add(storeRun(tb, 64, sz.storeFor), "", "Store/SQLite-64-writers")
	rows[len(rows)-1].note += fmt.Sprintf("; %.1fx one writer", many.tasksPerSecond()/one.tasksPerSecond())
	return rows
}

// record writes every row to the results file under its key: throughput
// and its ratios (to the minimal S0, to the equal-work S0 beside it, to
// the Job controller at the same client limit with its default and with
// equal concurrency), requests, lags, CPU; heap per pod; durable writes.
func record(tb testing.TB, res *benchresult.Run, rows []row) {
	tb.Helper()
	s0 := rowNamed(rows, "S0 minimal", "unlimited").tasksPerSecond()
	job, jobEqual := map[string]float64{}, map[string]float64{}
	for _, r := range rows {
		switch {
		case strings.HasPrefix(r.key, "Executor/Job-controller-16-syncs/"):
			jobEqual[r.limit] = r.tasksPerSecond()
		case strings.HasPrefix(r.key, "Executor/Job-controller"):
			job[r.limit] = r.tasksPerSecond()
		}
	}
	ratio := func(a, b float64) float64 {
		if a <= 0 || b <= 0 {
			return math.NaN()
		}
		return a / b
	}
	ms := func(d time.Duration) float64 {
		if d == 0 {
			return math.NaN()
		}
		return float64(d.Microseconds()) / 1000
	}
	type v = benchresult.Value
	for _, r := range rows {
		switch {
		case r.key == "":
		case r.heap != 0:
			res.Add(tb, r.key, v{V: r.heap, Unit: "B/pod"})
		case r.store:
			res.Add(tb, r.key, v{V: r.tasksPerSecond(), Unit: "writes/s"})
		default:
			tps := r.tasksPerSecond()
			vals := []v{{V: tps, Unit: "tasks/s"}, {V: float64(r.tasks), Unit: "tasks"}}
			if !strings.HasPrefix(r.key, "Executor/S0-minimal") {
				vals = append(vals, v{V: ratio(tps, s0), Unit: "x-S0"})
			}
			if r.equalS0 > 0 {
				vals = append(vals, v{V: ratio(tps, r.equalS0), Unit: "x-S0-equal"})
			}
			if strings.HasPrefix(r.key, "Executor/kubetask") && r.limit != "" {
				vals = append(vals, v{V: ratio(tps, job[r.limit]), Unit: "x-Job"}, v{V: ratio(tps, jobEqual[r.limit]), Unit: "x-Job-equal-syncs"})
			}
			vals = append(vals, v{V: r.clientReq, Unit: "calls/task"}, v{V: r.allReq, Unit: "requests/task"},
				v{V: ms(r.p50), Unit: "lag-p50-ms"}, v{V: ms(r.p99), Unit: "lag-p99-ms"},
				v{V: ms(r.durP50), Unit: "durable-lag-p50-ms"}, v{V: ms(r.durP99), Unit: "durable-lag-p99-ms"},
				v{V: r.clientCPU, Unit: "client-cpu-s/1k-tasks"}, v{V: r.kcmCPU, Unit: "kcm-cpu-s/1k-tasks"},
				v{V: r.apiCPU, Unit: "apiserver-cpu-s/1k-tasks"}, v{V: r.cores, Unit: "cores-busy"})
			if r.waitP99 > 0 {
				vals = append(vals, v{V: ms(r.waitP99), Unit: "queue-wait-p99-ms"}, v{V: ms(r.passP99), Unit: "pass-p99-ms"},
					v{V: ms(r.watchP99), Unit: "lag-watch-p99-ms"}, v{V: ms(r.ownP99), Unit: "lag-own-p99-ms"})
			}
			// Everyone's requests at the API server by verb and resource,
			// per task, in a fixed order: what the fence costs, and
			// whose requests they are (kwok's, the scheduler's).
			verbs := slices.Sorted(maps.Keys(r.verbs))
			for _, k := range verbs {
				if r.verbs[k] >= 0.01 {
					vals = append(vals, v{V: r.verbs[k], Unit: "apiserver-" + strings.ReplaceAll(k, " ", "-") + "/task"})
				}
			}
			res.Add(tb, r.key, vals...)
			if strings.HasPrefix(r.key, "Executor/S0-equal-work/") {
				res.Add(tb, "Pairs/S0-equal-work", v{V: tps, Unit: "tasks/s"}, v{V: r.clientReq, Unit: "calls/task"})
			}
			if r.key == "Executor/kubetask/unlimited" {
				res.Add(tb, "Pairs/kubetask", v{V: tps, Unit: "tasks/s"}, v{V: ratio(tps, r.equalS0), Unit: "x-S0-equal"},
					v{V: r.clientReq, Unit: "calls/task"}, v{V: ms(r.durP99), Unit: "durable-lag-p99-ms"})
			}
		}
	}
}

// rowNamed is the first row called name at client limit limit; the zero
// row if there is none.
func rowNamed(rows []row, name, limit string) row {
	for _, r := range rows {
		if r.name == name && r.limit == limit {
			return r
		}
	}
	return row{}
}

// table formats rows as one Markdown table: throughput against S0 (the
// first row) and against the Job controller at the same client limit, then
// memory per pod.
func table(rows []row) string {
	var s0 float64
	job := map[string]float64{}
	for _, r := range rows {
		if strings.HasPrefix(r.name, "S0") && s0 == 0 {
			s0 = r.tasksPerSecond() // the first S0 row: the minimal one
		}
		if strings.HasPrefix(r.name, "Job controller") && !strings.Contains(r.name, "16 syncs") {
			job[r.limit] = r.tasksPerSecond()
		}
	}
	ratio := func(a, b float64) string {
		if a <= 0 || b <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	num := func(v float64, format string) string {
		if math.IsNaN(v) || v == 0 {
			return "-"
		}
		return fmt.Sprintf(format, v)
	}
	var b strings.Builder
	b.WriteString("| run | client QPS/burst | tasks | tasks/s | vs S0 | vs Job controller | client calls/task | apiserver requests/task | outcome lag p50 / p99 | CPU-s per 1,000 tasks: client / controller-manager / apiserver | cores busy | heap per pod | vs equal-work S0 beside it | lag to the durable write p99 | note |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		if r.heap != 0 {
			fmt.Fprintf(&b, "| %s | | %d | | | | | | | | | %s | | | %s |\n", r.name, r.tasks, bytesString(r.heap), r.note)
			continue
		}
		if r.store {
			fmt.Fprintf(&b, "| %s | | %d | %.0f | | | | | | | | | | | %s |\n", r.name, r.tasks, r.tasksPerSecond(), r.note)
			continue
		}
		vsJob := "-"
		if !strings.HasPrefix(r.name, "Job") && !strings.HasPrefix(r.name, "S0") && r.limit != "" {
			vsJob = ratio(r.tasksPerSecond(), job[r.limit])
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %.1f | %s | %s | %s | %s | %s / %s | %s / %s / %s | %s | | %s | %s | %s |\n",
			r.name, r.qps, r.tasks, r.tasksPerSecond(), ratio(r.tasksPerSecond(), s0), vsJob,
			num(r.clientReq, "%.2f"), num(r.allReq, "%.2f"), durString(r.p50), durString(r.p99),
			num(r.clientCPU, "%.1f"), num(r.kcmCPU, "%.1f"), num(r.apiCPU, "%.1f"), num(r.cores, "%.2f"),
			ratio(r.tasksPerSecond(), r.equalS0), durString(r.durP99), r.note)
	}
	return b.String()
}

func durString(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + durString(-d)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	default:
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
}

func bytesString(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	if math.Abs(v) >= 10*1024 {
		return fmt.Sprintf("%.1f KiB", v/1024)
	}
	return fmt.Sprintf("%.0f B", v)
}

func metricName(s string) string {
	return strings.NewReplacer("memory: ", "", " ", "-", "+", "plus").Replace(s)
}
