// Package storm measures how the executor records outcomes through a
// 410 Expired storm and after a restart (issues 13 and 19): a steady stream
// of short tasks on kwok nodes, first without faults (the baseline), then
// while etcd is compacted and the executor's pod watches are dropped every
// 2 s (so that every watch resumes into 410 Expired, again and again), then
// a harsher storm (a compaction every second, every WATCH request of the
// executor answered late, 500 tasks), in the same process with the same
// executor; then the executor is stopped while pods finish (some of them
// deleted meanwhile) and a new one on the same store records them.
//
//	flock /tmp/kubetask-bench.lock go test ./test/bench/storm -run '^$' -bench BenchmarkStorm -benchtime 1x -timeout 30m
//	# shorter: KUBETASK_BENCH_STORM_SECONDS=20; also KUBETASK_BENCH_STORM_EVERY=50ms (one task this often),
//	# KUBETASK_BENCH_STORM_COMPACT_EVERY=2s, KUBETASK_BENCH_STORM_RESTART_TASKS=200,
//	# KUBETASK_BENCH_STORM_HARSH_TASKS=500, KUBETASK_BENCH_STORM_HARSH_COMPACT_EVERY=1s,
//	# KUBETASK_BENCH_STORM_HARSH_WATCH_DELAY=500ms;
//	# KUBETASK_BENCH_STORM_TIMELINE=file writes each storm's timeline to file.s and file.h
//	# (the executor's LISTs and WATCHes, drops, each task's end seen, cached, recorded)
//
// Without -bench, `go test ./test/bench/storm` runs the same code with 5 s
// phases and few tasks (TestStormTiny), checking only what must hold
// whatever the timing: every task ended Succeeded exactly once, no pod is
// left, and the storm did produce 410 Expired. Its numbers mean nothing.
//
// In short: measures outcome lag through 410 Expired storms and an executor
// restart, and proves every outcome recorded exactly once through them; about
// 35 s in `go test ./...` (TestStormTiny) on the 2-core CI machine, four
// phases of 60 s plus the cluster for `make bench-storm`.
package storm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/test/bench/benchresult"
	"github.com/kubetask/kubetask/test/exectest"
)

func TestMain(m *testing.M) {
	// The pods watch cache off and etcd's own compaction off: CompactEtcd
	// makes every older resourceVersion of a pod too old at once.
	clustertest.MainWith(m, clustertest.Options{SimNodes: 2, LocalNodes: -1, OnDemandExpiry: true})
}

// stormSize is the shape of one run.
type stormSize struct {
	phase        time.Duration // how long the baseline and each storm submit tasks
	every        time.Duration // baseline and storm: one task submitted this often
	compact      time.Duration // during the storm: one compaction and drop this often
	harsh        stormShape    // the harsh storm
	restartTasks int           // tasks that finish while the executor is down
	restartAfter time.Duration // their complete-after: long enough to stop the executor first
}

// stormShape is what a storm does and how many tasks run through it.
type stormShape struct {
	every      time.Duration // one task submitted this often
	compact    time.Duration // one compaction and drop this often
	watchDelay time.Duration // every WATCH request of the executor is sent this late
}

// The executor of every phase: QPS 200/400, an in-memory store, room for
// every pod at once.
const (
	qps, burst  = 200, 400
	parallelism = 10000
)

// BenchmarkStorm runs the baseline and the storm for 60 s each
// (KUBETASK_BENCH_STORM_SECONDS) with one task every 50 ms, the harsh storm
// as long with 500 tasks, then the restart with 200 tasks, and prints one
// table.
func BenchmarkStorm(b *testing.B) {
	res := benchresult.Start(b, "storm")
	phase := time.Duration(envInt("KUBETASK_BENCH_STORM_SECONDS", 60)) * time.Second
	sz := stormSize{
		phase:   phase,
		every:   envDuration("KUBETASK_BENCH_STORM_EVERY", 50*time.Millisecond),
		compact: envDuration("KUBETASK_BENCH_STORM_COMPACT_EVERY", 2*time.Second),
		harsh: stormShape{
			every:      phase / time.Duration(envInt("KUBETASK_BENCH_STORM_HARSH_TASKS", 500)),
			compact:    envDuration("KUBETASK_BENCH_STORM_HARSH_COMPACT_EVERY", time.Second),
			watchDelay: envDuration("KUBETASK_BENCH_STORM_HARSH_WATCH_DELAY", 500*time.Millisecond),
		},
		restartTasks: envInt("KUBETASK_BENCH_STORM_RESTART_TASKS", 200),
		restartAfter: 10 * time.Second,
	}
	for range b.N {
		r := runStorm(b, sz)
		fmt.Println(r.table(sz))
		res.Report(b, r.baseline.lag(0.99).Seconds(), "baseline-lag-p99-s")
		res.Report(b, r.storm.lag(0.99).Seconds(), "storm-lag-p99-s")
		res.Report(b, r.storm.longestBlind().Seconds(), "storm-longest-blind-s")
		res.Report(b, r.harsh.lag(0.99).Seconds(), "harsh-lag-p99-s")
		res.Report(b, r.harsh.longestGap().Seconds(), "harsh-longest-gap-s")
		res.Report(b, r.restart.all.Seconds(), "restart-all-recorded-s")
	}
}

