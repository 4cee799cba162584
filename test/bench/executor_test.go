package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/internal/localcluster"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// benchTasks is the number of tasks (and Jobs) per run; KUBETASK_BENCH_TASKS
// overrides it for a quick try.
func benchTasks() int {
	if n, err := strconv.Atoi(os.Getenv("KUBETASK_BENCH_TASKS")); err == nil && n > 0 {
		return n
	}
	return 2000
}

// executorSetting is one executor configuration under test.
type executorSetting struct {
	name string
	cfg  executor.Config
}

func settings(n int) []executorSetting {
	base := executor.Config{Parallelism: n, Workers: 16, CreateConcurrency: 8}
	qps := func(q float32, burst int) executor.Config {
		c := base
		c.QPS, c.Burst = q, burst
		return c
	}
	return []executorSetting{
		{"kubetask-qps50", qps(50, 100)}, // the executor's default rate limit
		{"kubetask-qps200", qps(200, 400)},
		{"kubetask-qps1000", qps(1000, 2000)}, // past what this machine's apiserver serves
	}
}

// runResult is what one throughput run measured.
type runResult struct {
	name    string
	n       int
	elapsed time.Duration // first submit/create to last pod gone
	lags    []time.Duration
}

func (r runResult) tasksPerSecond() float64 { return float64(r.n) / r.elapsed.Seconds() }

// BenchmarkExecutor runs 2,000 short tasks on 10 kwok nodes through the
// executor at a couple of client rate limits, then the same work as 2,000
// batch/v1 Jobs through the Kubernetes Job controller, then measures the
// memory of the executor's trimmed pod cache against a plain informer.
// Every pod has one container, "main", that exits 0 as soon as the pod runs.
//
//	go test ./test/bench -run '^$' -bench BenchmarkExecutor -benchtime 1x -timeout 60m
func BenchmarkExecutor(b *testing.B) {
	n := benchTasks()
	ensureSimNodes(b)
	var results []runResult
	for _, s := range settings(n) {
		b.Run(s.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				results = append(results, benchExecutorRun(b, s, n))
			}
		})
	}
	b.Run("job-controller", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			r := benchJobRun(b, n)
			for _, k := range results {
				ratio := k.tasksPerSecond() / r.tasksPerSecond()
				fmt.Printf("  %-28s %6.1f tasks/s = %.2f x the Job controller (%.1f tasks/s)\n", k.name, k.tasksPerSecond(), ratio, r.tasksPerSecond())
				b.ReportMetric(ratio, k.name+"/job-ratio")
			}
		}
	})
	b.Run("memory", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			benchMemory(b, n)
		}
	})
}

func ensureSimNodes(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := clustertest.Cluster()
	if have := len(c.SimNodeNames()); have < benchNodes {
		if err := c.AddSimNodes(ctx, benchNodes-have); err != nil {
			b.Fatalf("adding simulated nodes: %v", err)
		}
	}
}

// quickTask is a task whose only container completes with 0 at once on a
// kwok node: the same pod the Job baseline runs.
func quickTask(name string) *task.Task {
	t := exectest.SimTask(name, map[string]string{kwokstages.CompleteAfter: "0s", kwokstages.CompleteCode: "0"})
	t.Spec.Template.Spec.Containers = t.Spec.Template.Spec.Containers[:1] // main only
	return t
}

// tracker watches a namespace's pods with its own plain informer and notes
// when it first sees each pod's main container terminated, and the deletions.
type tracker struct {
	key func(*corev1.Pod) string

	mu         sync.Mutex
	created    int
	lastCreate time.Time
	terminated map[string]time.Time
	deleted    int
	lastDelete time.Time
}

func newTracker(key func(*corev1.Pod) string) *tracker {
	return &tracker{key: key, terminated: map[string]time.Time{}}
}

