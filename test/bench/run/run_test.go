package run

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kubetask/kubetask/internal/components"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/test/bench/benchresult"
)

var (
	pairs    = flag.Int("pairs", 12, "BenchmarkRun: rounds, each running every tool once, in turns")
	baseline = flag.String("baseline", "", "BenchmarkRun: another kubetask binary (an older build, say) that runs the same pod in each round; default $KUBETASK_BENCH_BASELINE_BIN")
)

// baselineBin is -baseline, else $KUBETASK_BENCH_BASELINE_BIN ("" for none).
func baselineBin() string {
	if *baseline != "" {
		return *baseline
	}
	return os.Getenv("KUBETASK_BENCH_BASELINE_BIN")
}

// baselineName is the baseline tool's name: "baseline." and
// $KUBETASK_BENCH_BASELINE_LABEL, else the binary's file name without
// "kubetask-" (kubetask-016ccbf: baseline.016ccbf).
func baselineName(bin string) string {
	label := os.Getenv("KUBETASK_BENCH_BASELINE_LABEL")
	if label == "" {
		label = strings.TrimPrefix(filepath.Base(bin), "kubetask-")
	}
	return "baseline." + label
}

// podYAML is the pod both tools run: one line of output on the local
// process node (the only untainted node of the test cluster).
const podYAML = `apiVersion: v1
kind: Pod
metadata: {name: hello}
spec:
  restartPolicy: Never
  containers:
  - {name: main, image: busybox, command: [echo, hello]}
`

// tool is one command under test.
type tool struct {
	name string
	bin  string
	args func(round int) []string
}

// sample is what one process cost, from the kernel's accounting of it
// (wait4): wall time from start to exit, peak resident set, CPU time.
type sample struct {
	wall   time.Duration
	maxRSS int64 // bytes
	cpu    time.Duration
}

// bench is the set-up of one comparison: the tools, in a directory of their
// own, and the rusage helper that runs each of them.
type bench struct {
	tools  []tool
	rusage string
	dir    string
}

// setup builds kubetask (or takes $KUBETASK_BENCH_BIN), finds kubectl (`kubetask cluster build` builds it),
// and copies every binary into one directory the same way, so that their
// pages come into the page cache alike: the peak RSS of a Go binary counts
// the page-cache folios its start touches, and their size depends on how
// the file was written (see docs/benchmarks.md).
func setup(tb testing.TB) *bench {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	env := clustertest.New(tb)
	dir := tb.TempDir()
	built := os.Getenv("KUBETASK_BENCH_BIN")
	if built == "" {
		var err error
		if built, err = clustertest.BuildKubetask(ctx, filepath.Join(dir, "build")); err != nil {
			tb.Fatal(err)
		}
	}
	b, err := components.NewBuilder(io.Discard)
	if err != nil {
		tb.Fatal(err)
	}
	kubectl, err := b.Ensure(ctx, components.Kubectl)
	if err != nil {
		tb.Fatal(err)
	}
	podFile := filepath.Join(dir, "pod.yaml")
	if err := os.WriteFile(podFile, []byte(podYAML), 0o600); err != nil {
		tb.Fatal(err)
	}
	helper := filepath.Join(dir, "rusage")
	build := exec.CommandContext(ctx, "go", "build", "-o", helper, "./rusage")
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("building the rusage helper: %v\n%s", err, out)
	}
	conn := []string{"--kubeconfig", env.Kubeconfig, "-n", env.Namespace}
	kubetaskArgs := func(int) []string { return append([]string{"run", "-f", podFile}, conn...) }
	bn := &bench{rusage: helper, dir: dir}
	bn.tools = append(bn.tools, tool{name: "kubetask", bin: copyBinary(tb, built, filepath.Join(dir, "kubetask")), args: kubetaskArgs})
	if base := baselineBin(); base != "" {
		bn.tools = append(bn.tools, tool{name: baselineName(base), bin: copyBinary(tb, base, filepath.Join(dir, "kubetask-baseline")), args: kubetaskArgs})
	}
	bn.tools = append(bn.tools, tool{name: "kubectl", bin: copyBinary(tb, kubectl, filepath.Join(dir, "kubectl")), args: func(round int) []string {
		return append([]string{"run", fmt.Sprintf("hello-%d", round), "--rm", "-i", "--restart=Never", "--image=busybox"}, append(conn, "--", "echo", "hello")...)
	}})
	return bn
}

// copyBinary copies src to dst, then evicts dst from the page cache, and
// returns dst. A process's RSS counts in full every page-cache folio of its
// binary that it touches, and the kernel (6.x, large folios) sizes a file's
// folios by how they came into the cache: the same kubetask binary started
// `--help` at 57 MiB when written in 4 KiB writes and at 107 MiB when
// written in 16 MiB writes. Evicted, each binary comes back into the cache
// as running it reads it (readahead), as after a reboot or once memory
// pressure evicted it, alike for every tool (docs/benchmarks.md).
func copyBinary(tb testing.TB, src, dst string) string {
	tb.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		tb.Fatal(err)
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755) //nolint:gosec // an executable
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		tb.Fatal(err)
	}
	if err := f.Sync(); err != nil { // dirty pages are not evicted
		tb.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		tb.Fatal(err)
	}
	return dst
}