// TestStormTiny runs BenchmarkStorm's code at a tiny size.
func TestStormTiny(t *testing.T) {
	sz := stormSize{
		phase: 5 * time.Second, every: 250 * time.Millisecond, compact: time.Second,
		harsh:        stormShape{every: 250 * time.Millisecond, compact: time.Second, watchDelay: 200 * time.Millisecond},
		restartTasks: 5, restartAfter: 5 * time.Second,
	}
	r := runStorm(t, sz)
	t.Log("\n" + r.table(sz))
}

// stormResult is what one run measured.
type stormResult struct {
	baseline, storm, harsh phaseResult
	restart                restartResult
	// The observer's relists after 410 Expired, the states it first saw in
	// such a relist, and its longest time without a watch.
	obsRelists, obsFromList int
	obsBlind                time.Duration
}

// phaseResult is what the baseline or the storm measured, from the first
// submission until every task of the phase had its outcome.
type phaseResult struct {
	tasks       int
	compactions int
	// lags are outcome lags, sorted: the outcome recorded (the terminal
	// event's Time) minus the moment the observer first saw the main
	// container terminated.
	lags []time.Duration
	// unmeasured counts the tasks whose pod the reference watch saw gone
	// before it saw the main container terminated (in its own blind time):
	// their lag is not in lags.
	unmeasured int
	// delivered are, sorted, the moments the executor's pod cache first
	// showed a task's main container terminated minus the observer's.
	delivered []time.Duration
	// recorded are the outcomes' record times, sorted; ended the moments the
	// reference watch saw the main containers end, sorted.
	recorded, ended []time.Time
	// relists are when the executor's successful LISTs and streaming lists
	// ended.
	relists     []time.Time
	expired     int     // 410 Expired on the executor's pod watches
	expiredErrs float64 // kubetask_watch_errors_total{kind="expired"}
	lists       float64 // kubetask_pod_lists_total{result="ok"}
	blind       []interval
	samples     samples
	wrong       int // tasks not Succeeded exactly once
}

func (p phaseResult) lag(q float64) time.Duration { return quantile(p.lags, q) }

// longestGap is the longest time between two outcomes recorded one after
// the other.
func (p phaseResult) longestGap() time.Duration { return longestGap(p.recorded) }

// longestGap is the longest time between two of sorted one after the other.
func longestGap(sorted []time.Time) time.Duration {
	var d time.Duration
	for i := 1; i < len(sorted); i++ {
		d = max(d, sorted[i].Sub(sorted[i-1]))
	}
	return d
}

// relistSpacing is the median and the longest time between two relists.
func (p phaseResult) relistSpacing() (median, longest time.Duration) {
	var ds []time.Duration
	for i := 1; i < len(p.relists); i++ {
		ds = append(ds, p.relists[i].Sub(p.relists[i-1]))
	}
	slices.Sort(ds)
	return quantile(ds, 0.5), quantile(ds, 1)
}

func (p phaseResult) longestBlind() time.Duration {
	var d time.Duration
	for _, i := range p.blind {
		d = max(d, i.length())
	}
	return d
}

// restartResult is what the restart measured, from the new executor's
// Start.
type restartResult struct {
	tasks   int
	deleted int // finished pods deleted while the executor was down
	before  int // outcomes the old executor recorded before it stopped
	// fromStart are the times from Start to each outcome the new executor
	// recorded, sorted; all is the last of them.
	fromStart []time.Duration
	all       time.Duration
	podsGone  time.Duration // from Start until no task pod was left
	lists     float64       // the new executor's kubetask_pod_lists_total{result="ok"}
	samples   samples
	wrong     int // tasks not Succeeded exactly once
}

