// Package benchresult writes a benchmark run's results file: one file per
// run of a suite (make bench, make bench-run, ...), in the Go benchmark
// format (golang.org/design/14313-benchmark-format) that benchstat and
// golang.org/x/perf/benchfmt read, with the run's commit, date, machine and
// load as configuration lines at its head:
//
//	suite: bench
//	commit: 423a3d9...-dirty
//	date: 2026-12-06T07:30:00Z
//	cpu: Intel(R) Xeon(R) ...
//	cores: 2
//	memory: 24 GiB
//	load-start: 4.12 3.80 3.02
//	load-end: 5.01 4.20 3.31
//	env: KUBETASK_BENCH_SIZE=tiny       (only when the size is not the default)
//	BenchmarkExecutor/kubetask/unlimited 1 39.2 tasks/s 5.67 calls/task
//
// A figure measured several times is several lines of the same name (one
// per repetition); tools/benchreport takes their min, median and max and
// writes docs/benchmarks.md's tables and README.md's figures from the
// latest file of each suite.
//
// A file is written only when $KUBETASK_BENCH_RESULTS names a directory
// (the Makefile's bench targets set it to docs/benchmarks-results); it is
// rewritten whole after every line, so that a run that fails half-way
// leaves what it measured, with the load at its last figure.
package benchresult

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Value is one figure of a result line: a number and its unit (no spaces).
type Value struct {
	V    float64
	Unit string
}

// Run is one run's results file. Its methods are safe for concurrent use;
// a nil *Run's Add does nothing.
type Run struct {
	mu     sync.Mutex
	path   string // "" when no file is written
	config [][2]string
	lines  []string
	// pending holds the values Report collected per benchmark name until
	// that benchmark's iteration ends.
	pending map[string][]Value
}

var (
	runsMu sync.Mutex
	runs   = map[string]*Run{}
)

// Start returns suite's run for this process: the first call creates it
// (and its file, when $KUBETASK_BENCH_RESULTS is set), later calls, such as
// the repetitions of -count, return the same run, so that they go into one
// file. config adds key/value configuration lines (keys lower-case, no
// spaces), for example the size of the run.
func Start(tb testing.TB, suite string, config ...string) *Run {
	tb.Helper()
	runsMu.Lock()
	defer runsMu.Unlock()
	if r := runs[suite]; r != nil {
		return r
	}
	now := time.Now().UTC()
	r := &Run{pending: map[string][]Value{}}
	r.config = append(r.config, [2]string{"suite", suite})
	r.config = append(r.config, Machine(now)...)
	for i := 0; i+1 < len(config); i += 2 {
		r.config = append(r.config, [2]string{config[i], config[i+1]})
	}
	if env := sizeEnv(); env != "" {
		r.config = append(r.config, [2]string{"env", env})
	}
	if dir := os.Getenv("KUBETASK_BENCH_RESULTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // the directory the person running the benchmark named
			tb.Fatalf("results directory: %v", err)
		}
		commit := r.get("commit")
		short := commit
		if len(short) > 7 {
			short = short[:7]
		}
		if strings.HasSuffix(commit, "-dirty") {
			short += "-dirty"
		}
		r.path = filepath.Join(dir, fmt.Sprintf("%s-%s-%s.txt", suite, now.Format("20060102T150405Z"), short))
		fmt.Fprintf(os.Stderr, "benchmark results: %s\n", r.path)
		if err := r.write(); err != nil {
			tb.Fatalf("results file: %v", err)
		}
	}
	runs[suite] = r
	return r
}

// Path is the results file's path, "" when none is written.
func (r *Run) Path() string {
	if r == nil {
		return ""
	}
	return r.path
}

func (r *Run) get(key string) string {
	for _, kv := range r.config {
		if kv[0] == key {
			return kv[1]
		}
	}
	return ""
}

// Add writes one result line: benchmark name (without the "Benchmark"
// prefix, sub-benchmarks separated by "/", no spaces) and its values.
// Values that are NaN or infinite are left out; a line with none is not
// written.
func (r *Run) Add(tb testing.TB, name string, values ...Value) {
	tb.Helper()
	if r == nil {
		return
	}
	line, ok := Line(name, values...)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, line)
	if err := r.write(); err != nil {
		tb.Errorf("results file: %v", err)
	}
}

