package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// profilesDir is KUBETASK_BENCH_PROFILES: when set, the cluster's
// kube-apiserver runs with its profiling handlers on and every throughput
// run of the executor and the floor clients writes CPU profiles there:
// <run>-pod.json (the run's last pod as the API server last sent it),
// <run>-client.pprof (this process: the executor or the floor client, with
// the benchmark's own informers), <run>-client.trace (this process's
// execution trace for traceWindow from traceAfter into the run: where a
// goroutine waited, for `go tool trace -pprof=sched|sync|net`) and <run>-apiserver-NNN.pprof (kube-apiserver,
// in windows of apiserverWindow seconds from the run's start to its end; go
// tool pprof merges them when given all). Compare two runs with
//
//	go tool pprof -proto dir/S0-equal-1-apiserver-*.pprof > dir/s0.pb.gz
//	go tool pprof -top -cum -diff_base dir/s0.pb.gz dir/kubetask-2-apiserver-*.pprof
//
// (the number is the run's in the suite). Profiling costs both processes
// CPU: figures of a profiled run are not the suite's.
func profilesDir() string { return os.Getenv("KUBETASK_BENCH_PROFILES") }

// apiserverWindow is the length of one kube-apiserver profile, in seconds.
const apiserverWindow = 10

// traceAfter and traceWindow place the client's execution trace in the
// run: after its start-up, for a few seconds of its steady state.
const (
	traceAfter  = 10 * time.Second
	traceWindow = 5 * time.Second
)

// profiler records one run's CPU profiles (profilesDir); its zero value, and
// a profiler started without profilesDir, does nothing.
type profiler struct {
	base    string
	stopped chan struct{}
	wg      sync.WaitGroup
	self    *os.File
}

var (
	profileRunsMu sync.Mutex
	profileRuns   int
)

// startProfiles starts the CPU profiles of the run named name (a file
// name's part: "S0", "kubetask").
func startProfiles(tb testing.TB, env *clustertest.Env, name string) *profiler {
	tb.Helper()
	dir := profilesDir()
	if dir == "" {
		return &profiler{}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	profileRunsMu.Lock()
	profileRuns++
	base := filepath.Join(dir, fmt.Sprintf("%s-%d", name, profileRuns))
	profileRunsMu.Unlock()
	f, err := os.Create(base + "-client.pprof")
	if err != nil {
		tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		tb.Fatalf("profiling this process: %v", err)
	}
	p := &profiler{base: base, stopped: make(chan struct{}), self: f}
	p.wg.Go(func() {
		select {
		case <-p.stopped:
			return
		case <-time.After(traceAfter):
		}
		tf, err := os.Create(base + "-client.trace")
		if err != nil {
			fmt.Fprintf(os.Stderr, "  this process's trace: %v\n", err)
			return
		}
		defer tf.Close()
		if err := trace.Start(tf); err != nil {
			fmt.Fprintf(os.Stderr, "  this process's trace: %v\n", err)
			return
		}
		select {
		case <-p.stopped:
		case <-time.After(traceWindow):
		}
		trace.Stop()
	})
	p.wg.Go(func() {
		for i := 0; ; i++ {
			raw, err := env.Client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
				Param("seconds", fmt.Sprint(apiserverWindow)).DoRaw(context.Background())
			if err != nil {
				fmt.Fprintf(os.Stderr, "  kube-apiserver's CPU profile: %v (is it started with Profiling?)\n", err)
				return
			}
			if err := os.WriteFile(fmt.Sprintf("%s-apiserver-%03d.pprof", base, i), raw, 0o644); err != nil {
				fmt.Fprintf(os.Stderr, "  kube-apiserver's CPU profile: %v\n", err)
				return
			}
			select {
			case <-p.stopped:
				return
			default:
			}
		}
	})
	return p
}

// savePod writes pod, one of the run's pods as the watch last showed it
// (its managed fields and all), to <run>-pod.json beside the profiles: what
// the API server stored, encoded and sent for each task.
func (p *profiler) savePod(tb testing.TB, pod *corev1.Pod) {
	tb.Helper()
	if p.base == "" || pod == nil {
		return
	}
	raw, err := json.MarshalIndent(pod, "", "  ")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(p.base+"-pod.json", raw, 0o644); err != nil {
		tb.Fatal(err)
	}
}

// stop ends the profiles, waiting for kube-apiserver's last window.
func (p *profiler) stop() {
	if p.self == nil {
		return
	}
	pprof.StopCPUProfile()
	_ = p.self.Close()
	p.self = nil
	close(p.stopped)
	p.wg.Wait()
}