// run is one run's shared state.
type run struct {
	tb   testing.TB
	ctx  context.Context
	sz   stormSize
	env  *clustertest.Env
	st   store.Store
	outs *outcomes
	obs  *observer
	dels *deliveries

	ex     *executor.Executor
	stop   func()
	reg    *prometheus.Registry
	client *stormClient
}

// runStorm runs the three phases on a fresh namespace and checks that every
// task ended Succeeded exactly once and that no pod is left.
func runStorm(tb testing.TB, sz stormSize) stormResult {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &run{tb: tb, ctx: ctx, sz: sz, env: clustertest.New(tb), st: store.NewMemory(), outs: newOutcomes(), dels: newDeliveries("main")}
	r.obs = newObserver(r.env.Client, r.env.Namespace, "main")
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { r.obs.Run(ctx) })
	r.startExecutor()
	r.waitReady()

	complete := map[string]string{kwokstages.CompleteAfter: "1s", kwokstages.CompleteCode: "0"}
	var out stormResult
	base := r.phase("b", complete, sz.every, nil)
	out.baseline = base.result
	storm := r.phase("s", complete, sz.every, &stormShape{every: sz.every, compact: sz.compact})
	out.storm = storm.result
	harsh := r.phase("h", complete, sz.harsh.every, &sz.harsh)
	out.harsh = harsh.result
	restartIDs, restart := r.restart()
	out.restart = restart
	out.obsRelists, out.obsFromList, out.obsBlind = r.obs.stats()

	out.baseline.wrong = r.checkOnce(base.ids)
	out.storm.wrong = r.checkOnce(storm.ids)
	out.harsh.wrong = r.checkOnce(harsh.ids)
	out.restart.wrong = r.checkOnce(restartIDs)
	for _, p := range []struct {
		name string
		r    phaseResult
	}{{"storm", out.storm}, {"harsh storm", out.harsh}} {
		if p.r.expired == 0 {
			tb.Errorf("no 410 Expired on the executor's pod watches during the %s (%d compactions): it tested nothing", p.name, p.r.compactions)
		}
	}
	return out
}

// startExecutor starts an executor on r's store, with a registry and a
// storm client of its own.
func (r *run) startExecutor() {
	r.tb.Helper()
	reg := prometheus.NewRegistry()
	base, err := executor.NewClient(r.env.Config, qps, burst, reg)
	if err != nil {
		r.tb.Fatal(err)
	}
	client := newStormClient(base)
	cfg := executor.Config{Store: r.st, OnEvent: r.outs.Add, OnPodChange: r.dels.OnPodChange, Registerer: reg, Client: client, Parallelism: parallelism, QPS: qps, Burst: burst}
	r.ex, r.stop = exectest.StartExecutor(r.tb, r.env, cfg)
	r.dels.ex.Store(r.ex)
	r.reg, r.client = reg, client
}

// phaseRun is a phase's tasks and result.
type phaseRun struct {
	ids    []string
	result phaseResult
}

