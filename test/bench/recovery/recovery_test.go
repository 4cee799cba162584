// Package recovery measures how long kubetask's executor is blind after
// kube-apiserver restarts (an API server rollout: every watch breaks, the
// watch cache is empty, a resumed watch gets 410 Expired), against a plain
// client-go SharedIndexInformer on the same pods in the same process.
//
//	go test ./test/bench/recovery -run '^$' -bench BenchmarkRecovery -benchtime 1x -timeout 30m
//	# smaller: KUBETASK_BENCH_RECOVERY_PODS=500, KUBETASK_BENCH_RECOVERY_RESTARTS=2
//
// Without -bench, `go test ./test/bench/recovery` runs the benchmark's code
// once at a tiny size (TestRecoveryTiny), so that it cannot rot; its numbers
// mean nothing.
//
// In short: measures how long the executor is blind after kube-apiserver
// restarts, against a plain informer; about 30 s in `go test ./...`
// (TestRecoveryTiny) on the 2-core CI machine, about 2.5 min for `make
// bench-recovery`.
package recovery

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/bench/benchresult"
	"github.com/kubetask/kubetask/test/exectest"
)

func TestMain(m *testing.M) {
	flag.Parse()
	sim := 1
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		sim = 10
	}
	clustertest.MainWith(m, clustertest.Options{SimNodes: sim, LocalNodes: -1})
}

// recoverySize is the shape of one run.
type recoverySize struct {
	pods, restarts int
}

// restartResult is what one API server restart measured, from the moment
// the restarted kube-apiserver was ready.
type restartResult struct {
	down time.Duration // RestartAPIServer: stop to ready
	// The executor acting on pods again with fresh caches (Ready: its
	// instance Lease held, its caches synced, a LIST or WATCH succeeded
	// since it was first seen blind or not acting), and the plain
	// informer's first successful LIST or WATCH after its first failure.
	// -1: not within 3 minutes.
	executor, informer time.Duration
	// Whether the executor's cache was seen blind (kubetask_pod_cache_blind)
	// and Healthy failing, sampled every 20 ms.
	blindSeen   bool
	healthyErrs int
}

func (r restartResult) String() string {
	return fmt.Sprintf("down %.1f s; after ready: executor acting on fresh caches %s, client-go informer's first LIST/WATCH %s; blind seen %v, Healthy failed in %d samples",
		r.down.Seconds(), secs(r.executor), secs(r.informer), r.blindSeen, r.healthyErrs)
}

