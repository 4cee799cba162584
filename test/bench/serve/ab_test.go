package serve

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/test/bench/benchresult"
)

// The A/B mode of BenchmarkServeSubmit: with $KUBETASK_BENCH_BASELINE_BIN
// naming another kubetask binary (an older build), the benchmark runs that
// binary's service and the one under test (kubetaskBin) in turns on the
// same cluster, $KUBETASK_BENCH_PAIRS pairs (default 3), instead of its
// comparison with plain pod creates:
//
//	go build -o /tmp/kubetask-016ccbf ./cmd/kubetask   # in a worktree of 016ccbf
//	KUBETASK_BENCH_BASELINE_BIN=/tmp/kubetask-016ccbf KUBETASK_BENCH_RESULTS=$PWD/docs/benchmarks-results \
//	  go test ./test/bench/serve -run '^$' -bench BenchmarkServeSubmit -benchtime 1x -timeout 90m
//
// Both services get the same flags (serveSubmissions': --parallelism,
// --qps, --burst, --max-requests-per-caller, and startService's), which
// every build since the per-caller limit knows; the flags the newer build
// added (the namespace shares and caps of issue 33) keep their defaults.
// The results go into a file of suite serve-ab, apart from serve's.
// KUBETASK_BENCH_AB_LOOPS=closed (or open) runs only that loop in each
// pair, KUBETASK_BENCH_SUBMIT_SPECS only those specs.

// abPairs is the number of A/B pairs: $KUBETASK_BENCH_PAIRS, default 3.
func abPairs() int { return envInt("KUBETASK_BENCH_PAIRS", 3) }

// abLoops reports which loops a pair runs: $KUBETASK_BENCH_AB_LOOPS,
// "closed", "open" or both (the default).
func abLoops() (closed, open bool) {
	switch os.Getenv("KUBETASK_BENCH_AB_LOOPS") {
	case "closed":
		return true, false
	case "open":
		return false, true
	}
	return true, true
}

// abBinary is one side of an A/B comparison.
type abBinary struct {
	label, bin string
}

// abBinaries returns the baseline and the binary under test, or false when
// $KUBETASK_BENCH_BASELINE_BIN is not set. The baseline's label is
// $KUBETASK_BENCH_BASELINE_LABEL, else its file name without "kubetask-"
// (kubetask-016ccbf: 016ccbf); the one under test is "head".
func abBinaries(tb testing.TB) (base, head abBinary, ok bool) {
	tb.Helper()
	path := os.Getenv("KUBETASK_BENCH_BASELINE_BIN")
	if path == "" {
		return abBinary{}, abBinary{}, false
	}
	bin, err := executable(path)
	if err != nil {
		tb.Fatal(err)
	}
	label := os.Getenv("KUBETASK_BENCH_BASELINE_LABEL")
	if label == "" {
		label = strings.TrimPrefix(filepath.Base(bin), "kubetask-")
	}
	return abBinary{label: label, bin: bin}, abBinary{label: "head", bin: kubetaskBin(tb)}, true
}

// abFigures are the figures of one binary's turn in a pair: the closed
// loop's and the open loop's.
type abFigures struct{ closed, open submitResult }

// values are the figures as result values, units named as
// BenchmarkServeSubmit's.
func (f abFigures) values() []benchresult.Value {
	c, o := f.closed, f.open
	var vs []benchresult.Value
	if len(c.latencies) > 0 {
		vs = append(vs, f.closedValues()...)
	}
	if len(o.latencies) > 0 {
		vs = append(vs, f.openValues()...)
	}
	return vs
}

func (f abFigures) closedValues() []benchresult.Value {
	c := f.closed
	return []benchresult.Value{
		{V: c.submitsPerSecond(), Unit: "submits/s"},
		{V: ms(percentile(c.latencies, 0.5)), Unit: "submit-p50-ms"},
		{V: ms(percentile(c.latencies, 0.99)), Unit: "submit-p99-ms"},
		{V: c.tasksPerSecond(), Unit: "tasks/s"},
		{V: c.serviceCPU.Seconds(), Unit: "serve-cpu-s"},
		{V: c.apiserverCPU.Seconds(), Unit: "apiserver-cpu-s"},
		{V: c.etcdCPU.Seconds(), Unit: "etcd-cpu-s"},
		{V: float64(c.peakRSS) / (1 << 20), Unit: "serve-peak-rss-MiB"},
		{V: c.executorCalls / float64(c.size.tasks), Unit: "serve-calls/task"},
		{V: c.apiRequests / float64(c.size.tasks), Unit: "apiserver-requests/task"},
	}
}

func (f abFigures) openValues() []benchresult.Value {
	o := f.open
	return []benchresult.Value{
		{V: o.rate, Unit: "open-offered/s"},
		{V: o.submitsPerSecond(), Unit: "open-submits/s"},
		{V: ms(percentile(o.latencies, 0.5)), Unit: "open-submit-p50-ms"},
		{V: ms(percentile(o.latencies, 0.99)), Unit: "open-submit-p99-ms"},
		{V: o.serviceCPU.Seconds(), Unit: "open-serve-cpu-s"},
		{V: float64(o.peakRSS) / (1 << 20), Unit: "open-serve-peak-rss-MiB"},
	}
}

// ratios divides head's figures by base's, unit by unit (the offered rate,
// the same for both, left out).
func ratios(head, base []benchresult.Value) []benchresult.Value {
	var out []benchresult.Value
	for i := range head {
		if head[i].Unit == "open-offered/s" {
			continue
		}
		out = append(out, benchresult.Value{V: head[i].V / base[i].V, Unit: head[i].Unit})
	}
	return out
}