// phase submits one task every every for r.sz.phase (IDs prefix and a
// number) and waits until each has its outcome and its pod is gone; with a
// storm, etcd is compacted and the executor's watches dropped every
// storm.compact, and its WATCH requests delayed by storm.watchDelay, from
// the first submission until then.
func (r *run) phase(prefix string, annotations map[string]string, every time.Duration, storm *stormShape) phaseRun {
	r.tb.Helper()
	lists0 := exectest.MetricSum(r.reg, "kubetask_pod_lists_total", "result", "ok")
	expiredErrs0 := exectest.MetricSum(r.reg, "kubetask_watch_errors_total", "kind", "expired")
	expired0, _ := r.client.trace.counts()
	start := time.Now()
	stopSampling := sample(r.ex, r.reg)

	var res phaseResult
	stormCtx, stopStorm := context.WithCancel(r.ctx)
	var wg sync.WaitGroup
	if storm != nil {
		noise := r.noise(prefix)
		r.client.SetWatchDelay(storm.watchDelay)
		wg.Go(func() { res.compactions = r.compactLoop(stormCtx, noise, storm.compact) })
	}
	ids := r.submit(prefix, annotations, every)
	wctx, cancel := context.WithTimeout(r.ctx, 5*time.Minute)
	err := r.outs.Wait(wctx, ids)
	if err == nil {
		// The executor may see a pod's end a moment before the observer.
		err = r.obs.Wait(wctx, "ended", ids)
	}
	cancel()
	stopStorm()
	wg.Wait()
	r.client.SetWatchDelay(0)
	end := time.Now()
	res.samples = stopSampling()
	if storm != nil {
		r.writeTimeline(prefix, ids, start, end)
	}
	if err != nil {
		relists, fromList, blind := r.obs.stats()
		r.tb.Fatalf("phase %s: %v (reference watch: %d relists after 410, %d states first seen in a relist, longest without a watch %s)", prefix, err, relists, fromList, secs(blind))
	}

	res.tasks = len(ids)
	expired1, _ := r.client.trace.counts()
	res.expired = expired1 - expired0
	res.expiredErrs = exectest.MetricSum(r.reg, "kubetask_watch_errors_total", "kind", "expired") - expiredErrs0
	res.lists = exectest.MetricSum(r.reg, "kubetask_pod_lists_total", "result", "ok") - lists0
	res.blind = r.client.trace.blindIn(start, end)
	res.relists = r.client.trace.relistsIn(start, end)
	for _, id := range ids {
		ref, ok := r.obs.TerminatedAt(id)
		rec, ok2 := r.outs.RecordedAt(id)
		if !ok2 {
			r.tb.Errorf("%s: no outcome recorded", id)
			continue
		}
		if !ok { // the pod was gone before the reference saw it end
			res.unmeasured++
			continue
		}
		res.lags = append(res.lags, rec.Sub(ref))
		res.recorded = append(res.recorded, rec)
		res.ended = append(res.ended, ref)
		if at, ok := r.dels.DeliveredAt(id); ok {
			res.delivered = append(res.delivered, at.Sub(ref))
		}
	}
	slices.Sort(res.lags)
	slices.Sort(res.delivered)
	slices.SortFunc(res.recorded, time.Time.Compare)
	slices.SortFunc(res.ended, time.Time.Compare)
	exectest.WaitNoTaskPods(r.tb, r.env, 2*time.Minute)
	return phaseRun{ids: ids, result: res}
}

// submit submits one task every every for r.sz.phase and returns their
// IDs.
func (r *run) submit(prefix string, annotations map[string]string, every time.Duration) []string {
	r.tb.Helper()
	t := time.NewTicker(every)
	defer t.Stop()
	end := time.After(r.sz.phase)
	var ids []string
	for {
		id := fmt.Sprintf("%s%05d", prefix, len(ids))
		if _, err := r.ex.Submit(r.ctx, id, exectest.SimTask(id, annotations)); err != nil {
			r.tb.Fatalf("submitting %s: %v", id, err)
		}
		ids = append(ids, id)
		select {
		case <-end:
			return ids
		case <-t.C:
		}
	}
}

// noise is a ConfigMap (one per storm) written before each compaction, so
// that the compaction passes the last pod event the executor's watches saw.
func (r *run) noise(prefix string) *corev1.ConfigMap {
	r.tb.Helper()
	cm, err := r.env.Client.CoreV1().ConfigMaps(r.env.Namespace).Create(r.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "storm-noise-" + prefix}}, metav1.CreateOptions{})
	if err != nil {
		r.tb.Fatalf("creating the noise ConfigMap: %v", err)
	}
	return cm
}

// compactLoop is the storm: every every, the executor's pod watches
// dropped and etcd compacted to its current revision (see stormStep). It
// returns the number of compactions when ctx ends.
func (r *run) compactLoop(ctx context.Context, noise *corev1.ConfigMap, every time.Duration) int {
	t := time.NewTicker(every)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return n
		case <-t.C:
		}
		var err error
		if noise, err = r.stormStep(ctx, noise); err != nil {
			if ctx.Err() == nil {
				r.tb.Errorf("storm: %v", err)
			}
			return n
		}
	}
}

// stormStep drops the executor's pod watches, holding the resumed ones,
// writes noise twice and compacts etcd, then lets the watches resume: each
// from a version the compaction made too old. The hold keeps a pod event
// between the compaction and the drop from bringing a watch past the
// compaction (no 410). Two writes, because a watch resumes at the revision
// after the last one it saw and etcd still serves a watch from the revision
// it was compacted to.
func (r *run) stormStep(ctx context.Context, noise *corev1.ConfigMap) (*corev1.ConfigMap, error) {
	return stormStep(ctx, r.env, r.client, noise)
}

