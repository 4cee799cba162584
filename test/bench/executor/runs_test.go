package executor

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/kubetask/kubetask/internal/localcluster"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// row is one line of the benchmark's table: a throughput run, or a memory
// measurement (heap set, the throughput fields zero).
type row struct {
	name string
	// key is the row's benchmark name in the results file
	// ("Executor/kubetask/unlimited"), "" for none.
	key   string
	tasks int
	qps   string // the client limit, as set
	// limit groups the rows run at the same client limit: "unlimited",
	// "200", "50", "default".
	limit string
	// elapsed is first submit (or create) to last pod gone.
	elapsed time.Duration
	// clientReq is the client's own API requests per task (the executor's
	// kubetask_api_requests_total, kube-controller-manager's
	// rest_client_requests_total, the floor client's count); NaN unknown.
	clientReq float64
	// allReq is apiserver_request_total over every client, per task.
	allReq float64
	// verbs is allReq by "VERB resource[/subresource]", per task.
	verbs map[string]float64
	// p50, p99: main terminated (seen by the benchmark's own informer) to
	// the outcome recorded (the executor's store, the Job's Complete
	// condition seen, the floor client's watch).
	p50, p99 time.Duration
	lags     int
	// durP50, durP99: main terminated to the outcome durable in the store
	// (the executor's AttemptFinished event, emitted once the store's
	// write returned); the same as p50, p99 for the other clients, which
	// keep no store.
	durP50, durP99 time.Duration
	// waitP99, passP99: the executor's queue (queueTimes): the time a key
	// waited before a worker took it, and one pass's time; 0 for the other
	// clients.
	waitP99, passP99 time.Duration
	// watchP99, ownP99: the outcome's lag in two (the executor's rows):
	// from the benchmark's watch to the executor's pod cache showing the
	// main container terminated, and from there to the outcome recorded.
	watchP99, ownP99 time.Duration
	// equalS0 is the tasks/s of the equal-work S0 run beside this one (its
	// pair, or at the same scale); 0 for none.
	equalS0 float64
	// CPU seconds per 1,000 tasks: this process (the executor or the floor
	// client, with the benchmark's own informers), kube-controller-manager,
	// kube-apiserver.
	clientCPU, kcmCPU, apiCPU float64
	cores                     float64 // the whole machine's busy cores during the run
	heap                      float64 // bytes per pod (memory rows)
	store                     bool    // a store row: tasks are writes
	note                      string
}

func (r row) tasksPerSecond() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.tasks) / r.elapsed.Seconds()
}

// measure holds what a run samples before it starts.
type measure struct {
	start    time.Time
	cpu      cpuSample
	requests map[string]float64
	etcd     map[string]float64 // kube-apiserver's etcd requests for pods by operation
}

func startMeasure(ctx context.Context, env *clustertest.Env) measure {
	etcd, _ := exectest.EtcdPodRequests(ctx, env)
	return measure{start: time.Now(), cpu: sampleCPU(env.Cluster), requests: apiserverRequestsBy(ctx, env.Client), etcd: etcd}
}

// finish fills r's per-task request and CPU figures from m to now.
func (m measure) finish(ctx context.Context, env *clustertest.Env, r *row) {
	wall := time.Since(m.start)
	cpu := sampleCPU(env.Cluster)
	per1k := func(name string) float64 { return (cpu[name] - m.cpu[name]).Seconds() * 1000 / float64(r.tasks) }
	r.clientCPU, r.kcmCPU, r.apiCPU = per1k(selfCPU), per1k("kube-controller-manager"), per1k("kube-apiserver")
	var total time.Duration
	for name, d := range cpu {
		total += d - m.cpu[name]
	}
	r.cores = total.Seconds() / wall.Seconds()
	type verb struct {
		key string
		n   float64
	}
	var verbs []verb
	etcd, _ := exectest.EtcdPodRequests(ctx, env)
	for k, v := range apiserverRequestsBy(ctx, env.Client) {
		if d := v - m.requests[k]; d > 0 {
			verbs = append(verbs, verb{k, d / float64(r.tasks)})
			r.allReq += d / float64(r.tasks)
			if r.verbs == nil {
				r.verbs = map[string]float64{}
			}
			r.verbs[k] = d / float64(r.tasks)
		}
	}
	slices.SortFunc(verbs, func(a, b verb) int { return cmp.Compare(b.n, a.n) })
	var top strings.Builder
	for i, v := range verbs {
		if i == 12 || v.n < 0.01 {
			break
		}
		fmt.Fprintf(&top, " %s %.2f;", v.key, v.n)
	}
	var ops strings.Builder
	for _, op := range slices.Sorted(maps.Keys(etcd)) {
		if d := (etcd[op] - m.etcd[op]) / float64(r.tasks); d >= 0.01 {
			fmt.Fprintf(&ops, " %s %.2f;", op, d)
		}
	}
	fmt.Fprintf(os.Stderr, "  %s: %d tasks in %.1f s (%.1f tasks/s); apiserver requests per task:%s\n  kube-apiserver's etcd requests for pods per task:%s\n  CPU during the run:\n%s",
		r.name, r.tasks, r.elapsed.Seconds(), r.tasksPerSecond(), top.String(), ops.String(), cpuReport(m.cpu, cpu, wall))
}

