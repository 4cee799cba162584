package executor

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster"
)

// percentile returns the q-quantile (0 <= q <= 1) of xs by the nearest-rank
// method: the smallest value with at least q of the values at or below it.
// It returns 0 for no values. xs is not modified.
func percentile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(q * float64(len(s))))
	if rank < 1 {
		rank = 1
	}
	if rank > len(s) {
		rank = len(s)
	}
	return s[rank-1]
}

func TestPercentile(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		out := make([]time.Duration, len(vs))
		for i, v := range vs {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100..1, unsorted
	}
	tests := map[string]struct {
		xs   []time.Duration
		q    float64
		want time.Duration
	}{
		"empty":                       {nil, 0.5, 0},
		"one value is every quantile": {ms(7), 0.99, 7 * time.Millisecond},
		"median of odd count":         {ms(3, 1, 2), 0.5, 2 * time.Millisecond},
		"median of even count is the lower middle": {ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		"p0 is the minimum":                        {ms(5, 9, 1), 0, 1 * time.Millisecond},
		"p100 is the maximum":                      {ms(5, 9, 1), 1, 9 * time.Millisecond},
		"p99 of 1..100":                            {ms(hundred...), 0.99, 99 * time.Millisecond},
		"p50 of 1..100":                            {ms(hundred...), 0.50, 50 * time.Millisecond},
		"negative values sort first":               {ms(-5, 10, 0), 0.5, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			orig := slices.Clone(tc.xs)
			if got := percentile(tc.xs, tc.q); got != tc.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tc.xs, tc.q, got, tc.want)
			}
			if !slices.Equal(orig, tc.xs) {
				t.Errorf("input modified: %v, was %v", tc.xs, orig)
			}
		})
	}
}

// heapAfterGC returns the live heap after forcing full collections.
func heapAfterGC() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// cpuSample is the CPU time used so far by each cluster component and by this
// test process (the executor and the benchmark's own watches).
type cpuSample map[string]time.Duration

// clockTick is USER_HZ, 100 on every Linux this runs on.
const clockTick = 10 * time.Millisecond

// selfCPU names this process in a cpuSample.
const selfCPU = "benchmark process (client)"

func sampleCPU(c *localcluster.Cluster) cpuSample {
	s := cpuSample{selfCPU: procCPU(os.Getpid())}
	for _, p := range c.Processes() {
		s[p.Name] += procCPU(p.PID)
	}
	return s
}

// procCPU reads utime+stime of pid from /proc; 0 if unreadable.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may contain spaces: fields start after the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64) // field 14 of stat
	k, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	return time.Duration(u+k) * clockTick
}

// cpuReport formats the CPU used between two samples as seconds and share
// of the wall time (1.00 = one core), largest first.
func cpuReport(before, after cpuSample, wall time.Duration) string {
	type row struct {
		name string
		d    time.Duration
	}
	var rows []row
	var total time.Duration
	for name, a := range after {
		d := a - before[name]
		rows = append(rows, row{name, d})
		total += d
	}
	slices.SortFunc(rows, func(a, b row) int { return int(b.d - a.d) })
	var sb strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&sb, "    %-30s %7.1f s CPU  %5.2f cores\n", r.name, r.d.Seconds(), r.d.Seconds()/wall.Seconds())
	}
	fmt.Fprintf(&sb, "    %-30s %7.1f s CPU  %5.2f cores (machine has %d; load average %s)\n", "total", total.Seconds(), total.Seconds()/wall.Seconds(), runtime.NumCPU(), loadAvg())
	return sb.String()
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