// stormStep is run.stormStep for client's watches on env.
func stormStep(ctx context.Context, env *clustertest.Env, client *stormClient, noise *corev1.ConfigMap) (*corev1.ConfigMap, error) {
	client.Drop()
	defer client.Release()
	for range 2 {
		noise = noise.DeepCopy()
		noise.Data = map[string]string{"at": time.Now().Format(time.RFC3339Nano)}
		updated, err := env.Client.CoreV1().ConfigMaps(env.Namespace).Update(ctx, noise, metav1.UpdateOptions{})
		if err != nil {
			return noise, fmt.Errorf("writing the noise ConfigMap: %w", err)
		}
		noise = updated
	}
	if _, err := env.Cluster.CompactEtcd(ctx); err != nil {
		return noise, fmt.Errorf("compacting etcd: %w", err)
	}
	return noise, nil
}

// restart submits r.sz.restartTasks tasks at once, stops the executor once
// every pod runs, lets the pods finish, deletes a tenth of them (they stay
// Terminating: kubetask's finalizer holds them), starts a new executor on
// the same store and measures until every outcome is recorded and no pod is
// left.
func (r *run) restart() ([]string, restartResult) {
	r.tb.Helper()
	res := restartResult{tasks: r.sz.restartTasks}
	annotations := map[string]string{kwokstages.CompleteAfter: r.sz.restartAfter.String(), kwokstages.CompleteCode: "0"}
	var ids []string
	for i := range r.sz.restartTasks {
		id := fmt.Sprintf("r%05d", i)
		if _, err := r.ex.Submit(r.ctx, id, exectest.SimTask(id, annotations)); err != nil {
			r.tb.Fatalf("submitting %s: %v", id, err)
		}
		ids = append(ids, id)
	}
	r.waitObserved("running", ids, 5*time.Minute)
	r.stop()
	// A pod whose outcome the executor recorded before it stopped may be
	// gone already (released and deleted, as every finished pod is): under
	// load some finish before the last one runs. A tenth of the others are
	// deleted while the executor is down.
	var down []string
	for _, id := range ids {
		if len(r.outs.Of(id)) > 0 {
			res.before++
		} else {
			down = append(down, id)
		}
	}
	r.waitObserved("terminated", ids, r.sz.restartAfter+2*time.Minute)
	pods := r.env.Client.CoreV1().Pods(r.env.Namespace)
	deleted := down[:min(len(down), max(1, len(ids)/10))]
	for _, id := range deleted {
		if err := pods.Delete(r.ctx, r.obs.PodOf(id), metav1.DeleteOptions{}); err != nil {
			r.tb.Fatalf("deleting the pod of %s: %v", id, err)
		}
	}
	r.waitObserved("deleting", deleted, time.Minute)
	res.deleted = len(deleted)

	begin := time.Now()
	r.startExecutor()
	stopSampling := sample(r.ex, r.reg)
	wctx, cancel := context.WithTimeout(r.ctx, 5*time.Minute)
	err := r.outs.Wait(wctx, ids)
	cancel()
	if err != nil {
		r.tb.Fatalf("restart: %v", err)
	}
	for _, id := range ids {
		if at, _ := r.outs.RecordedAt(id); at.After(begin) {
			res.fromStart = append(res.fromStart, at.Sub(begin))
		}
	}
	slices.Sort(res.fromStart)
	if n := len(res.fromStart); n > 0 {
		res.all = res.fromStart[n-1]
	}
	exectest.WaitNoTaskPods(r.tb, r.env, 2*time.Minute)
	res.podsGone = time.Since(begin)
	res.samples = stopSampling()
	res.lists = exectest.MetricSum(r.reg, "kubetask_pod_lists_total", "result", "ok")
	return ids, res
}

// waitReady waits until the executor acts on pods.
func (r *run) waitReady() {
	r.tb.Helper()
	clustertest.Eventually(r.tb, time.Minute, "executor ready", func(context.Context) error {
		if !r.ex.Ready() {
			return errors.New("not acting on pods")
		}
		return nil
	})
}

func (r *run) waitObserved(which string, ids []string, d time.Duration) {
	r.tb.Helper()
	ctx, cancel := context.WithTimeout(r.ctx, d)
	defer cancel()
	if err := r.obs.Wait(ctx, which, ids); err != nil {
		r.tb.Fatalf("waiting for pods %s: %v", which, err)
	}
}

