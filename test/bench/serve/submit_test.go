package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/bench/benchresult"
	"github.com/kubetask/kubetask/test/exectest"
)

// submitSize is the shape of one submission run.
type submitSize struct {
	tasks, clients int
	// distinct gives every task (and every baseline pod) a spec of its own
	// (an env var with its index), so that nothing the service or the API
	// server derives from a spec can be reused from one task to the next;
	// otherwise all share one spec.
	distinct bool
	// The service's executor flags.
	parallelism int
	qps         float32
	burst       int
	// timeout bounds the wait for every outcome.
	timeout time.Duration
}

// benchSubmitSize is the benchmark's size: 1,000 tasks from 32 clients
// (KUBETASK_BENCH_SUBMIT_TASKS changes the count), every task's pod at once,
// and the executor's client rate limit of test/bench/executor's fast setting.
func benchSubmitSize() submitSize {
	n := envInt("KUBETASK_BENCH_SUBMIT_TASKS", 1000)
	return submitSize{tasks: n, clients: 32, parallelism: n, qps: 200, burst: 400, timeout: 30 * time.Minute}
}

// envInt is the positive integer in the environment variable name, or def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// submitResult is what one submission run measured.
type submitResult struct {
	size submitSize
	// The service: every submission's latency, first submission sent to
	// last answered, first submission sent to last outcome received.
	latencies  []time.Duration
	submitSpan time.Duration
	outcomes   time.Duration
	released   int // pods the service had released at the last outcome
	cpu        string
	// The API server's requests (all clients) during the service's run,
	// and the service's own counters.
	requests        string
	apiRequests     float64 // their total
	executorCalls   float64 // kubetask_api_requests_total
	captureFailures float64 // kubetask_log_capture_failures_total
	// The mean time of each step of a submission in the service
	// (kubetask_submit_step_seconds): the dry run, the store write.
	validateMean, storeMean time.Duration
	// dryRuns, shared and cached count the submissions by where their
	// verdict came from (kubetask_submit_validations_total).
	dryRuns, shared, cached float64
	// The baseline: plain pod creates from as many clients (closed loop),
	// or offered at the same rate (open loop).
	pods podCreateResult
	// rate is the offered rate of the open loop, per second (0: the closed
	// loop); late is how far behind its schedule the latest request was sent.
	rate float64
	late time.Duration
	// validateP99, storeP99 are the 0.99-quantiles of the dry run and the
	// store write, from kubetask_submit_step_seconds's buckets.
	validateP99, storeP99 time.Duration
	// schedP99 is the 0.99-quantile of the time the service's goroutines
	// waited to run (go_sched_latencies_seconds) while the submissions
	// were sent and answered.
	schedP99 time.Duration
	// gcs is the number of the service's garbage collections meanwhile.
	gcs float64
	// peakRSS is the service's VmHWM once every outcome was in, in bytes.
	peakRSS int64
	// serviceCPU, apiserverCPU and etcdCPU are the CPU time of the
	// service, kube-apiserver and etcd from the first submission to the
	// last outcome.
	serviceCPU, apiserverCPU, etcdCPU time.Duration
}

func (r submitResult) submitsPerSecond() float64 {
	return float64(r.size.tasks) / r.submitSpan.Seconds()
}

// openSummary renders the open loop's result for a person.
func (r submitResult) openSummary() string {
	return fmt.Sprintf("open loop, %d requests offered at %.1f/s (%.0f%% of the closed loop's plain pod creates/s), each on its own goroutine, latency from its scheduled send time:\n"+
		"  plain pod creates: achieved %.1f/s, latency p50 %.1f ms p99 %.1f ms (sent at most %.1f ms late; load average %s)\n"+
		"  kubetask serve: achieved %.1f submissions/s, submit latency p50 %.1f ms p99 %.1f ms (sent at most %.1f ms late); every outcome after %.1f s\n"+
		"  in the service: %.0f dry-run validations (mean %.1f ms, p99 %.1f ms), %.0f shared, %.0f cached; store write mean %.1f ms, p99 %.1f ms; goroutines waited to run p99 %.2f ms, %.0f GC cycles; peak RSS %.0f MiB\n"+
		"  submit p99 / pod create p99: %.2fx\n"+
		"  CPU during the service's run: %s",
		r.size.tasks, r.rate, 100*openShare,
		r.pods.perSecond(), ms(percentile(r.pods.latencies, 0.5)), ms(percentile(r.pods.latencies, 0.99)), ms(r.pods.late), r.pods.load,
		r.submitsPerSecond(), ms(percentile(r.latencies, 0.5)), ms(percentile(r.latencies, 0.99)), ms(r.late), r.outcomes.Seconds(),
		r.dryRuns, ms(r.validateMean), ms(r.validateP99), r.shared, r.cached, ms(r.storeMean), ms(r.storeP99), ms(r.schedP99), r.gcs, float64(r.peakRSS)/(1<<20),
		ms(percentile(r.latencies, 0.99))/ms(percentile(r.pods.latencies, 0.99)), r.cpu)
}