func (tr *tracker) observe(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == "main" && st.State.Terminated != nil {
			now := time.Now()
			k := tr.key(pod)
			tr.mu.Lock()
			if _, seen := tr.terminated[k]; !seen {
				tr.terminated[k] = now
			}
			tr.mu.Unlock()
		}
	}
}

// start runs the informer until ctx ends and waits for its first sync.
func (tr *tracker) start(ctx context.Context, b *testing.B, client kubernetes.Interface, ns, selector string) {
	inf := podInformer(client, ns, selector)
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			tr.mu.Lock()
			tr.created++
			tr.lastCreate = time.Now()
			tr.mu.Unlock()
			tr.observe(obj)
		},
		UpdateFunc: func(_, obj any) { tr.observe(obj) },
		DeleteFunc: func(any) {
			tr.mu.Lock()
			tr.deleted++
			tr.lastDelete = time.Now()
			tr.mu.Unlock()
		},
	})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		b.Fatal("tracker informer did not sync")
	}
}

// lastCreateAfter is when the last pod appeared, counted from start.
func (tr *tracker) lastCreateAfter(start time.Time) time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.lastCreate.Sub(start)
}

func (tr *tracker) counts() (created, deleted int, last time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.created, tr.deleted, tr.lastDelete
}

// podInformer is a plain client-go pod informer: no transform, no indexers
// beyond the namespace one.
func podInformer(client kubernetes.Interface, ns, selector string) cache.SharedIndexInformer {
	pods := client.CoreV1().Pods(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			return pods.Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// outcomes collects the executor's events: when each task's attempt outcome
// was recorded, and its terminal events.
type outcomes struct {
	mu       sync.Mutex
	recorded map[string]time.Time
	// delivered is when OnEvent received the AttemptFinished event: the
	// executor emits it right after recording the outcome (the pod is then
	// stopped, released and deleted).
	delivered map[string]time.Time
	terminal  map[string][]executor.Event
	running   map[string]bool
}

func newOutcomes() *outcomes {
	return &outcomes{recorded: map[string]time.Time{}, delivered: map[string]time.Time{}, terminal: map[string][]executor.Event{}, running: map[string]bool{}}
}

func (o *outcomes) add(ev executor.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ev.Type == executor.EventAttemptFinished {
		if _, ok := o.recorded[ev.ID]; !ok {
			o.recorded[ev.ID] = ev.Time // the store's AttemptOutcome.ObservedAt
			o.delivered[ev.ID] = time.Now()
		}
	}
	if ev.Terminal {
		o.terminal[ev.ID] = append(o.terminal[ev.ID], ev)
	}
	if ev.Phase == "Running" {
		o.running[ev.ID] = true
	}
}

func (o *outcomes) counts() (terminal, running int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.terminal), len(o.running)
}

// waitFor polls cond every 200 ms, printing progress every 10 s, and fails
// the benchmark after timeout.
func waitFor(b *testing.B, timeout time.Duration, what string, cond func() (bool, string)) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	nextLog := time.Now().Add(10 * time.Second)
	for {
		ok, progress := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: not done after %s: %s", what, timeout, progress)
		}
		if time.Now().After(nextLog) {
			fmt.Fprintf(os.Stderr, "    ... %s: %s\n", what, progress)
			nextLog = time.Now().Add(10 * time.Second)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// apiserverRequests sums apiserver_request_total over every client, from
// the API server's own metrics.
func apiserverRequests(ctx context.Context, client kubernetes.Interface) float64 {
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0
	}
	sum := 0.0
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

func benchExecutorRun(b *testing.B, s executorSetting, n int) runResult {
	b.StopTimer()
	env := clustertest.New(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := newTracker(func(p *corev1.Pod) string { return p.Labels[task.LabelRun] })
	tr.start(ctx, b, env.Client, env.Namespace, task.ManagedSelector().String())

	reg := prometheus.NewRegistry()
	out := newOutcomes()
	cfg := s.cfg
	cfg.Registerer, cfg.OnEvent, cfg.Store = reg, out.add, store.NewMemory()
	cfg.InstanceID = "bench"
	ex, stop := exectest.StartExecutor(b, env, cfg)
	startReqs := exectest.MetricSum(reg, "kubetask_api_requests_total")
	cluster0 := apiserverRequests(ctx, env.Client)
	cpu0 := sampleCPU(env.Cluster)

	b.StartTimer()
	start := time.Now()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("t%05d", i)
		if _, err := ex.Submit(ctx, id, quickTask(id)); err != nil {
			b.Fatalf("submitting %s: %v", id, err)
		}
	}
	submitted := time.Since(start)
	waitFor(b, 20*time.Minute, s.name, func() (bool, string) {
		created, deleted, _ := tr.counts()
		terminal, _ := out.counts()
		return terminal == n && deleted == n, fmt.Sprintf("%s: %d pods created, %d outcomes, %d pods gone", time.Since(start).Round(time.Second), created, terminal, deleted)
	})
	_, _, lastDelete := tr.counts()
	elapsed := lastDelete.Sub(start)
	b.StopTimer()
	wall := time.Since(start)
	lastCreate := tr.lastCreateAfter(start)
	cpu1 := sampleCPU(env.Cluster)
	reqs := exectest.MetricSum(reg, "kubetask_api_requests_total") - startReqs
	clusterReqs := apiserverRequests(ctx, env.Client) - cluster0
	stop()

	// Exactly one terminal event per task, each Succeeded.
	bad, dup := 0, 0
	out.mu.Lock()
	for id, evs := range out.terminal {
		if len(evs) != 1 {
			dup++
		}
		if evs[0].Phase != "Succeeded" {
			bad++
			if bad <= 5 {
				b.Errorf("%s: %s/%s %s", id, evs[0].Phase, evs[0].Reason, evs[0].Message)
			}
		}
	}
	if dup > 0 {
		b.Errorf("%d tasks with more than one terminal event", dup)
	}
	var lags, delivery []time.Duration
	negative := 0
	tr.mu.Lock()
	for id, at := range out.recorded {
		if seen, ok := tr.terminated[id]; ok {
			lag := at.Sub(seen)
			if lag < 0 {
				negative++
			}
			lags = append(lags, lag)
			delivery = append(delivery, out.delivered[id].Sub(seen))
		}
	}
	tr.mu.Unlock()
	out.mu.Unlock()

	r := runResult{name: s.name, n: n, elapsed: elapsed, lags: lags}
	p50, p99 := percentile(lags, 0.5), percentile(lags, 0.99)
	b.ReportMetric(r.tasksPerSecond(), "tasks/s")
	b.ReportMetric(reqs/float64(n), "api-req/task")
	b.ReportMetric(clusterReqs/float64(n), "cluster-req/task")
	b.ReportMetric(float64(p50.Microseconds())/1000, "lag-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "lag-p99-ms")
	d50, d99 := percentile(delivery, 0.5), percentile(delivery, 0.99)
	b.ReportMetric(float64(d99.Microseconds())/1000, "event-lag-p99-ms")
	c := s.cfg
	fmt.Printf(`
%s: %d tasks on %d kwok nodes (Parallelism %d, Workers %d, CreateConcurrency %d, QPS %.0f, Burst %d)
  end to end (first submit to last pod gone)   %8.1f s   %7.1f tasks/s
  all submitted after                          %8.2f s
  last pod created after                       %8.1f s
  executor API requests per task               %8.2f   (%0.f, kubetask_api_requests_total)
  apiserver requests per task, all clients     %8.2f   (apiserver_request_total)
  lag main terminated -> outcome recorded      p50 %s  p99 %s  max %s  (%d tasks, %d negative)
  lag main terminated -> event delivered       p50 %s  p99 %s  (after the pod is released and deleted)
  outcomes                                     %d terminal, %d not Succeeded, %d duplicated
  CPU from first submit to done (%.1f s):
%s`,
		s.name, n, benchNodes, c.Parallelism, c.Workers, c.CreateConcurrency, c.QPS, c.Burst,
		elapsed.Seconds(), r.tasksPerSecond(), submitted.Seconds(), lastCreate.Seconds(), reqs/float64(n), reqs, clusterReqs/float64(n),
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), percentile(lags, 1).Round(time.Millisecond), len(lags), negative,
		d50.Round(time.Millisecond), d99.Round(time.Millisecond),
		len(out.terminal), bad, dup, wall.Seconds(), cpuReport(cpu0, cpu1, wall))
	b.StartTimer()
	return r
}

// benchJobRun does the same work through the Job controller: n single-pod
// Jobs with ttlSecondsAfterFinished 0, created by 16 concurrent clients, until
// every Job and pod is gone.
func benchJobRun(b *testing.B, n int) runResult {
	b.StopTimer()
	env := clustertest.New(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := newTracker(func(p *corev1.Pod) string { return p.Labels[batchv1.JobNameLabel] })
	tr.start(ctx, b, env.Client, env.Namespace, batchv1.JobNameLabel)

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
		b.Fatal("job informer did not sync")
	}
	cluster0 := apiserverRequests(ctx, env.Client)
	cpu0 := sampleCPU(env.Cluster)

	b.StartTimer()
	start := time.Now()
	names := make(chan string)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				if _, err := jobs.Create(ctx, quickJob(name), metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("creating job %s: %w", name, err)
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		names <- fmt.Sprintf("j%05d", i)
	}
	close(names)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	submitted := time.Since(start)
	waitFor(b, 20*time.Minute, "job-controller", func() (bool, string) {
		created, deleted, _ := tr.counts()
		mu.Lock()
		done, gone := len(completed), jobsGone
		mu.Unlock()
		return gone == n && deleted >= n && created == deleted,
			fmt.Sprintf("%s: %d pods created, %d Jobs complete, %d Jobs gone, %d pods gone", time.Since(start).Round(time.Second), created, done, gone, deleted)
	})
	_, _, lastDelete := tr.counts()
	elapsed := lastDelete.Sub(start)
	b.StopTimer()
	wall := time.Since(start)
	lastCreate := tr.lastCreateAfter(start)
	cpu1 := sampleCPU(env.Cluster)
	clusterReqs := apiserverRequests(ctx, env.Client) - cluster0

	var lags []time.Duration
	mu.Lock()
	tr.mu.Lock()
	for name, at := range completed {
		if seen, ok := tr.terminated[name]; ok {
			lags = append(lags, at.Sub(seen))
		}
	}
	tr.mu.Unlock()
	mu.Unlock()
	r := runResult{name: "job-controller", n: n, elapsed: elapsed, lags: lags}
	p50, p99 := percentile(lags, 0.5), percentile(lags, 0.99)
	b.ReportMetric(r.tasksPerSecond(), "tasks/s")
	b.ReportMetric(clusterReqs/float64(n), "cluster-req/task")
	b.ReportMetric(float64(p50.Microseconds())/1000, "lag-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "lag-p99-ms")
	fmt.Printf(`
job-controller: %d single-pod Jobs (ttlSecondsAfterFinished 0) on %d kwok nodes, created by 16 clients
  end to end (first create to last pod gone)   %8.1f s   %7.1f tasks/s
  all Jobs created after                       %8.2f s
  last pod created after                       %8.1f s
  apiserver requests per task, all clients     %8.2f   (apiserver_request_total)
  lag main terminated -> Job Complete seen     p50 %s  p99 %s  (%d Jobs)
  CPU from first create to done (%.1f s):
%s`,
		n, benchNodes, elapsed.Seconds(), r.tasksPerSecond(), submitted.Seconds(), lastCreate.Seconds(), clusterReqs/float64(n),
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), len(lags), wall.Seconds(), cpuReport(cpu0, cpu1, wall))
	b.StartTimer()
	return r
}

func quickJob(name string) *batchv1.Job {
	zero, one := int32(0), int32(1)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			TTLSecondsAfterFinished: &zero,
			BackoffLimit:            &zero,
			Completions:             &one,
			Parallelism:             &one,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{kwokstages.CompleteAfter: "0s", kwokstages.CompleteCode: "0"}},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					NodeSelector:  localcluster.SimNodeSelector(),
					Tolerations:   []corev1.Toleration{localcluster.SimNodeToleration()},
					Containers:    []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"true"}}},
				},
			},
		},
	}
}