// checkOnce fails the run for each task that did not end Succeeded exactly
// once: one terminal event (from any executor of the run), and a terminal
// Succeeded record with one attempt. It returns the number of such tasks.
func (r *run) checkOnce(ids []string) int {
	r.tb.Helper()
	bad := 0
	for _, id := range ids {
		evs := r.outs.Of(id)
		rec, err := r.st.Get(r.ctx, id)
		var problem string
		switch {
		case err != nil:
			problem = err.Error()
		case len(evs) != 1:
			problem = fmt.Sprintf("%d terminal events", len(evs))
		case podstate.Phase(evs[0].Phase) != podstate.Succeeded:
			problem = fmt.Sprintf("ended %s/%s: %s", evs[0].Phase, evs[0].Reason, evs[0].Message)
		case !rec.Terminal || podstate.Phase(rec.Phase) != podstate.Succeeded || len(rec.Attempts) != 1:
			problem = fmt.Sprintf("record terminal %v, phase %s, %d attempts", rec.Terminal, rec.Phase, len(rec.Attempts))
		}
		if problem != "" {
			if bad++; bad <= 5 {
				r.tb.Errorf("%s: not Succeeded exactly once: %s", id, problem)
			}
		}
	}
	if bad > 5 {
		r.tb.Errorf("... %d tasks in all not Succeeded exactly once", bad)
	}
	return bad
}

// samples are what sample saw, every 10 ms.
type samples struct {
	n, unhealthy, notReady int
	// gaugeBlind is the longest run of samples with kubetask_pod_cache_blind > 0.
	gaugeBlind time.Duration
}

// sample samples ex and its registry every 10 ms until the returned
// function is called, which returns what it saw.
func sample(ex *executor.Executor, reg prometheus.Gatherer) func() samples {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan samples, 1)
	go func() {
		var s samples
		var blindSince time.Time
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- s
				return
			case <-t.C:
			}
			now := time.Now()
			s.n++
			if ex.Healthy() != nil {
				s.unhealthy++
			}
			if !ex.Ready() {
				s.notReady++
			}
			switch blind := exectest.MetricSum(reg, "kubetask_pod_cache_blind") > 0; {
			case blind && blindSince.IsZero():
				blindSince = now
			case blind:
				s.gaugeBlind = max(s.gaugeBlind, now.Sub(blindSince))
			default:
				blindSince = time.Time{}
			}
		}
	}()
	return func() samples {
		cancel()
		return <-done
	}
}