func secs(d time.Duration) string {
	if d == -1 {
		return "not within 3 min"
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// BenchmarkRecovery tracks 5,000 running task pods (KUBETASK_BENCH_RECOVERY_PODS)
// on kwok nodes with the executor and, in the same process, with a plain
// client-go informer, restarts kube-apiserver three times in a row
// (KUBETASK_BENCH_RECOVERY_RESTARTS), and reports after each restart how
// long each took to list or watch again, and when the executor acted again;
// then it restarts the executor and reports how long the new one took to
// adopt every pod, and with how many LISTs.
func BenchmarkRecovery(b *testing.B) {
	res := benchresult.Start(b, "recovery")
	sz := recoverySize{pods: envInt("KUBETASK_BENCH_RECOVERY_PODS", 5000), restarts: envInt("KUBETASK_BENCH_RECOVERY_RESTARTS", 3)}
	for range b.N {
		rs, adopt := runRecovery(b, sz)
		fmt.Println(recoveryTable(sz, rs, adopt))
		var worstEx, worstInf time.Duration
		for _, r := range rs {
			worstEx, worstInf = max(worstEx, r.executor), max(worstInf, r.informer)
		}
		res.Report(b, worstEx.Seconds(), "executor-worst-s")
		res.Report(b, worstInf.Seconds(), "informer-worst-s")
		res.Report(b, adopt.took.Seconds(), "adoption-s")
	}
}

// TestRecoveryTiny runs BenchmarkRecovery's code at a tiny size.
func TestRecoveryTiny(t *testing.T) {
	sz := recoverySize{pods: 10, restarts: 1}
	rs, adopt := runRecovery(t, sz)
	t.Log("\n" + recoveryTable(sz, rs, adopt))
}

func recoveryTable(sz recoverySize, rs []restartResult, adopt adoptionResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d running task pods; kube-apiserver restarted %d times in a row\n", sz.pods, sz.restarts)
	b.WriteString("(times from the restarted kube-apiserver's readiness; negative: before it)\n")
	b.WriteString("| restart | API server down | executor acting on fresh caches | client-go informer: first LIST/WATCH after a failure | executor blind seen | Healthy failed (10 ms samples) |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for i, r := range rs {
		fmt.Fprintf(&b, "| %d | %.1f s | %s | %s | %v | %d |\n", i+1, r.down.Seconds(), secs(r.executor), secs(r.informer), r.blindSeen, r.healthyErrs)
	}
	fmt.Fprintf(&b, "executor restarted on the same store: acting with every pod adopted %.2f s after Start, with %.0f LIST(s) of pods\n", adopt.took.Seconds(), adopt.lists)
	return b.String()
}

// runRecovery runs sz.pods tasks that keep running, waits until the executor
// and the plain informer see them all, then restarts kube-apiserver
// sz.restarts times, measuring each, and finally restarts the executor and
// measures its adoption of the pods.
func runRecovery(tb testing.TB, sz recoverySize) ([]restartResult, adoptionResult) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := clustertest.New(tb)
	reg := prometheus.NewRegistry()
	st := store.NewMemory()
	cfg := executor.Config{Store: st, Parallelism: sz.pods, QPS: 500, Burst: 1000}
	cfg.Registerer = reg
	ex, stop := exectest.StartExecutor(tb, env, cfg)
	stops := []func(){stop}
	defer func() {
		for _, stop := range stops {
			stop()
		}
		exectest.RemoveTaskPods(tb, env)
	}()
	for i := range sz.pods {
		id := fmt.Sprintf("r%05d", i)
		if _, err := ex.Submit(ctx, id, exectest.SimTask(id, nil)); err != nil { // kwok keeps it running
			tb.Fatalf("submitting %s: %v", id, err)
		}
	}
	poll(tb, 20*time.Minute, "every task running", func() bool {
		return exectest.MetricSum(reg, "kubetask_tasks", "phase", "Running") == float64(sz.pods)
	})

	inf, informerReqs := plainInformer(env.Client, env.Namespace, task.ManagedSelector().String())
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		tb.Fatal("the plain informer did not sync")
	}

	var out []restartResult
	for range sz.restarts {
		out = append(out, measureRestart(ctx, tb, env, ex, reg, informerReqs))
	}

	// The executor restarted: a new one on the same store adopts every
	// running pod, with one LIST per namespace.
	stop()
	cfg.Registerer = prometheus.NewRegistry()
	begin := time.Now()
	ex2, stop2 := exectest.StartExecutor(tb, env, cfg)
	stops = append(stops, stop2)
	// Ready: the instance Lease held and the caches' first list handed to
	// the executor in full (every pod adopted); the tasks' phases come from
	// the store at once.
	poll(tb, 5*time.Minute, "the new executor acting with every task running", func() bool {
		return ex2.Ready() && exectest.MetricSum(cfg.Registerer.(*prometheus.Registry), "kubetask_tasks", "phase", "Running") == float64(sz.pods)
	})
	adopt := adoptionResult{took: time.Since(begin), lists: exectest.MetricSum(cfg.Registerer.(*prometheus.Registry), "kubetask_pod_lists_total")}
	return out, adopt
}

// adoptionResult is what a restarted executor measured: from its Start to
// acting with every pod in its caches and every task Running, and its LISTs
// meanwhile.
type adoptionResult struct {
	took  time.Duration
	lists float64
}