// benchMemory measures what a tracked pod costs in the executor's trimmed
// informer cache, against a plain client-go pod informer over the same pods
// in the same process. The pods are n running tasks with an envoy-like
// sidecar (exectest.SimTask without annotations: they run until deleted).
func benchMemory(b *testing.B, n int) {
	b.StopTimer()
	env := clustertest.New(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := newOutcomes()
	st := store.NewMemory()

	h0 := heapAfterGC()
	ex, stop := exectest.StartExecutor(b, env, executor.Config{InstanceID: "bench", Store: st, OnEvent: out.add, Parallelism: n, Workers: 16, CreateConcurrency: 8, QPS: 200, Burst: 400})
	time.Sleep(time.Second) // let the informer's first LIST settle
	hStarted := heapAfterGC()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("m%05d", i)
		if _, err := ex.Submit(ctx, id, exectest.SimTask(id, nil)); err != nil {
			b.Fatalf("submitting %s: %v", id, err)
		}
	}
	defer exectest.RemoveTaskPods(b, env)
	waitFor(b, 10*time.Minute, "memory: tasks running", func() (bool, string) {
		_, running := out.counts()
		return running == n, fmt.Sprintf("%d of %d running", running, n)
	})
	time.Sleep(2 * time.Second) // let the last updates land
	h1 := heapAfterGC()

	plainCtx, plainCancel := context.WithCancel(ctx)
	plain := podInformer(env.Client, env.Namespace, task.ManagedSelector().String())
	go plain.RunWithContext(plainCtx)
	if !cache.WaitForCacheSync(ctx.Done(), plain.HasSynced) {
		b.Fatal("plain informer did not sync")
	}
	if got := len(plain.GetStore().List()); got != n {
		b.Fatalf("plain informer has %d pods, want %d", got, n)
	}
	h2 := heapAfterGC()
	plainCancel()
	plain = nil

	stop()
	time.Sleep(500 * time.Millisecond)
	h3 := heapAfterGC() // the store's records are still referenced by st
	_, _ = st.Get(ctx, "m00000")

	diff := func(a, b uint64) float64 { return float64(int64(a)-int64(b)) / float64(n) }
	fixed := diff(hStarted, h0) * float64(n) // a started executor with no task
	execTotal := diff(h1, hStarted)          // store record + cached pod + queue, per task
	trimmed := diff(h1, h3) - fixed/float64(n)
	untrimmed := diff(h2, h1)
	b.ReportMetric(trimmed, "B/pod-trimmed")
	b.ReportMetric(untrimmed, "B/pod-untrimmed")
	b.ReportMetric(untrimmed/trimmed, "untrimmed/trimmed")
	b.ReportMetric(execTotal, "B/task-executor")
	fmt.Printf(`
memory: %d running task pods (main + envoy sidecar), heap after GC
  executor, per running task (store + pod cache + queue)   %8.0f B
  executor pod cache, per pod (trimmed informer)           %8.0f B
  plain client-go informer, per pod (untrimmed)            %8.0f B
  untrimmed / trimmed                                      %8.2f x
  (heap: before %d, executor started %d, %d tasks running %d, + plain informer %d, executor stopped %d)
`, n, execTotal, trimmed, untrimmed, untrimmed/trimmed, h0, hStarted, n, h1, h2, h3)
	b.StartTimer()
}