func (r stormResult) table(sz stormSize) string {
	var b strings.Builder
	fmt.Fprintf(&b, "baseline and storm: %s each, one task every %s (kwok complete-after 1s); storm: etcd compacted and the executor's pod watches dropped every %s; executor QPS %d/%d, memory store\n",
		sz.phase, sz.every, sz.compact, qps, burst)
	fmt.Fprintf(&b, "harsh storm: %s, one task every %s; etcd compacted and the executor's pod watches dropped every %s, each of its WATCH requests sent %s late\n",
		sz.phase, sz.harsh.every, sz.harsh.compact, sz.harsh.watchDelay)
	b.WriteString("| phase | tasks | outcome lag p50 | p99 | max | 410s on the executor's watches (watch_errors{expired}) | pod LISTs | longest blind (watch lost → fresh view) | Healthy failed / not Ready (10 ms samples) | each Succeeded once |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, p := range []struct {
		name string
		r    phaseResult
	}{{"baseline", r.baseline}, {fmt.Sprintf("storm (%d compactions)", r.storm.compactions), r.storm}, {fmt.Sprintf("harsh storm (%d compactions)", r.harsh.compactions), r.harsh}} {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %d (%.0f) | %.0f | %s | %d / %d of %d | %s |\n",
			p.name, p.r.tasks, secs(p.r.lag(0.5)), secs(p.r.lag(0.99)), secs(p.r.lag(1)), p.r.expired, p.r.expiredErrs, p.r.lists,
			secs(p.r.longestBlind()), p.r.samples.unhealthy, p.r.samples.notReady, p.r.samples.n, yes(p.r.wrong))
	}
	rs := r.restart
	fmt.Fprintf(&b, "| restart: recorded after the new executor's Start | %d | %s | %s | %s | - | %.0f | - | %d / %d of %d | %s |\n",
		rs.tasks, secs(quantile(rs.fromStart, 0.5)), secs(quantile(rs.fromStart, 0.99)), secs(rs.all), rs.lists,
		rs.samples.unhealthy, rs.samples.notReady, rs.samples.n, yes(rs.wrong))
	fmt.Fprintf(&b, "storm: %d blind intervals, %s blind in all; kubetask_pod_cache_blind > 0 at most %s\n",
		len(r.storm.blind), secs(total(r.storm.blind)), secs(r.storm.samples.gaugeBlind))
	fmt.Fprintf(&b, "harsh storm: %d blind intervals, %s blind in all; kubetask_pod_cache_blind > 0 at most %s\n",
		len(r.harsh.blind), secs(total(r.harsh.blind)), secs(r.harsh.samples.gaugeBlind))
	b.WriteString("| phase | main container's end in the executor's cache, after the reference watch: p50 / p99 / max | longest gap between recorded outcomes (between ends the reference saw) | relists | between relists: median / longest | lags not measured (pod gone before the reference saw it end) |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for _, p := range []struct {
		name string
		r    phaseResult
	}{{"baseline", r.baseline}, {"storm", r.storm}, {"harsh storm", r.harsh}} {
		med, longest := p.r.relistSpacing()
		fmt.Fprintf(&b, "| %s | %s / %s / %s | %s (%s) | %d | %s / %s | %d |\n", p.name,
			secs(quantile(p.r.delivered, 0.5)), secs(quantile(p.r.delivered, 0.99)), secs(quantile(p.r.delivered, 1)),
			secs(p.r.longestGap()), secs(longestGap(p.r.ended)), len(p.r.relists), secs(med), secs(longest), p.r.unmeasured)
	}
	fmt.Fprintf(&b, "restart: %d pods finished while the executor was down (%d of them deleted meanwhile, Terminating), %d recorded before it stopped; no task pod left %s after Start\n",
		rs.tasks-rs.before, rs.deleted, rs.before, secs(rs.podsGone))
	fmt.Fprintf(&b, "reference watch: %d relists after 410, %d states first seen in a relist, longest without a watch %s\n",
		r.obsRelists, r.obsFromList, secs(r.obsBlind))
	return b.String()
}

func yes(wrong int) string {
	if wrong == 0 {
		return "yes"
	}
	return fmt.Sprintf("NO: %d tasks", wrong)
}

func total(is []interval) time.Duration {
	var d time.Duration
	for _, i := range is {
		d += i.length()
	}
	return d
}

// quantile is the q-quantile of sorted (nearest rank), 0 when empty.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func secs(d time.Duration) string { return fmt.Sprintf("%.3f s", d.Seconds()) }

// envInt is the positive integer in the environment variable name, or def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// envDuration is the positive duration in the environment variable name, or def.
func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

// writeTimeline writes, when KUBETASK_BENCH_STORM_TIMELINE names a file, to
// that file with "." and the phase's prefix added (.s the storm, .h the
// harsh storm), the timeline of a phase from start to end: the executor's LISTs and WATCHes
// and the storm's drops (the storm client's trace), and for each task when
// the reference watch saw its main container terminated, when the
// executor's cache showed it and when the outcome was recorded; times in
// seconds from start.
func (r *run) writeTimeline(prefix string, ids []string, start, end time.Time) {
	path := os.Getenv("KUBETASK_BENCH_STORM_TIMELINE")
	if path == "" {
		return
	}
	path += "." + prefix
	steps := r.client.trace.timeline(start, end)
	for _, id := range ids {
		if at, ok := r.obs.TerminatedAt(id); ok {
			steps = append(steps, step{at, id + " terminated (reference watch)"})
		}
		if at, ok := r.dels.DeliveredAt(id); ok {
			steps = append(steps, step{at, id + " terminated in the executor's cache"})
		}
		if at, ok := r.outs.RecordedAt(id); ok {
			steps = append(steps, step{at, id + " recorded"})
		}
		if at, ok := r.obs.GoneAt(id); ok {
			steps = append(steps, step{at, id + " gone (reference watch)"})
		}
	}
	slices.SortStableFunc(steps, func(a, b step) int { return a.at.Compare(b.at) })
	var b strings.Builder
	for _, s := range steps {
		fmt.Fprintf(&b, "%9.3f %s\n", s.at.Sub(start).Seconds(), s.what)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		r.tb.Errorf("writing the timeline: %v", err)
	}
}