// measureRestart restarts kube-apiserver once and measures the recovery,
// from the moment the restarted server was ready (a negative time: before
// it said so).
func measureRestart(ctx context.Context, tb testing.TB, env *clustertest.Env, ex *executor.Executor, reg *prometheus.Registry, informer *okTimes) restartResult {
	tb.Helper()
	exOK := func() float64 {
		return exectest.MetricSum(reg, "kubetask_pod_lists_total", "result", "ok") + exectest.MetricSum(reg, "kubetask_pod_watches_total", "result", "ok")
	}
	// Sample the executor every 10 ms from before the restart: when it
	// first failed (blind, or not acting), and when, after that, it had
	// listed or watched again and acted.
	var (
		mu                    sync.Mutex
		failedAt, recoveredAt time.Time
		blindSeen             bool
		healthyErrs           int
	)
	sctx, stopSampling := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var okAtFailure float64
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
			now := time.Now()
			blind := exectest.MetricSum(reg, "kubetask_pod_cache_blind") > 0
			ready := ex.Ready()
			unhealthy := ex.Healthy() != nil
			ok := exOK()
			mu.Lock()
			blindSeen = blindSeen || blind
			if unhealthy {
				healthyErrs++
			}
			switch {
			case failedAt.IsZero() && (blind || !ready):
				failedAt, okAtFailure = now, ok
			case !failedAt.IsZero() && recoveredAt.IsZero() && !blind && ready && ok > okAtFailure:
				recoveredAt = now
			}
			mu.Unlock()
		}
	})
	start := time.Now()
	if err := env.Cluster.RestartAPIServer(ctx); err != nil {
		tb.Fatalf("restarting kube-apiserver: %v", err)
	}
	ready := time.Now()
	r := restartResult{down: ready.Sub(start), executor: -1, informer: -1}
	deadline := ready.Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		mu.Lock()
		done := !recoveredAt.IsZero()
		mu.Unlock()
		_, infDone := informer.recoveredAfter(start)
		if done && infDone {
			break
		}
		time.Sleep(10 * time.Millisecond) // the sampling interval of the measurement
	}
	stopSampling()
	wg.Wait()
	if !recoveredAt.IsZero() {
		r.executor = recoveredAt.Sub(ready)
	}
	if at, ok := informer.recoveredAfter(start); ok {
		r.informer = at.Sub(ready)
	}
	r.blindSeen, r.healthyErrs = blindSeen, healthyErrs
	if recoveredAt.IsZero() {
		tb.Errorf("the executor did not list, watch and act again within 3 minutes of the API server's restart: %v", r)
	}
	return r
}

// okTimes records when each LIST or WATCH request returned, and whether it
// succeeded.
type okTimes struct {
	mu  sync.Mutex
	at  []time.Time
	oks []bool
}

func (o *okTimes) add(err error) {
	o.mu.Lock()
	o.at = append(o.at, time.Now())
	o.oks = append(o.oks, err == nil)
	o.mu.Unlock()
}

// recoveredAfter is the time of the first success after the first failure
// that came after start.
func (o *okTimes) recoveredAfter(start time.Time) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	failed := false
	for i, at := range o.at {
		switch {
		case at.Before(start):
		case !o.oks[i]:
			failed = true
		case failed:
			return at, true
		}
	}
	return time.Time{}, false
}

// plainInformer is a client-go SharedIndexInformer on the pods of ns that
// selector selects (client-go's defaults: its back-off of 0.8 s growing to
// 30 s), recording its successful requests.
func plainInformer(client kubernetes.Interface, ns, selector string) (cache.SharedIndexInformer, *okTimes) {
	ok := &okTimes{}
	pods := client.CoreV1().Pods(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			l, err := pods.List(ctx, opts)
			ok.add(err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			w, err := pods.Watch(ctx, opts)
			ok.add(err)
			return w, err
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Pod{}, 0, cache.Indexers{}), ok
}

// poll checks cond every 50 ms until it holds, or fails tb after d.
func poll(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// envInt is the positive integer in the environment variable name, or def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}
