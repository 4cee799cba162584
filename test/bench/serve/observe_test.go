package serve

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/test/bench/benchresult"
)

// BenchmarkServeObservability measures what everything issue 36 adds costs
// when it is on (its goal: within 5 %): the same quick tasks through two
// single-cluster services (BenchmarkServePodEvents' setup), in the order
// off, on, on, off. Off: the services as they start by default (no pod
// events, no traces; Prometheus metrics are always there, unscraped). On:
// `--pod-events`, traces exported (OTEL_EXPORTER_OTLP_ENDPOINT) to an
// OTLP/HTTP receiver in this process that takes every batch, and /metrics
// scraped as Prometheus would (its scrape-time gauges walk the executors'
// tasks): at the start and then every 15 s, the interval of Prometheus'
// example configuration ($KUBETASK_BENCH_OBSERVE_SCRAPE another, e.g. 1s).
// It reports tasks/s to the last outcome of each pair of runs, the
// submissions' p99, the services' CPU time per task (the whole process,
// start to exit) and that of every process of the benchmark (services,
// clusters, this one: from the first submission to the last outcome), the
// spans received per task, the scrapes and a
// scrape's median time and size.
//
//	go test ./test/bench/serve -run '^$' -bench BenchmarkServeObservability -benchtime 1x -timeout 40m
func BenchmarkServeObservability(b *testing.B) {
	res := benchresult.Start(b, "observe")
	east := clustertest.New(b)
	west := clustertest.Another(b, east, clustertest.Options{SimNodes: benchSimNodes, LocalNodes: -1})
	var batches, bytes atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		batches.Add(1)
		bytes.Add(n)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	}))
	b.Cleanup(recv.Close)
	var scrapes, scrapeErrs atomic.Int64
	var scrapeMu sync.Mutex
	var scrapeTimes []time.Duration
	var scrapeBytes int
	every := envDuration("KUBETASK_BENCH_OBSERVE_SCRAPE", 15*time.Second)
	scrape := func(ctx context.Context, svcs []*service) {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			for _, s := range svcs {
				start := time.Now()
				_, body, err := s.do(ctx, http.MethodGet, "/metrics", "", nil, http.StatusOK)
				if err != nil {
					if ctx.Err() == nil {
						scrapeErrs.Add(1)
					}
					continue
				}
				scrapeMu.Lock()
				scrapeTimes, scrapeBytes = append(scrapeTimes, time.Since(start)), len(body)
				scrapeMu.Unlock()
				scrapes.Add(1)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}
	tasks := envInt("KUBETASK_BENCH_OBSERVE_TASKS", 600)
	off := clusterSize{tasks: tasks, clients: 16, qps: 50, timeout: 20 * time.Minute}
	// $KUBETASK_BENCH_OBSERVE_ON turns on only some of them (a comma list
	// of events, traces and metrics), to tell what costs what.
	parts := map[string]bool{"events": true, "traces": true, "metrics": true}
	if v := os.Getenv("KUBETASK_BENCH_OBSERVE_ON"); v != "" {
		parts = map[string]bool{}
		for _, p := range strings.Split(v, ",") {
			parts[strings.TrimSpace(p)] = true
		}
	}
	on := off
	var onFlags []string
	if parts["traces"] {
		on.environ = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL, "OTEL_BSP_SCHEDULE_DELAY=1000"}
	}
	if parts["metrics"] {
		on.during = scrape
	}
	if parts["events"] {
		onFlags = append(onFlags, "--pod-events")
	}
	for range b.N {
		var offs, ons []clusterResult
		batches.Store(0)
		for _, enabled := range []bool{false, true, true, false} {
			if !enabled {
				offs = append(offs, runClusters(b, east, west, false, off))
				continue
			}
			ons = append(ons, runClusters(b, east, west, false, on, onFlags...))
		}
		if parts["traces"] && batches.Load() == 0 || parts["metrics"] && scrapes.Load() == 0 {
			b.Fatalf("nothing observed: %d span batches received, %d scrapes", batches.Load(), scrapes.Load())
		}
		if e := scrapeErrs.Load(); e > 0 {
			b.Fatalf("%d scrapes of /metrics failed", e)
		}
		offTPS, onTPS := pairTasksPerSecond(offs), pairTasksPerSecond(ons)
		ratio := onTPS / offTPS
		fmt.Printf("observability on / off: %.2fx tasks/s; %d span batches (%.1f KiB per task), %d scrapes\n",
			ratio, batches.Load(), float64(bytes.Load())/1024/float64(len(ons)*tasks), scrapes.Load())
		res.Report(b, offTPS, "off-tasks/s")
		res.Report(b, onTPS, "on-tasks/s")
		res.Report(b, ratio, "on/off")
		res.Report(b, ms(percentile(append(offs[0].submits, offs[1].submits...), 0.99)), "off-submit-p99-ms")
		res.Report(b, ms(percentile(append(ons[0].submits, ons[1].submits...), 0.99)), "on-submit-p99-ms")
		for i, r := range []clusterResult{offs[0], ons[0], ons[1], offs[1]} {
			fmt.Printf("run %d (%s): CPU from the first submission to the last outcome: %s\n", i+1, map[bool]string{true: "on", false: "off"}[i == 1 || i == 2], r.machineUse)
		}
		res.Report(b, cpuPerTask(offs, false), "off-cpu-ms/task")
		res.Report(b, cpuPerTask(ons, false), "on-cpu-ms/task")
		res.Report(b, cpuPerTask(offs, true), "off-machine-cpu-ms/task")
		res.Report(b, cpuPerTask(ons, true), "on-machine-cpu-ms/task")
		// The same runs' paired cost: on's CPU per task over off's.
		res.Report(b, cpuPerTask(ons, true)/cpuPerTask(offs, true), "machine-cpu-on/off")
		res.Report(b, float64(bytes.Load())/1024/float64(len(ons)*tasks), "span-KiB/task")
		res.Report(b, float64(scrapes.Load()), "scrapes")
		scrapeMu.Lock()
		res.Report(b, ms(percentile(scrapeTimes, 0.5)), "scrape-ms")
		res.Report(b, float64(scrapeBytes)/1024, "scrape-KiB")
		scrapeMu.Unlock()
	}
}

// cpuPerTask is the services' CPU time per task over runs, in ms (start
// to exit); machine: that of every process measured, services, clusters
// and benchmark, from the first submission to the last outcome.
func cpuPerTask(runs []clusterResult, machine bool) float64 {
	var cpu time.Duration
	tasks := 0
	for _, r := range runs {
		if machine {
			cpu += r.machineCPU
		} else {
			cpu += r.cpu
		}
		tasks += r.size.tasks
	}
	return ms(cpu) / float64(tasks)
}

// envDuration is $name as a duration, or def when it is unset or not one.
func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}