// benchServeSubmitAB runs sz's submissions through base's and head's
// services in turns: first plain pod creates (closed loop) once, to fix the
// open loop's offered rate (openShare of their rate) for every turn; then
// pairs pairs, each the closed loop of both binaries, then the open loop of
// both, the binary that goes first alternating from pair to pair (ABBA), so
// that a machine that drifts during a run weighs on both alike. It prints
// and records every figure of both and head/base per pair.
func benchServeSubmitAB(b *testing.B, res *benchresult.Run, sz submitSize, base, head abBinary, pairs int) {
	for range b.N {
		pods := runPodCreates(b, clustertest.New(b), sz.tasks, sz.distinct, closedLoop(sz.clients))
		rate := openShare * pods.perSecond()
		fmt.Printf("%s: plain pod creates %.1f/s (load average %s): the open loop offers %.1f submissions/s to both\n", b.Name(), pods.perSecond(), pods.load, rate)
		figs := runABPairs(b, sz, pods, rate, base, head, pairs)
		name := strings.TrimPrefix(b.Name(), "Benchmark")
		for k, f := range figs {
			hv, bv := f[1].values(), f[0].values()
			res.Add(b, name+"/baseline."+base.label, bv...)
			res.Add(b, name+"/head", hv...)
			res.Add(b, name+"/head-over-baseline", ratios(hv, bv)...)
			fmt.Println(abPairTable(k+1, base.label, bv, hv))
		}
		fmt.Println(abMedianTable(base.label, figs))
	}
}

// runABPairs runs the pairs and returns, per pair, base's figures and
// head's.
func runABPairs(tb testing.TB, sz submitSize, pods podCreateResult, rate float64, base, head abBinary, pairs int) [][2]abFigures {
	tb.Helper()
	closed, open := abLoops()
	out := make([][2]abFigures, pairs)
	for k := range pairs {
		order := []int{0, 1}
		if k%2 == 1 {
			order = []int{1, 0}
		}
		bins := [2]abBinary{base, head}
		for _, i := range order {
			if !closed {
				break
			}
			tb.Logf("pair %d: closed loop of %s (load average %s)", k+1, bins[i].label, loadAvg())
			out[k][i].closed = serveSubmissions(tb, bins[i].bin, sz, pods, closedLoop(sz.clients))
			tb.Logf("pair %d: closed loop of %s: API server requests %s", k+1, bins[i].label, out[k][i].closed.requests)
		}
		for _, i := range order {
			if !open {
				break
			}
			tb.Logf("pair %d: open loop of %s at %.1f/s (load average %s)", k+1, bins[i].label, rate, loadAvg())
			out[k][i].open = serveSubmissions(tb, bins[i].bin, sz, pods, openLoop(rate))
			out[k][i].open.rate = rate
		}
	}
	return out
}

// abPairTable renders one pair: each figure of both binaries and head's
// over the baseline's.
func abPairTable(pair int, baseLabel string, base, head []benchresult.Value) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pair %d: %-24s %12s %12s %10s\n", pair, "", baseLabel, "head", "head/base")
	for i := range head {
		fmt.Fprintf(&b, "  %-30s %12.2f %12.2f %9.3fx\n", head[i].Unit, base[i].V, head[i].V, head[i].V/base[i].V)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// abMedianTable renders each figure's median over the pairs for both
// binaries, the ratio of the medians, and the median of the per-pair
// ratios with their range.
func abMedianTable(baseLabel string, figs [][2]abFigures) string {
	var b strings.Builder
	fmt.Fprintf(&b, "medians over %d pairs: %-16s %12s %12s %12s  %s\n", len(figs), "", baseLabel, "head", "ratio of med", "per-pair head/base: median (min-max)")
	units := figs[0][1].values()
	for u := range units {
		var bv, hv, rv []float64
		for _, f := range figs {
			x, y := f[0].values()[u].V, f[1].values()[u].V
			bv, hv, rv = append(bv, x), append(hv, y), append(rv, y/x)
		}
		lo, hi := rv[0], rv[0]
		for _, r := range rv {
			lo, hi = min(lo, r), max(hi, r)
		}
		fmt.Fprintf(&b, "  %-36s %12.2f %12.2f %11.3fx  %.3fx (%.3f-%.3f)\n", units[u].Unit,
			benchresult.Median(bv), benchresult.Median(hv), benchresult.Median(hv)/benchresult.Median(bv), benchresult.Median(rv), lo, hi)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// TestServeSubmitABTiny runs the A/B code for one pair at a tiny size, the
// binary under test against itself (or against
// $KUBETASK_BENCH_BASELINE_BIN). Its numbers mean nothing.
func TestServeSubmitABTiny(t *testing.T) {
	base, head, ok := abBinaries(t)
	if !ok {
		head = abBinary{label: "head", bin: kubetaskBin(t)}
		base = abBinary{label: "self", bin: head.bin}
	}
	sz := submitSize{tasks: 8, clients: 4, distinct: true, parallelism: 8, qps: 200, burst: 400, timeout: 2 * time.Minute}
	pods := runPodCreates(t, clustertest.New(t), sz.tasks, sz.distinct, closedLoop(sz.clients))
	figs := runABPairs(t, sz, pods, openShare*pods.perSecond(), base, head, 1)
	t.Log("\n" + abPairTable(1, base.label, figs[0][0].values(), figs[0][1].values()))
	t.Log("\n" + abMedianTable(base.label, figs))
	closed, open := abLoops()
	for i, f := range figs[0] {
		if (closed && len(f.closed.latencies) != sz.tasks) || (open && (len(f.open.latencies) != sz.tasks || f.open.rate <= 0)) {
			t.Errorf("side %d: %d closed and %d open submissions at %.1f/s, want %d of each at a positive rate",
				i, len(f.closed.latencies), len(f.open.latencies), f.open.rate, sz.tasks)
		}
	}
}