// run runs t once through the rusage helper and checks that it printed
// the pod's line and exited 0.
func (bn *bench) run(ctx context.Context, t tool, round int) (sample, error) {
	out := filepath.Join(bn.dir, "rusage.out")
	cmd := exec.CommandContext(ctx, bn.rusage, append([]string{out, t.bin}, t.args(round)...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return sample{}, fmt.Errorf("%s %s: %w\nstdout:\n%s\nstderr:\n%s", t.name, strings.Join(t.args(round), " "), err, &stdout, &stderr)
	}
	if !strings.Contains(stdout.String(), "hello\n") {
		return sample{}, fmt.Errorf("%s: the pod's line is not on stdout:\n%s\nstderr:\n%s", t.name, &stdout, &stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return sample{}, err
	}
	var wall, rssKiB, utime, stime int64
	if _, err := fmt.Sscan(string(b), &wall, &rssKiB, &utime, &stime); err != nil {
		return sample{}, fmt.Errorf("reading %q: %w", b, err)
	}
	return sample{wall: time.Duration(wall), maxRSS: rssKiB * 1024, cpu: time.Duration(utime + stime)}, nil
}

// result holds every tool's samples, in rounds.
type result struct {
	tools   []tool
	samples [][]sample // [tool][round]
}

// measure runs each tool once unmeasured (the binaries into the page
// cache), then rounds rounds in which every tool runs once, the order
// turning by one each round.
func (bn *bench) measure(tb testing.TB, rounds int) *result {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rounds+1)*time.Duration(len(bn.tools))*time.Minute)
	defer cancel()
	for _, t := range bn.tools {
		if _, err := bn.run(ctx, t, -1); err != nil {
			tb.Fatalf("warm-up: %v", err)
		}
	}
	r := &result{tools: bn.tools, samples: make([][]sample, len(bn.tools))}
	for round := range rounds {
		for k := range bn.tools {
			i := (round + k) % len(bn.tools)
			s, err := bn.run(ctx, bn.tools[i], round)
			if err != nil {
				tb.Fatalf("round %d: %v", round, err)
			}
			r.samples[i] = append(r.samples[i], s)
		}
	}
	return r
}

// median returns the median of what f reads from ss.
func median(ss []sample, f func(sample) float64) float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

func wallS(s sample) float64  { return s.wall.Seconds() }
func rssMiB(s sample) float64 { return float64(s.maxRSS) / (1 << 20) }
func cpuS(s sample) float64   { return s.cpu.Seconds() }

// ratios returns tool i's medians over the last tool's (kubectl): wall,
// peak RSS, CPU.
func (r *result) ratios(i int) (wall, rss, cpu float64) {
	ref := r.samples[len(r.samples)-1]
	return median(r.samples[i], wallS) / median(ref, wallS),
		median(r.samples[i], rssMiB) / median(ref, rssMiB),
		median(r.samples[i], cpuS) / median(ref, cpuS)
}

// table prints every round and the medians and ratios.
func (r *result) table() string {
	var b strings.Builder
	rounds := len(r.samples[0])
	fmt.Fprintf(&b, "kubetask run -f pod.yaml vs kubectl run --rm -i --restart=Never --image=busybox: one-line pod on the local process node, %d rounds, order turning\n", rounds)
	width := 8
	for _, t := range r.tools {
		width = max(width, len(t.name))
	}
	fmt.Fprintf(&b, "%-7s", "round")
	for _, t := range r.tools {
		fmt.Fprintf(&b, " | %-*s  wall     peak RSS   CPU   ", width, t.name)
	}
	b.WriteString("\n")
	row := func(label string, f func(i int, g func(sample) float64) float64) {
		fmt.Fprintf(&b, "%-7s", label)
		for i := range r.tools {
			fmt.Fprintf(&b, " | %*s %6.3f s %6.1f MiB %5.3f s", width, "", f(i, wallS), f(i, rssMiB), f(i, cpuS))
		}
		b.WriteString("\n")
	}
	for k := range rounds {
		row(fmt.Sprint(k+1), func(i int, g func(sample) float64) float64 { return g(r.samples[i][k]) })
	}
	row("median", func(i int, g func(sample) float64) float64 { return median(r.samples[i], g) })
	for i := range len(r.tools) - 1 {
		w, m, c := r.ratios(i)
		fmt.Fprintf(&b, "%s / %s (medians): wall %.2fx, peak RSS %.2fx, CPU %.2fx\n", r.tools[i].name, r.tools[len(r.tools)-1].name, w, m, c)
	}
	if r.hasBaseline() {
		per := r.perRoundVsBaseline()
		fmt.Fprintf(&b, "%s / %s, per round: wall", r.tools[0].name, r.tools[1].name)
		for _, p := range per {
			fmt.Fprintf(&b, " %.3f", p[0])
		}
		b.WriteString("; peak RSS")
		for _, p := range per {
			fmt.Fprintf(&b, " %.3f", p[1])
		}
		b.WriteString("; CPU")
		for _, p := range per {
			fmt.Fprintf(&b, " %.3f", p[2])
		}
		b.WriteString("\n")
		w, m, c := r.vsBaseline()
		fmt.Fprintf(&b, "%s / %s: medians of the per-round ratios: wall %.3fx, peak RSS %.3fx, CPU %.3fx\n", r.tools[0].name, r.tools[1].name, w, m, c)
	}
	return b.String()
}