func (r submitResult) tasksPerSecond() float64 { return float64(r.size.tasks) / r.outcomes.Seconds() }

// summary renders the result for a person.
func (r submitResult) summary() string {
	return fmt.Sprintf("%d tasks from %d clients (parallelism %d, QPS %g/%d):\n"+
		"  kubetask serve: %.1f submissions/s, submit latency p50 %.1f ms p99 %.1f ms; every outcome after %.1f s: %.1f tasks/s\n"+
		"  in the service: %.0f dry-run validations (mean %.1f ms), %.0f verdicts shared with a concurrent dry run, %.0f cached; store write mean %.1f ms\n"+
		"  plain pod creates: %.1f pods/s, latency p50 %.1f ms p99 %.1f ms\n"+
		"  submissions / pod creates: %.2fx\n"+
		"  pods released by the service at the last outcome: %d of %d\n"+
		"  CPU during the service's run: %s\n"+
		"  API server requests during the service's run: %s\n"+
		"  the executor's API requests: %.0f (%.2f per task); failed log captures: %.0f\n"+
		"  API server requests during the pod creates: %s",
		r.size.tasks, r.size.clients, r.size.parallelism, r.size.qps, r.size.burst,
		r.submitsPerSecond(), ms(percentile(r.latencies, 0.5)), ms(percentile(r.latencies, 0.99)), r.outcomes.Seconds(), r.tasksPerSecond(),
		r.dryRuns, ms(r.validateMean), r.shared, r.cached, ms(r.storeMean),
		r.pods.perSecond(), ms(percentile(r.pods.latencies, 0.5)), ms(percentile(r.pods.latencies, 0.99)),
		r.submitsPerSecond()/r.pods.perSecond(), r.released, r.size.tasks, r.cpu,
		r.requests, r.executorCalls, r.executorCalls/float64(r.size.tasks), r.captureFailures, r.pods.requests)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// openShare is the open loop's offered rate as a share of the closed loop's
// plain pod creates/s (issue 19: submissions at 0.8x the speed of pod
// creation).
const openShare = 0.8

// BenchmarkServeSubmit submits 1,000 tasks to a real `kubetask serve` over
// HTTP from 32 concurrent clients; each task's only container completes
// with 0 on a kwok node as soon as its pod runs. It reports the submission
// rate and latency, and the tasks/s from the first submission to the last
// outcome on the watch stream. The baseline, in the same run, is 1,000
// plain pod creates (the same pod, no kubetask) from 32 clients through
// client-go without a client rate limit: what the API server takes from as
// many clients when nothing stands in between.
//
// Those are closed loops: each client sends its next request when its
// previous one answered, so the mean latency is clients / throughput
// (Little's law) and says little about the latency at a given load. The
// open loop that follows offers as many requests at a fixed rate, openShare
// of the closed loop's pod creates/s, each on its own goroutine: first plain
// pod creates, then submissions to a new service, and reports the latency
// of each at that rate.
//
//	go test ./test/bench/serve -run '^$' -bench BenchmarkServeSubmit -benchtime 1x -timeout 30m
//
// It runs twice, as ServeSubmit/shared (every task the same spec) and
// ServeSubmit/distinct (each task a spec of its own);
// KUBETASK_BENCH_SUBMIT_SPECS=shared or distinct runs one.
//
// With KUBETASK_BENCH_BASELINE_BIN set it compares that binary with the
// one under test instead, in pairs on the same cluster (ab_test.go).
func BenchmarkServeSubmit(b *testing.B) {
	base, head, ab := abBinaries(b)
	var res *benchresult.Run
	if ab {
		res = benchresult.Start(b, "serve-ab", "baseline", base.label, "baseline-bin", base.bin, "pairs", strconv.Itoa(abPairs()))
	} else {
		res = benchresult.Start(b, "serve")
	}
	for _, specs := range []string{"shared", "distinct"} {
		if only := os.Getenv("KUBETASK_BENCH_SUBMIT_SPECS"); only != "" && only != specs {
			continue
		}
		b.Run(specs, func(b *testing.B) {
			sz := benchSubmitSize()
			sz.distinct = specs == "distinct"
			if ab {
				benchServeSubmitAB(b, res, sz, base, head, abPairs())
				return
			}
			benchServeSubmit(b, res, sz)
		})
	}
}

func benchServeSubmit(b *testing.B, res *benchresult.Run, sz submitSize) {
	for range b.N {
		r, open := runServeSubmit(b, sz)
		fmt.Println(r.summary())
		fmt.Println(open.openSummary())
		res.Report(b, r.submitsPerSecond(), "submits/s")
		res.Report(b, ms(percentile(r.latencies, 0.5)), "submit-p50-ms")
		res.Report(b, ms(percentile(r.latencies, 0.99)), "submit-p99-ms")
		res.Report(b, r.tasksPerSecond(), "tasks/s")
		res.Report(b, r.pods.perSecond(), "podcreates/s")
		res.Report(b, ms(percentile(r.pods.latencies, 0.5)), "podcreate-p50-ms")
		res.Report(b, ms(percentile(r.pods.latencies, 0.99)), "podcreate-p99-ms")
		res.Report(b, r.submitsPerSecond()/r.pods.perSecond(), "submits/podcreates")
		res.Report(b, open.rate, "open-offered/s")
		res.Report(b, open.submitsPerSecond(), "open-submits/s")
		res.Report(b, ms(percentile(open.latencies, 0.5)), "open-submit-p50-ms")
		res.Report(b, ms(percentile(open.latencies, 0.99)), "open-submit-p99-ms")
		res.Report(b, open.pods.perSecond(), "open-podcreates/s")
		res.Report(b, ms(percentile(open.pods.latencies, 0.5)), "open-podcreate-p50-ms")
		res.Report(b, ms(percentile(open.pods.latencies, 0.99)), "open-podcreate-p99-ms")
	}
}

// TestServeSubmitTiny runs BenchmarkServeSubmit's code at a tiny size,
// both loops, distinct specs.
func TestServeSubmitTiny(t *testing.T) {
	r, open := runServeSubmit(t, submitSize{tasks: 12, clients: 4, distinct: true, parallelism: 12, qps: 200, burst: 400, timeout: 2 * time.Minute})
	t.Log(r.summary())
	t.Log(open.openSummary())
	if open.rate <= 0 || len(open.latencies) != 12 || len(open.pods.latencies) != 12 {
		t.Errorf("the open loop offered %d submissions and %d pod creates at %.1f/s, want 12 of each at a positive rate",
			len(open.latencies), len(open.pods.latencies), open.rate)
	}
}

// quickTask is a task whose only container completes with 0 on a kwok node
// as soon as its pod runs (test/bench/executor's task).
func quickTask(name string) *task.Task {
	t := exectest.SimTask(name, map[string]string{kwokstages.CompleteAfter: "0s", kwokstages.CompleteCode: "0"})
	t.Spec.Template.Spec.Containers = t.Spec.Template.Spec.Containers[:1] // main only
	return t
}

// submittedTask is task i of a run: quickTask, with a spec of its own when
// distinct.
func submittedTask(i int, distinct bool) *task.Task {
	t := quickTask(fmt.Sprintf("quick-%d", i))
	if distinct {
		main := &t.Spec.Template.Spec.Containers[0]
		main.Env = append(main.Env, corev1.EnvVar{Name: "KUBETASK_BENCH_VARIANT", Value: strconv.Itoa(i)})
	}
	return t
}

// sent is what a load driver measured: each call's latency (by i), the span
// from the first call's start to the last one's end, how late the latest
// call started against its schedule (open loop), and the errors.
type sent struct {
	latencies []time.Duration
	span      time.Duration
	late      time.Duration
	errs      []error
}

// driver calls do(i) for every i in [0, n).
type driver func(n int, do func(i int) error) sent

// closedLoop is a driver of clients goroutines, each calling the next i when
// its call returned.
func closedLoop(clients int) driver {
	return func(n int, do func(i int) error) sent {
		lat, span, errs := concurrently(n, clients, do)
		return sent{latencies: lat, span: span, errs: errs}
	}
}

// openLoop is a driver that offers calls at rate per second (atRate).
func openLoop(rate float64) driver {
	return func(n int, do func(i int) error) sent { return atRate(n, rate, do) }
}

// runServeSubmit runs the closed loop (the baseline, then the service) at
// size sz, then the open loop at openShare of the baseline's rate (plain pod
// creates, then the service), each phase in a namespace of its own and the
// closed loop's service stopped before the open loop starts. It fails tb
// unless every submission is accepted and every task succeeds.
func runServeSubmit(tb testing.TB, sz submitSize) (closed, open submitResult) {
	tb.Helper()
	// The baseline first, in a namespace of its own, its pods gone before
	// the service starts.
	bin := kubetaskBin(tb)
	closed = serveSubmissions(tb, bin, sz, runPodCreates(tb, clustertest.New(tb), sz.tasks, sz.distinct, closedLoop(sz.clients)), closedLoop(sz.clients))
	rate := openShare * closed.pods.perSecond()
	pods := runPodCreates(tb, clustertest.New(tb), sz.tasks, sz.distinct, openLoop(rate))
	open = serveSubmissions(tb, bin, sz, pods, openLoop(rate))
	open.rate = rate
	return closed, open
}

// serveSubmissions starts a service of the kubetask binary bin in a
// namespace of its own, submits sz.tasks tasks through drive, waits for
// every outcome, and stops the service. pods is the baseline the result is
// compared with.
func serveSubmissions(tb testing.TB, bin string, sz submitSize, pods podCreateResult, drive driver) submitResult {
	tb.Helper()
	ctx := context.Background()
	r := submitResult{size: sz, pods: pods}
	env := clustertest.New(tb)
	tb.Cleanup(func() { releaseLeftovers(tb, env) }) // after the service stopped
	// The benchmark's one token stands for many clients: the open loop has
	// more than the per-caller limit (100) in flight whenever the latency
	// passes 100 / rate (a run at a load of 11 had 44 of 500 answered 429).
	// The limit of the whole service (1,000) stays.
	s := startServiceBin(tb, bin, env, nil, "--parallelism", strconv.Itoa(sz.parallelism),
		"--qps", strconv.FormatFloat(float64(sz.qps), 'f', -1, 32), "--burst", strconv.Itoa(sz.burst),
		"--max-requests-per-caller", "-1")
	// The next phase does not share the machine with this service.
	defer s.stop(tb)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	cursor, err := s.cursor(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	w := s.watch(wctx, cursor)

	docs := make([][]byte, sz.tasks)
	for i := range docs {
		if docs[i], err = json.Marshal(submittedTask(i, sz.distinct)); err != nil {
			tb.Fatal(err)
		}
	}
	ids := make([]string, sz.tasks)
	cpu := newCPUMeter(s)
	reqs := apiserverRequests(tb)
	before, err := s.metrics(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	out := drive(sz.tasks, func(i int) error {
		var err error
		ids[i], err = s.submit(ctx, docs[i])
		return err
	})
	r.latencies, r.submitSpan, r.late = out.latencies, out.span, out.late
	if len(out.errs) > 0 {
		tb.Fatalf("%d of %d submissions failed; the first: %v", len(out.errs), sz.tasks, out.errs[0])
	}
	after, err := s.metrics(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	during := since(after, before)
	r.schedP99 = histogramQuantile(during, "go_sched_latencies_seconds", nil, 0.99)
	r.gcs = sum(during, "go_gc_duration_seconds_count", nil)
	if err := w.wait(sz.timeout, "every task's outcome", func(terminal, _ int) bool { return terminal >= sz.tasks }); err != nil {
		tb.Fatal(err)
	}
	last, outcomes := w.last(ids, false)
	r.outcomes = last.Sub(start)
	r.cpu, _ = cpu.report()
	r.serviceCPU, r.apiserverCPU, r.etcdCPU = cpu.of("kubetask serve"), cpu.of("kube-apiserver"), cpu.of("etcd")
	reqsAfter := apiserverRequests(tb)
	r.requests = requestReport(reqs, reqsAfter, 8)
	for k, v := range reqsAfter {
		r.apiRequests += max(v-reqs[k], 0)
	}
	m, err := s.metrics(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if _, r.peakRSS, err = s.memory(); err != nil {
		tb.Fatal(err)
	}
	r.executorCalls = sum(m, "kubetask_api_requests_total", nil)
	r.captureFailures = sum(m, "kubetask_log_capture_failures_total", nil)
	r.validateMean, r.storeMean = stepMean(m, "validate"), stepMean(m, "store")
	r.validateP99, r.storeP99 = stepQuantile(m, "validate", 0.99), stepQuantile(m, "store", 0.99)
	source := func(s string) float64 {
		return sum(m, "kubetask_submit_validations_total", func(l map[string]string) bool { return l["source"] == s })
	}
	r.dryRuns, r.shared, r.cached = source("dry-run"), source("shared"), source("cached")
	if len(outcomes) != sz.tasks {
		tb.Fatalf("%d outcomes of the %d tasks submitted (the watch saw tasks not submitted here)", len(outcomes), sz.tasks)
	}
	for _, o := range outcomes {
		if o.ev.Phase != "Succeeded" {
			tb.Fatalf("task %s: %s/%s %s, want Succeeded", o.ev.TaskID, o.ev.Phase, o.ev.Reason, o.ev.Message)
		}
	}
	_, r.released = w.counts()
	return r
}

// releaseLeftovers removes the finalizers of the pods left in env's
// namespace, so that the namespace can go: a service stops leaving the pods
// it has not released under their finalizer, and it releases a kwok pod only
// once its log capture ends, which takes minutes: kwok nodes serve no logs
// (the API server answers 500 "no preferred addresses found"), so the
// capture gives up only after logcapture.DefaultGiveUpAfter.
func releaseLeftovers(tb testing.TB, env *clustertest.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods := env.Client.CoreV1().Pods(env.Namespace)
	l, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		tb.Errorf("listing the pods left: %v", err)
		return
	}
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	for _, p := range l.Items {
		if len(p.Finalizers) == 0 {
			continue
		}
		if _, err := pods.Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			tb.Errorf("removing the finalizers of pod %s: %v", p.Name, err)
		}
	}
}

// podCreateResult is what the pod create baseline measured.
type podCreateResult struct {
	n         int
	span      time.Duration
	latencies []time.Duration
	late      time.Duration // the open loop's latest send against its schedule
	requests  string        // the API server's, all clients, during the creates
	load      string        // the load average after the creates
}

func (r podCreateResult) perSecond() float64 { return float64(r.n) / r.span.Seconds() }

// runPodCreates creates n pods (submittedTask's pod, no finalizer; each a
// spec of its own when distinct) in env's namespace through drive, from one
// client-go clientset without a client rate limit, then deletes them and
// waits until they are gone.
func runPodCreates(tb testing.TB, env *clustertest.Env, n int, distinct bool, drive driver) podCreateResult {
	tb.Helper()
	ctx := context.Background()
	rc := rest.CopyConfig(env.Config)
	rc.QPS = -1 // no client-side rate limiter
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	pods := client.CoreV1().Pods(env.Namespace)
	reqs := apiserverRequests(tb)
	out := drive(n, func(i int) error {
		tmpl := submittedTask(i, distinct).Spec.Template
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("quick-%d", i), Annotations: tmpl.Annotations}, Spec: tmpl.Spec}
		_, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		return err
	})
	if len(out.errs) > 0 {
		tb.Fatalf("%d of %d pod creates failed; the first: %v", len(out.errs), n, out.errs[0])
	}
	load := loadAvg()
	requests := requestReport(reqs, apiserverRequests(tb), 4)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		tb.Fatalf("deleting the baseline's pods: %v", err)
	}
	poll(tb, 5*time.Minute, "the baseline's pods to be gone", func() bool {
		l, err := pods.List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
	return podCreateResult{n: n, span: out.span, latencies: out.latencies, late: out.late, requests: requests, load: load}
}

// stepMean is the mean of kubetask_submit_step_seconds for step.
func stepMean(m []sample, step string) time.Duration {
	is := func(l map[string]string) bool { return l["step"] == step }
	n := sum(m, "kubetask_submit_step_seconds_count", is)
	if n == 0 {
		return 0
	}
	return time.Duration(sum(m, "kubetask_submit_step_seconds_sum", is) / n * float64(time.Second))
}

// stepQuantile is the q-quantile of kubetask_submit_step_seconds for step.
func stepQuantile(m []sample, step string, q float64) time.Duration {
	return histogramQuantile(m, "kubetask_submit_step_seconds", func(l map[string]string) bool { return l["step"] == step }, q)
}
