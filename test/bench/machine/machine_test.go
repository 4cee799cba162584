// Package machine measures how steady the machine itself is: the same
// fixed CPU work, on every core, for minutes, with nothing else of the
// project running. On the 2-core VM this project is built on, the work done
// per CPU-second moves by a quarter within minutes, which is why
// docs/benchmarks.md compares runs only with a baseline run right beside
// them (S0 at the same scale), never with a run made minutes earlier.
//
//	go test ./test/bench/machine -run '^$' -bench BenchmarkMachineDrift -benchtime 1x
//
// In short: measures how much the machine itself drifts, so that no figure
// is compared with another run's; under a second in `go test ./...`
// (TestDriftTiny), 3 min for `make bench-machine`.
package machine

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/test/bench/benchresult"
)

// object is the fixed work's value: a pod-sized nest of maps and slices.
type object struct {
	Labels     map[string]string `json:"labels"`
	Containers []container       `json:"containers"`
	Status     map[string]string `json:"status"`
}

type container struct {
	Name  string            `json:"name"`
	Image string            `json:"image"`
	Env   map[string]string `json:"env"`
	Args  []string          `json:"args"`
}

func newObject() object {
	o := object{Labels: map[string]string{}, Status: map[string]string{"phase": "Running"}}
	for i := range 20 {
		o.Labels["label-"+strconv.Itoa(i)] = "value-value-value"
	}
	for range 3 {
		c := container{Name: "main", Image: "busybox:latest", Env: map[string]string{}, Args: []string{"a", "b", "c"}}
		for j := range 10 {
			c.Env["ENV_"+strconv.Itoa(j)] = "some value here"
		}
		o.Containers = append(o.Containers, c)
	}
	return o
}

// processCPU is this process's user and system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// drift runs the fixed work (encode an object to JSON and decode it, keeping
// the last 20,000 decoded as a live heap) on every core for windows
// windows of length window, and returns the work done per CPU-millisecond in
// each.
func drift(windows int, window time.Duration) []float64 {
	o := newObject()
	var ops atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			keep := make([]*object, 20000)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				b, _ := json.Marshal(o)
				var back object
				_ = json.Unmarshal(b, &back)
				keep[i%len(keep)] = &back
				ops.Add(1)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	var perMs []float64
	lastOps, lastCPU := ops.Load(), processCPU()
	for range windows {
		time.Sleep(window) // the measurement window itself, not a wait for a condition
		n, c := ops.Load(), processCPU()
		if ms := float64((c - lastCPU).Microseconds()) / 1000; ms > 0 {
			perMs = append(perMs, float64(n-lastOps)/ms)
		}
		lastOps, lastCPU = n, c
	}
	return perMs
}

// spread is the slowest window's rate over the fastest's (1 = steady).
func spread(perMs []float64) float64 {
	if len(perMs) == 0 {
		return 0
	}
	lo, hi := perMs[0], perMs[0]
	for _, v := range perMs {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo / hi
}

// BenchmarkMachineDrift prints the fixed work per CPU-millisecond in each
// 10-second window of 3 minutes (KUBETASK_BENCH_MACHINE_WINDOWS sets how
// many windows) and reports the slowest window over the fastest.
func BenchmarkMachineDrift(b *testing.B) {
	res := benchresult.Start(b, "machine")
	windows := 18
	if v, err := strconv.Atoi(os.Getenv("KUBETASK_BENCH_MACHINE_WINDOWS")); err == nil && v > 0 {
		windows = v
	}
	for range b.N {
		perMs := drift(windows, 10*time.Second)
		for i, v := range perMs {
			fmt.Printf("%4d s  %.2f encode+decode per CPU-ms\n", (i+1)*10, v)
		}
		fmt.Printf("slowest window / fastest: %.2f\n", spread(perMs))
		res.Report(b, spread(perMs), "slowest/fastest")
	}
}

// TestDriftTiny runs the measurement for a moment, so its code is
// exercised in CI; its numbers mean nothing.
func TestDriftTiny(t *testing.T) {
	perMs := drift(2, 100*time.Millisecond)
	if len(perMs) != 2 || perMs[0] <= 0 || perMs[1] <= 0 {
		t.Fatalf("windows %v, want 2 positive rates", perMs)
	}
	if s := spread(perMs); !(s > 0 && s <= 1) {
		t.Errorf("spread %v, want in (0, 1]", s)
	}
}

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{5}, 1}, {[]float64{10, 5, 8}, 0.5}} {
		if got := spread(tc.in); got != tc.want {
			t.Errorf("spread(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
