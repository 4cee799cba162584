package replica

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
	"github.com/kubetask/kubetask/test/jaegertest"
)

// TestTraceAcrossAHandOver: a group of two replicas sending spans to a
// real Jaeger. A task submitted with a caller's span to the replica that
// holds the shard fails its first attempt (exit code 1) and is retried
// beside a sidecar; that replica records the first attempt, creates the
// second's pod and is SIGKILLed while it runs; the survivor takes the
// shard over, adopts the pod and records the second attempt and the
// task's outcome. Jaeger has one trace, the caller's: the task span a child
// of the caller's span, the submission (with its dry run) and both attempts
// its children, each attempt's steps under it in order, once each, and
// each span made by the replica that did the work (service.instance.id):
// the submission and the first attempt by the killed one, the second and
// the task span by the survivor.
func TestTraceAcrossAHandOver(t *testing.T) {
	j := jaegertest.Start(t)
	env := clustertest.New(t)
	g := newGroup(t, env, pgtest.Database(t), 1, 6*time.Second)
	// Spans are exported within 100 ms: a SIGKILLed replica loses only
	// what it made in its last 100 ms.
	g.environ = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + j.OTLP, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SERVICE_NAME=kubetask"}
	since := time.Now()
	procs := map[string]*replicaProc{"r0": g.start("r0"), "r1": g.start("r1")}
	_, holders := g.waitBalanced(time.Minute, "r0", "r1")
	first := holders[0]
	second := map[string]string{"r0": "r1", "r1": "r0"}[first]

	// Each attempt's main container exits 1 after 8 s, its sidecar runs
	// until kubetask stops it; one retry after 1 s.
	tk := exectest.SimTask("handover", map[string]string{kwokstages.ExitContainer: "main", kwokstages.ExitCode: "1", kwokstages.ExitAfter: "8s"})
	limit := int32(1)
	tk.Spec.Retries = task.Retries{Limit: &limit, Backoff: "1s", RetryOn: []string{"ExitCode"}}
	doc, err := json.Marshal(tk)
	if err != nil {
		t.Fatal(err)
	}
	callerTrace, _ := trace.TraceIDFromHex("5af7183fb1d4cf5f0a1b2c3d4e5f6071")
	callerSpan, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: callerTrace, SpanID: callerSpan, TraceFlags: trace.FlagsSampled, Remote: true}))
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	submitted, _, err := procs[first].client.Submit(sctx, env.Namespace, doc, client.SubmitOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	id := submitted.ID

	// The killed replica's part is in Jaeger before the kill: the
	// submission, the first attempt's outcome; and the second attempt's
	// pod runs.
	clustertest.Eventually(t, 2*time.Minute, "the submission and the first attempt in Jaeger, the second attempt's pod running", func(ctx context.Context) error {
		spans, err := j.Trace(ctx, callerTrace.String())
		if err != nil {
			return err
		}
		var sub, att0 bool
		for _, sp := range spans {
			sub = sub || sp.OperationName == executor.SpanSubmit
			att0 = att0 || sp.OperationName == executor.SpanAttempt && sp.Tag("kubetask.attempt") == "0"
		}
		if !sub || !att0 {
			return fmt.Errorf("%d spans, submission %v, first attempt %v", len(spans), sub, att0)
		}
		pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: task.LabelRun + "=" + task.RunLabelValue(id) + "," + task.LabelAttempt + "=1"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				return nil
			}
		}
		return fmt.Errorf("%d pods of the second attempt, none running", len(pods.Items))
	})
	killed := time.Now()
	g.stop(first, syscall.SIGKILL)
	g.waitBalanced(time.Minute, second)
	t.Logf("%s, holding the shard, SIGKILLed while the second attempt ran; %s took the shard over %s later",
		first, second, g.acquiredAfter([]int{0}, killed).Round(time.Millisecond))

	var final *api.Task
	clustertest.Eventually(t, 2*time.Minute, "the task's outcome from "+second, func(ctx context.Context) error {
		tk, err := procs[second].client.Get(ctx, id)
		if err != nil {
			return err
		}
		if !tk.Terminal {
			return fmt.Errorf("%s with %d attempts", tk.Phase, len(tk.Attempts))
		}
		final = tk
		return nil
	})
	if final.Phase != "Failed" || final.Reason != "ExitCode" || len(final.Attempts) != 2 {
		t.Fatalf("%s/%s with %d attempts; want Failed/ExitCode with 2", final.Phase, final.Reason, len(final.Attempts))
	}

	// Every span the survivor will make is made once the pods are
	// released; on SIGTERM it sends what it holds before it exits.
	exectest.WaitNoTaskPods(t, env, time.Minute)
	g.stop(second, syscall.SIGTERM)

	perAttempt := []string{executor.SpanGated, executor.SpanSchedule, executor.SpanPull, executor.SpanStart, executor.SpanMain,
		executor.SpanRecord, executor.SpanLogs, executor.SpanRelease}
	want := map[string]int{executor.SpanTask: 1, executor.SpanSubmit: 1, executor.SpanDryRun: 1, executor.SpanAttempt: 2}
	for _, name := range perAttempt {
		want[name] = 2
	}
	var spans []jaegertest.Span
	clustertest.Eventually(t, time.Minute, "the task's whole trace in Jaeger", func(ctx context.Context) error {
		got, err := j.Trace(ctx, callerTrace.String())
		if err != nil {
			return err
		}
		count := map[string]int{}
		for _, sp := range got {
			count[sp.OperationName]++
		}
		for name, n := range want {
			if count[name] < n {
				return fmt.Errorf("%d spans %v so far; want %v", len(got), count, want)
			}
		}
		spans = got
		return nil
	})
	ids, err := j.TraceIDs(context.Background(), "kubetask", since)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != callerTrace.String() {
		t.Errorf("traces of kubetask in Jaeger %v, want one: the caller's %s", ids, callerTrace)
	}

	byID := map[string]jaegertest.Span{}
	count := map[string]int{}
	var taskSpan jaegertest.Span
	attempts := map[string]int{} // attempt span ID -> attempt
	for _, sp := range spans {
		if sp.TraceID != callerTrace.String() {
			t.Errorf("span %s in trace %s, want the caller's", sp.OperationName, sp.TraceID)
		}
		byID[sp.SpanID] = sp
		count[sp.OperationName]++
		switch sp.OperationName {
		case executor.SpanTask:
			taskSpan = sp
		case executor.SpanAttempt:
			n, _ := strconv.Atoi(sp.Tag("kubetask.attempt"))
			attempts[sp.SpanID] = n
		}
	}
	for name, n := range count {
		if n != want[name] {
			t.Errorf("%d spans %q, want %d: each step once per attempt", n, name, want[name])
		}
	}
	if taskSpan.Parent() != callerSpan.String() {
		t.Errorf("the task span's parent %q, want the caller's span %s", taskSpan.Parent(), callerSpan)
	}
	if got := taskSpan.Tag("cicd.pipeline.task.run.id"); got != id {
		t.Errorf("the task span's cicd.pipeline.task.run.id %q, want %s", got, id)
	}
	if got := taskSpan.Tag("cicd.pipeline.task.run.result"); got != "failure" {
		t.Errorf("the task span's result %q, want failure", got)
	}

	// Who made what: the replica that did the work.
	madeBy := func(sp jaegertest.Span, want string) {
		t.Helper()
		if got := sp.ProcessTag("service.instance.id"); got != want {
			t.Errorf("%s (attempt %q) made by %q, want %s", sp.OperationName, sp.Tag("kubetask.attempt"), got, want)
		}
	}
	madeBy(taskSpan, second)
	steps := map[int][]jaegertest.Span{}
	var attemptSpans []jaegertest.Span
	for _, sp := range spans {
		switch sp.OperationName {
		case executor.SpanTask:
		case executor.SpanSubmit, executor.SpanAttempt:
			if sp.Parent() != taskSpan.SpanID {
				t.Errorf("%s's parent %s, want the task span %s", sp.OperationName, sp.Parent(), taskSpan.SpanID)
			}
			if sp.OperationName == executor.SpanSubmit {
				madeBy(sp, first)
			} else {
				attemptSpans = append(attemptSpans, sp)
				madeBy(sp, map[int]string{0: first, 1: second}[attempts[sp.SpanID]])
			}
		case executor.SpanDryRun:
			if byID[sp.Parent()].OperationName != executor.SpanSubmit {
				t.Errorf("the dry run's parent is %q, want the submission", byID[sp.Parent()].OperationName)
			}
			madeBy(sp, first)
		default:
			n, ok := attempts[sp.Parent()]
			if !ok {
				t.Errorf("%s's parent %s is no attempt span", sp.OperationName, sp.Parent())
				continue
			}
			steps[n] = append(steps[n], sp)
		}
	}
	sort.Slice(attemptSpans, func(a, b int) bool { return attemptSpans[a].StartTime < attemptSpans[b].StartTime })
	if len(attemptSpans) != 2 {
		t.Fatalf("%d attempt spans, want 2", len(attemptSpans))
	}
	if attemptSpans[1].StartTime < attemptSpans[0].End() {
		t.Errorf("attempt 1 starts before attempt 0's outcome was recorded")
	}
	// Both end when the final outcome is recorded; Jaeger keeps a start
	// and a duration in whole µs, so the ends may differ by 1 µs.
	if taskSpan.End()+1 < attemptSpans[1].End() {
		t.Errorf("the task span ends %d µs before the last attempt's outcome", attemptSpans[1].End()-taskSpan.End())
	}
	for n, att := range attemptSpans {
		if errs := jaegertest.StepsInOrder(att, steps[n], perAttempt, executor.SpanLogs); len(errs) > 0 {
			for _, err := range errs {
				t.Errorf("attempt %d: %v", n, err)
			}
			for _, sp := range steps[n] {
				t.Logf("attempt %d: %-16s start %d µs, duration %d µs, by %s", n, sp.OperationName, sp.StartTime-taskSpan.StartTime, sp.Duration, sp.ProcessTag("service.instance.id"))
			}
		}
		for _, sp := range steps[n] {
			// The release of the first attempt's pod may fall to either.
			if sp.OperationName != executor.SpanRelease && sp.OperationName != executor.SpanLogs || n == 1 {
				madeBy(sp, map[int]string{0: first, 1: second}[n])
			}
			if sp.OperationName == executor.SpanMain && sp.Tag("process.exit.code") != "1" {
				t.Errorf("attempt %d's main container exit code %q, want 1", n, sp.Tag("process.exit.code"))
			}
		}
	}
}