// Report is b.ReportMetric that also records the value in the results
// file, on the line of b's name written when b's iteration ends.
func (r *Run) Report(b *testing.B, v float64, unit string) {
	b.Helper()
	b.ReportMetric(v, unit)
	if r == nil {
		return
	}
	name := strings.TrimPrefix(b.Name(), "Benchmark")
	r.mu.Lock()
	_, started := r.pending[name]
	r.pending[name] = append(r.pending[name], Value{v, unit})
	r.mu.Unlock()
	if !started {
		b.Cleanup(func() {
			r.mu.Lock()
			vs := r.pending[name]
			delete(r.pending, name)
			r.mu.Unlock()
			r.Add(b, name, vs...)
		})
	}
}

// Line formats one result line; false when no value is finite.
func Line(name string, values ...Value) (string, bool) {
	var b strings.Builder
	b.WriteString("Benchmark")
	b.WriteString(strings.Join(strings.Fields(name), "_"))
	b.WriteString(" 1")
	n := 0
	for _, v := range values {
		if math.IsNaN(v.V) || math.IsInf(v.V, 0) || v.Unit == "" || strings.ContainsAny(v.Unit, " \t\n") {
			continue
		}
		b.WriteString(" ")
		b.WriteString(strconv.FormatFloat(v.V, 'g', 6, 64))
		b.WriteString(" ")
		b.WriteString(v.Unit)
		n++
	}
	return b.String(), n > 0
}

// write rewrites the whole file with the load now as load-end. r.mu held
// (or r not shared yet).
func (r *Run) write() error {
	if r.path == "" {
		return nil
	}
	var b bytes.Buffer
	b.WriteString("# kubetask benchmark results: Go benchmark format (benchstat, golang.org/x/perf/benchfmt); make bench-docs writes the docs from them\n")
	for _, kv := range r.config {
		fmt.Fprintf(&b, "%s: %s\n", kv[0], kv[1])
	}
	fmt.Fprintf(&b, "load-end: %s\n", LoadAvg())
	for _, l := range r.lines {
		b.WriteString(l)
		b.WriteString("\n")
	}
	tmp := r.path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil { //nolint:gosec // a results file in the work tree, read by anyone
		return err
	}
	return os.Rename(tmp, r.path)
}

// Machine is the configuration lines that say which code ran where and
// how busy the machine was: commit (with -dirty when the work tree has
// changes to tracked files; $KUBETASK_BENCH_COMMIT when set, as the
// Makefile does), date, Go, CPU model, cores, memory, load average.
func Machine(now time.Time) [][2]string {
	commit := os.Getenv("KUBETASK_BENCH_COMMIT")
	if commit == "" {
		commit = gitCommit()
	}
	return [][2]string{
		{"commit", commit},
		{"date", now.Format(time.RFC3339)},
		{"go", runtime.Version()},
		{"goos", runtime.GOOS},
		{"goarch", runtime.GOARCH},
		{"cpu", cpuModel()},
		{"cores", strconv.Itoa(runtime.NumCPU())},
		{"memory", memTotal()},
		{"load-start", LoadAvg()},
	}
}

// sizeEnv is the environment variables that change a suite's size from
// its default (KUBETASK_BENCH_*, KUBETASK_FAIR_*), as NAME=value, sorted:
// a run with any is not the suite's full run, and the docs say so.
func sizeEnv() string {
	var vs []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "KUBETASK_BENCH_RESULTS", name == "KUBETASK_BENCH_COMMIT":
		case strings.HasPrefix(name, "KUBETASK_BENCH_"), strings.HasPrefix(name, "KUBETASK_FAIR_"):
			vs = append(vs, kv)
		}
	}
	slices.Sort(vs)
	return strings.Join(vs, " ")
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		commit += "-dirty"
	}
	return commit
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "unknown"
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				break
			}
			return fmt.Sprintf("%.1f GiB", kb/(1<<20))
		}
	}
	return "unknown"
}

// LoadAvg is /proc/loadavg's 1, 5 and 15 minute load averages; "unknown"
// where there is none.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// Median is the median of xs (the mean of the middle two for an even
// count); NaN for none. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