// sameConnection is a client for the benchmark's own pod watch (the
// tracker, whose "main terminated" starts each outcome lag) that shares its
// HTTP/2 connection with the client under test: client-go shares one
// connection between clients of the same TLS and transport settings, and the
// executor's (executor.NewClient, which the floor client uses too) asks for
// uncompressed answers. On one connection both watches get each event in the
// same stream, so the lag is what the client does with it; on two, it would
// also be how far kube-apiserver's writers to the two watches drift apart
// when it is saturated (up to a hundred milliseconds at p99 on two cores),
// which is the API server's, not the client's, and would hide it.
func sameConnection(tb testing.TB, env *clustertest.Env) kubernetes.Interface {
	tb.Helper()
	c, err := executor.NewClient(env.Config, executor.Unlimited, 0, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// lagsOf returns, for every key outcome has, outcome minus seen.
func lagsOf(outcome, seen map[string]time.Time) []time.Duration {
	var lags []time.Duration
	for k, at := range outcome {
		if s, ok := seen[k]; ok {
			lags = append(lags, at.Sub(s))
		}
	}
	return lags
}

func (r *row) setLags(lags []time.Duration) {
	r.p50, r.p99, r.lags = percentile(lags, 0.5), percentile(lags, 0.99), len(lags)
	r.durP50, r.durP99 = r.p50, r.p99
}

// executorRun runs n quick tasks through an executor with cfg (its Store,
// Registerer, OnEvent and InstanceID are the benchmark's) until every pod
// is gone, and checks that each task ended exactly once, Succeeded.
func executorRun(tb testing.TB, name, qps string, cfg executor.Config, n int) row {
	tb.Helper()
	env := clustertest.New(tb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := newTracker(func(p *corev1.Pod) string { return p.Labels[task.LabelRun] })
	tr.start(ctx, tb, sameConnection(tb, env), env.Namespace, task.ManagedSelector().String())

	reg := prometheus.NewRegistry()
	out := newOutcomes()
	cfg.Registerer, cfg.OnEvent, cfg.Store = reg, out.add, store.NewMemory()
	cfg.InstanceID = "bench"
	// When the executor's own pod cache first showed each pod's main
	// container terminated: the outcome's lag is the time the executor's
	// watch is behind the benchmark's, then the executor's own.
	var (
		exRef  atomic.Pointer[executor.Executor]
		seenMu sync.Mutex
		seen   = map[string]time.Time{}
	)
	cfg.OnPodChange = func(ns, name string) {
		ex := exRef.Load()
		if ex == nil {
			return
		}
		if p := ex.CachedPod(ns, name); p != nil && terminated(p) {
			now := time.Now()
			seenMu.Lock()
			if _, ok := seen[p.Labels[task.LabelRun]]; !ok {
				seen[p.Labels[task.LabelRun]] = now
			}
			seenMu.Unlock()
		}
	}
	queueMetrics.take() // an earlier run's
	ex, stop := exectest.StartExecutor(tb, env, cfg)
	exRef.Store(ex)
	defer stop()
	reqs0 := exectest.MetricSum(reg, "kubetask_api_requests_total")
	m := startMeasure(ctx, env)
	prof := startProfiles(tb, env, "kubetask")
	defer prof.stop()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("t%05d", i)
		if _, err := ex.Submit(ctx, id, quickTask(id)); err != nil {
			tb.Fatalf("submitting %s: %v", id, err)
		}
	}
	waitFor(tb, 20*time.Minute, name, func() (bool, string) {
		created, deleted, _ := tr.counts()
		terminal, _ := out.counts()
		return terminal == n && deleted == n, fmt.Sprintf("%s: %d pods created, %d outcomes, %d pods gone", time.Since(m.start).Round(time.Second), created, terminal, deleted)
	})
	prof.stop()
	prof.savePod(tb, tr.lastPod())
	_, _, lastDelete := tr.counts()
	r := row{name: name, tasks: n, qps: qps, elapsed: lastDelete.Sub(m.start)}
	r.clientReq = (exectest.MetricSum(reg, "kubetask_api_requests_total") - reqs0) / float64(n)
	m.finish(ctx, env, &r)
	stop()
	waits, passes := queueMetrics.take()
	r.waitP99, r.passP99 = percentile(waits, 0.99), percentile(passes, 0.99)
	fmt.Printf("%s: the executor's queue: %d waits, p50 %v p99 %v max %v; %d passes, p50 %v p99 %v max %v\n", name,
		len(waits), percentile(waits, 0.5), r.waitP99, percentile(waits, 1), len(passes), percentile(passes, 0.5), r.passP99, percentile(passes, 1))

	bad, dup := 0, 0
	out.mu.Lock()
	for id, evs := range out.terminal {
		if len(evs) != 1 {
			dup++
		}
		if evs[0].Phase != "Succeeded" {
			bad++
			if bad <= 5 {
				tb.Errorf("%s: %s/%s %s", id, evs[0].Phase, evs[0].Reason, evs[0].Message)
			}
		}
	}
	if dup > 0 {
		tb.Errorf("%s: %d tasks with more than one terminal event", name, dup)
	}
	tr.mu.Lock()
	r.setLags(lagsOf(out.recorded, tr.terminated))
	durable := lagsOf(out.delivered, tr.terminated)
	r.durP50, r.durP99 = percentile(durable, 0.5), percentile(durable, 0.99)
	seenMu.Lock()
	watchLags, ownLags := lagsOf(seen, tr.terminated), lagsOf(out.recorded, seen)
	r.watchP99, r.ownP99 = percentile(watchLags, 0.99), percentile(ownLags, 0.99)
	fmt.Printf("%s: the outcome's lag: the executor's watch behind the benchmark's: p50 %v p99 %v max %v; then the executor's own: p50 %v p99 %v max %v\n", name,
		percentile(watchLags, 0.5), r.watchP99, percentile(watchLags, 1), percentile(ownLags, 0.5), r.ownP99, percentile(ownLags, 1))
	seenMu.Unlock()
	tr.mu.Unlock()
	out.mu.Unlock()
	return r
}

// kcmLimit is kube-controller-manager's client limit and
// --concurrent-job-syncs (0: its default, 5) now; the benchmark restarts it
// only to change them.
var kcmLimit = [3]int{1000, 1000, 0}

// setControllerManagerLimit restarts kube-controller-manager with the client
// limit qps/burst and jobSyncs concurrent Job syncs (0: its default) unless
// it already has them.
func setControllerManagerLimit(tb testing.TB, qps, burst, jobSyncs int) {
	tb.Helper()
	if kcmLimit == [3]int{qps, burst, jobSyncs} {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := clustertest.Cluster()
	c.SetControllerManagerJobSyncs(jobSyncs)
	if err := c.RestartControllerManager(ctx, qps, burst); err != nil {
		tb.Fatalf("restarting kube-controller-manager at QPS %d, %d job syncs: %v", qps, jobSyncs, err)
	}
	kcmLimit = [3]int{qps, burst, jobSyncs}
}

// jobRun does the same work as executorRun through the Job controller, with
// kube-controller-manager's client at kcmQPS/kcmBurst and jobSyncs
// concurrent Job syncs (0: its default, 5): n single-pod Jobs with
// ttlSecondsAfterFinished 0, created by 16 concurrent clients, until every
// Job and pod is gone.
func jobRun(tb testing.TB, name, qps string, kcmQPS, kcmBurst, jobSyncs, n int) row {
	tb.Helper()
	setControllerManagerLimit(tb, kcmQPS, kcmBurst, jobSyncs)
	env := clustertest.New(tb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := newTracker(func(p *corev1.Pod) string { return p.Labels[batchv1.JobNameLabel] })
	tr.start(ctx, tb, env.Client, env.Namespace, batchv1.JobNameLabel)

	var mu sync.Mutex
	completed := map[string]time.Time{}
	jobsGone := 0
	jobs := env.Client.BatchV1().Jobs(env.Namespace)
	jinf := cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return jobs.List(ctx, o) },
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return jobs.Watch(ctx, o)
		},
	}, &batchv1.Job{}, 0, cache.Indexers{})
	noteJob := func(obj any) {
		j, ok := obj.(*batchv1.Job)
		if !ok {
			return
		}
		for _, c := range j.Status.Conditions {
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
				mu.Lock()
				if _, ok := completed[j.Name]; !ok {
					completed[j.Name] = time.Now()
				}
				mu.Unlock()
			}
		}
	}
	_, _ = jinf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: noteJob, UpdateFunc: func(_, o any) { noteJob(o) },
		DeleteFunc: func(any) { mu.Lock(); jobsGone++; mu.Unlock() },
	})
	go jinf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), jinf.HasSynced) {
		tb.Fatal("job informer did not sync")
	}
	kcmReqs0 := controllerManagerRequests(ctx, env)
	m := startMeasure(ctx, env)
	var creators errgroup.Group
	creators.SetLimit(16)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("j%05d", i)
		creators.Go(func() error {
			if _, err := jobs.Create(ctx, quickJob(name), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("creating job %s: %w", name, err)
			}
			return nil
		})
	}
	if err := creators.Wait(); err != nil {
		tb.Fatal(err)
	}
	waitFor(tb, 30*time.Minute, name, func() (bool, string) {
		created, deleted, _ := tr.counts()
		mu.Lock()
		done, gone := len(completed), jobsGone
		mu.Unlock()
		return gone == n && deleted >= n && created == deleted,
			fmt.Sprintf("%s: %d pods created, %d Jobs complete, %d Jobs gone, %d pods gone", time.Since(m.start).Round(time.Second), created, done, gone, deleted)
	})
	_, _, lastDelete := tr.counts()
	r := row{name: name, tasks: n, qps: qps, elapsed: lastDelete.Sub(m.start)}
	r.clientReq = (controllerManagerRequests(ctx, env) - kcmReqs0) / float64(n)
	m.finish(ctx, env, &r)
	mu.Lock()
	tr.mu.Lock()
	r.setLags(lagsOf(completed, tr.terminated))
	tr.mu.Unlock()
	mu.Unlock()
	return r
}