// hasBaseline reports whether a baseline kubetask ran (the tool after
// kubetask, before kubectl).
func (r *result) hasBaseline() bool { return len(r.tools) == 3 }

// perRoundVsBaseline returns, per round, kubetask's wall, peak RSS and CPU
// over the baseline's of the same round (the two run one after the other
// in every round).
func (r *result) perRoundVsBaseline() [][3]float64 {
	var out [][3]float64
	for k := range min(len(r.samples[0]), len(r.samples[1])) {
		s, b := r.samples[0][k], r.samples[1][k]
		out = append(out, [3]float64{wallS(s) / wallS(b), rssMiB(s) / rssMiB(b), cpuS(s) / cpuS(b)})
	}
	return out
}

// vsBaseline is the median over the rounds of perRoundVsBaseline.
func (r *result) vsBaseline() (wall, rss, cpu float64) {
	per := r.perRoundVsBaseline()
	col := func(j int) float64 {
		v := make([]float64, len(per))
		for k, p := range per {
			v[k] = p[j]
		}
		return benchresult.Median(v)
	}
	return col(0), col(1), col(2)
}

// record writes every round of every tool to the results file, and each
// tool's ratio to the last tool (kubectl) within the round, so that the
// file has the spread over the rounds.
func (r *result) record(tb testing.TB, res *benchresult.Run) {
	ref := r.samples[len(r.samples)-1]
	for i, t := range r.tools {
		for k, s := range r.samples[i] {
			vals := []benchresult.Value{{V: wallS(s), Unit: "wall-s"}, {V: rssMiB(s), Unit: "peak-rss-MiB"}, {V: cpuS(s), Unit: "cpu-s"}}
			if i < len(r.tools)-1 && k < len(ref) {
				vals = append(vals, benchresult.Value{V: wallS(s) / wallS(ref[k]), Unit: "wall-ratio"},
					benchresult.Value{V: rssMiB(s) / rssMiB(ref[k]), Unit: "rss-ratio"},
					benchresult.Value{V: cpuS(s) / cpuS(ref[k]), Unit: "cpu-ratio"})
			}
			res.Add(tb, "Run/"+t.name, vals...)
		}
	}
	if r.hasBaseline() {
		for _, p := range r.perRoundVsBaseline() {
			res.Add(tb, "Run/kubetask-over-"+r.tools[1].name, benchresult.Value{V: p[0], Unit: "wall-ratio"},
				benchresult.Value{V: p[1], Unit: "rss-ratio"}, benchresult.Value{V: p[2], Unit: "cpu-ratio"})
		}
	}
}

// BenchmarkRun compares the tools over -pairs rounds and prints the table.
func BenchmarkRun(b *testing.B) {
	bn := setup(b)
	size := "full"
	if *pairs < 12 {
		size = fmt.Sprintf("smaller than make bench-run's: %d rounds", *pairs)
	}
	config := []string{"pairs", fmt.Sprint(*pairs), "size", size}
	if base := baselineBin(); base != "" {
		config = append(config, "baseline", base)
	}
	res := benchresult.Start(b, "run", config...)
	for range b.N {
		r := bn.measure(b, *pairs)
		fmt.Print(r.table())
		r.record(b, res)
		w, m, c := r.ratios(0)
		res.Report(b, w, "wall-ratio")
		res.Report(b, m, "rss-ratio")
		res.Report(b, c, "cpu-ratio")
	}
}

// TestCopyBinaryEvicts: a copied binary has (almost) none of its pages in
// the page cache, so that running it reads it in as a cold start would.
func TestCopyBinaryEvicts(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dst := copyBinary(t, self, filepath.Join(t.TempDir(), "copy"))
	if f := resident(t, dst); f > 0.1 {
		t.Errorf("%.0f%% of the copy is in the page cache, want (almost) none", 100*f)
	}
}

// resident returns the fraction of path's pages in the page cache.
func resident(t *testing.T, path string) float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m) //nolint:errcheck // a read-only mapping
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	in := 0
	for _, v := range vec {
		in += int(v & 1)
	}
	return float64(in) / float64(len(vec))
}

// TestRunBenchTiny runs BenchmarkRun's code for one round: both commands
// run the pod, print its line and exit 0. Its numbers mean nothing.
func TestRunBenchTiny(t *testing.T) {
	bn := setup(t)
	r := bn.measure(t, 1)
	t.Log("\n" + r.table())
	for i, ss := range r.samples {
		if len(ss) != 1 || ss[0].maxRSS <= 0 || ss[0].wall <= 0 {
			t.Errorf("%s: samples %+v, want one with a peak RSS and a wall time", r.tools[i].name, ss)
		}
	}
}