// controllerManagerRequests sums kube-controller-manager's
// rest_client_requests_total (every request of every controller in it) from
// its metrics; NaN when they cannot be read.
func controllerManagerRequests(ctx context.Context, env *clustertest.Env) float64 {
	port := env.Cluster.Ports()["kube-controller-manager"]
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		return math.NaN()
	}
	req.Header.Set("Authorization", "Bearer "+env.Config.BearerToken)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the component's self-signed certificate on loopback
	resp, err := client.Do(req)
	if err != nil {
		return math.NaN()
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return math.NaN()
	}
	return sumSeries(string(raw), "rest_client_requests_total")
}

// floorExecutor is the executor label of the floor client's pods.
const floorExecutor = "floor"

// floorRun measures S0, the ceiling: the same pods (task.BuildPod of the
// same quick task, with kubetask's finalizer) sent by a minimal client: no
// client-side rate limit, no informer cache, no store, no state; one plain
// watch of the namespace (client-go's RetryWatcher, which resumes from the
// last resourceVersion) tells it that main ended. 16 goroutines create and
// 16 delete and release. With inFlight > 0 it keeps at most that many pods
// at once, as the executor's Parallelism does: a pod is created only once
// an earlier one is gone.
//
// The minimal S0 (equal false) sends create; once main has terminated,
// attempt.Delete, then the finalizer released with one JSON patch
// (attempt.ReleaseSeen): 3 requests per task. The equal-work S0 sends the
// executor's floor of 4 (docs/costs.md), in its order: the pod created
// gated with the fence's scheduling gate, epoch and nonce annotations, the gate
// removed right after the create returns (attempt.Ungate, by the creating
// goroutine, as the executor's creator does once its store records the
// pod), then the delete and the release.
func floorRun(tb testing.TB, n, inFlight int, equal bool) row {
	tb.Helper()
	env := clustertest.New(tb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := newTracker(func(p *corev1.Pod) string { return p.Labels[task.LabelRun] })
	tr.start(ctx, tb, sameConnection(tb, env), env.Namespace, task.ManagedSelector().String())

	// The executor's client constructor, for its request counter
	// (kubetask_api_requests_total in reg); no rate limit.
	reg := prometheus.NewRegistry()
	client, err := executor.NewClient(env.Config, executor.Unlimited, 0, reg)
	if err != nil {
		tb.Fatal(err)
	}
	requests := func() float64 { return exectest.MetricSum(reg, "kubetask_api_requests_total") }
	pods := client.CoreV1().Pods(env.Namespace)
	selector := task.LabelExecutor + "=" + floorExecutor
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		tb.Fatal(err)
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return pods.Watch(ctx, o)
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	defer w.Stop()

	built := make([]*corev1.Pod, n)
	for i := range built {
		id := fmt.Sprintf("f%05d", i)
		t := quickTask(id)
		t.Namespace = env.Namespace
		t.Default()
		if err := t.Validate(); err != nil {
			tb.Fatal(err)
		}
		ident := task.Identity{Namespace: env.Namespace, Name: id, RunID: id, Executor: floorExecutor}
		if equal {
			ident.Nonce = fmt.Sprintf("n%015d", i) // the executor's pods carry their record's nonce
		}
		if built[i], err = task.BuildPod(t, ident, 0); err != nil {
			tb.Fatal(err)
		}
		if equal {
			p := built[i]
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[task.AnnotationEpoch] = "1"
			p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: task.FenceGate})
		}
	}
	reqs0 := requests()
	m := startMeasure(ctx, env)
	profName := "S0-minimal"
	if equal {
		profName = "S0-equal"
	}
	prof := startProfiles(tb, env, profName)
	defer prof.stop()

	done := make(chan *corev1.Pod, n)
	decided := map[string]time.Time{}
	var mu sync.Mutex
	var slots chan struct{} // a pod takes a slot; its deletion frees it
	if inFlight > 0 {
		slots = make(chan struct{}, inFlight)
	}
	go func() {
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted {
				if slots != nil {
					<-slots
				}
				continue
			}
			if terminated(pod) {
				mu.Lock()
				_, seen := decided[pod.Labels[task.LabelRun]]
				if !seen {
					decided[pod.Labels[task.LabelRun]] = time.Now()
				}
				mu.Unlock()
				if !seen {
					done <- pod
				}
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case p := <-done:
					if err := attempt.Delete(ctx, client, p.Namespace, p.Name); err != nil {
						errs <- err
					}
					if err := attempt.ReleaseSeen(ctx, client, p, false); err != nil {
						errs <- err
					}
				}
			}
		})
	}
	var creators errgroup.Group
	creators.SetLimit(16)
	for _, p := range built {
		creators.Go(func() error {
			if slots != nil {
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			created, err := pods.Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("creating %s: %w", p.Name, err)
			}
			if equal {
				return attempt.Ungate(ctx, client, created)
			}
			return nil
		})
	}
	if err := creators.Wait(); err != nil {
		tb.Fatal(err)
	}
	waitFor(tb, 20*time.Minute, "floor", func() (bool, string) {
		select {
		case err := <-errs:
			tb.Fatal(err)
		default:
		}
		created, deleted, _ := tr.counts()
		return deleted == n, fmt.Sprintf("%s: %d pods created, %d pods gone", time.Since(m.start).Round(time.Second), created, deleted)
	})
	prof.stop()
	prof.savePod(tb, tr.lastPod())
	_, _, lastDelete := tr.counts()
	r := row{name: "S0 minimal", tasks: n, qps: "unlimited", elapsed: lastDelete.Sub(m.start), note: "create, delete, release"}
	if equal {
		r.name, r.note = "S0 equal-work", "gated create, ungate, delete, release"
	}
	if inFlight > 0 && inFlight < n {
		r.name += " at scale"
		r.note += fmt.Sprintf("; at most %d pods at once", inFlight)
	}
	r.clientReq = (requests() - reqs0) / float64(n)
	m.finish(ctx, env, &r)
	cancel()
	wg.Wait()
	mu.Lock()
	tr.mu.Lock()
	r.setLags(lagsOf(decided, tr.terminated))
	tr.mu.Unlock()
	mu.Unlock()
	return r
}

// terminated reports whether pod's main container has terminated.
func terminated(pod *corev1.Pod) bool {
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == "main" && st.State.Terminated != nil {
			return true
		}
	}
	return false
}

// simNodesFor is how many kwok nodes hold n running pods, with room to spare.
func simNodesFor(n int) int {
	return n/localcluster.SimNodePods + 1
}
