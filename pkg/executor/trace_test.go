package executor

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/task"
)

// newTraced is a fixture whose executor traces into an in-memory recorder.
func newTraced(t *testing.T, mod func(*Config)) (*fx, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithIDGenerator(TraceIDGenerator{}))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	f := newFx(t, func(c *Config) {
		c.Tracer = NewTracer(tp)
		if mod != nil {
			mod(c)
		}
	})
	return f, rec
}

// storedTask is task id as the store has it.
func (f *fx) storedTask(id string) *task.Task {
	f.t.Helper()
	var t task.Task
	if err := json.Unmarshal(f.record(id).Task, &t); err != nil {
		f.t.Fatal(err)
	}
	return &t
}

// spanNames are the names of spans, in the order they ended.
func spanNames(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

func attrOf(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// TestTraceOfATaskWithARetry: a task whose first attempt fails and is
// retried gives one trace: the task span (with the IDs stored on the task
// at submission), the submission, one attempt span per attempt with the
// pod's steps under it in order, each with the times of the pod's facts,
// and nothing again on a later pass.
func TestTraceOfATaskWithARetry(t *testing.T) {
	f, sr := newTraced(t, nil)
	f.submit("a", newTask(retryOn("ExitCode")))
	stored := f.storedTask("a")
	taskSC, err := ParseTraceparent(stored.Annotations[task.AnnotationTraceparent], "")
	if err != nil {
		t.Fatalf("stored task's traceparent: %v", err)
	}
	if got := spanNames(sr.Ended()); !slices.Equal(got, []string{SpanSubmit}) {
		t.Fatalf("spans after the submission %q, want [submit]", got)
	}

	w0 := mainExited(1)
	pod0 := f.podOf("a", 0, w0)
	f.both(pod0)
	f.clk.SetTime(w0.Now().Add(time.Second))
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	w1 := podtest.MakePod("p", "ns").After(2 * time.Minute).Scheduled().After(time.Second).
		Main("main").Running().Sidecar("envoy").Running().After(time.Minute).On("main").Terminated(0)
	pod1 := f.podOf("a", 1, w1)
	pod1.CreationTimestamp.Time = w0.Now().Add(30 * time.Second)
	f.both(pod1)
	f.clk.SetTime(w1.Now().Add(time.Second))
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	if f.record("a").Terminal != true {
		t.Fatalf("task not finished: %s", f.state("a"))
	}
	before := len(sr.Ended())
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}

	spans := sr.Ended()
	if len(spans) != before {
		t.Errorf("a later pass made %d more spans", len(spans)-before)
	}
	want := []string{SpanSubmit,
		SpanAttempt, SpanGated, SpanSchedule, SpanPull, SpanStart, SpanMain, SpanRecord,
		SpanAttempt, SpanGated, SpanSchedule, SpanPull, SpanStart, SpanMain, SpanRecord,
		SpanTask}
	if diff := cmp.Diff(want, spanNames(spans)); diff != "" {
		t.Fatalf("spans (-want +got):\n%s", diff)
	}
	attempts := map[trace.SpanID]int64{}
	var taskSpan sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().TraceID() != taskSC.TraceID() {
			t.Errorf("span %s in trace %s, want the stored %s", s.Name(), s.SpanContext().TraceID(), taskSC.TraceID())
		}
		switch s.Name() {
		case SpanTask:
			taskSpan = s
		case SpanAttempt:
			attempts[s.SpanContext().SpanID()] = attrOf(s, attrAttempt).AsInt64()
		}
	}
	if taskSpan.SpanContext().SpanID() != taskSC.SpanID() || taskSpan.Parent().IsValid() {
		t.Errorf("task span %s (parent %s), want the stored %s with no parent", taskSpan.SpanContext().SpanID(), taskSpan.Parent().SpanID(), taskSC.SpanID())
	}
	if got := attrOf(taskSpan, "cicd.pipeline.task.run.result").AsString(); got != "success" {
		t.Errorf("task span's result %q, want success", got)
	}
	if got := attrOf(taskSpan, attrAttempts).AsInt64(); got != 2 {
		t.Errorf("task span's attempts %d, want 2", got)
	}
	var seenAttempt int64 = -1
	var last time.Time
	for _, s := range spans {
		switch s.Name() {
		case SpanSubmit, SpanAttempt:
			if s.Parent().SpanID() != taskSC.SpanID() {
				t.Errorf("%s's parent %s, want the task span", s.Name(), s.Parent().SpanID())
			}
			if s.Name() == SpanAttempt {
				seenAttempt, last = attempts[s.SpanContext().SpanID()], time.Time{}
			}
		case SpanTask:
		default:
			n, ok := attempts[s.Parent().SpanID()]
			if !ok || n != seenAttempt {
				t.Errorf("%s's parent is attempt %d (%v), want attempt %d", s.Name(), n, ok, seenAttempt)
			}
			if s.StartTime().Before(last) {
				t.Errorf("%s of attempt %d starts at %s, before the step before ended (%s)", s.Name(), n, s.StartTime(), last)
			}
			last = s.EndTime()
		}
	}
	main0 := spans[6]
	if !main0.StartTime().Equal(w0.Now().Add(-time.Minute)) || !main0.EndTime().Equal(w0.Now()) {
		t.Errorf("attempt 0's main container span %s to %s, want the container's %s to %s", main0.StartTime(), main0.EndTime(), w0.Now().Add(-time.Minute), w0.Now())
	}
	if got := attrOf(main0, "process.exit.code").AsInt64(); got != 1 {
		t.Errorf("attempt 0's exit code %d, want 1", got)
	}
	if got := attrOf(spans[1], "cicd.pipeline.task.run.result").AsString(); got != "failure" {
		t.Errorf("attempt 0's result %q, want failure", got)
	}
}

// TestTraceContinuesTheCaller: a submission whose context carries a span
// (an incoming traceparent) makes the task span its child, in its trace;
// one whose document carries the traceparent annotation likewise; a rerun
// starts a new trace that links to its origin.
func TestTraceContinuesTheCaller(t *testing.T) {
	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled, Remote: true})
	f, sr := newTraced(t, nil)

	ctx := trace.ContextWithRemoteSpanContext(context.Background(), caller)
	tk := newTask()
	tk.Namespace = "ns"
	if _, err := f.ex.Submit(ctx, "header", tk); err != nil {
		t.Fatal(err)
	}
	carried := newTask(func(t *task.Task) {
		t.Annotations = map[string]string{task.AnnotationTraceparent: FormatTraceparent(caller)}
	})
	f.submit("document", carried)
	origin := f.storedTask("header")
	f.submit("rerun", origin, Origin("header"))

	for _, id := range []string{"header", "document"} {
		stored := f.storedTask(id)
		sc, err := ParseTraceparent(stored.Annotations[task.AnnotationTraceparent], "")
		if err != nil {
			t.Fatal(err)
		}
		if sc.TraceID() != caller.TraceID() || sc.SpanID() == caller.SpanID() {
			t.Errorf("%s: task span %s, want a new span in the caller's trace %s", id, FormatTraceparent(sc), caller.TraceID())
		}
		if got := stored.Annotations[task.AnnotationTraceParentSpan]; got != caller.SpanID().String() {
			t.Errorf("%s: parent span %q, want the caller's %s", id, got, caller.SpanID())
		}
	}
	rerun := f.storedTask("rerun")
	if got, want := rerun.Annotations[task.AnnotationTraceOrigin], origin.Annotations[task.AnnotationTraceparent]; got != want {
		t.Errorf("rerun's origin %q, want the origin's task span %q", got, want)
	}
	sc, _ := ParseTraceparent(rerun.Annotations[task.AnnotationTraceparent], "")
	if sc.TraceID() == caller.TraceID() || rerun.Annotations[task.AnnotationTraceParentSpan] != "" {
		t.Errorf("rerun in trace %s with parent %q, want a trace of its own", sc.TraceID(), rerun.Annotations[task.AnnotationTraceParentSpan])
	}

	// The task span of the rerun links to its origin; the caller's parents its task.
	for _, id := range []string{"header", "rerun"} {
		f.both(f.podOf(id, 0, mainExited(0)))
		if _, _, err := f.sync(id); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range sr.Ended() {
		if s.Name() != SpanTask {
			continue
		}
		switch s.SpanContext().TraceID() {
		case caller.TraceID():
			if s.Parent().SpanID() != caller.SpanID() {
				t.Errorf("the caller's task span has parent %s, want %s", s.Parent().SpanID(), caller.SpanID())
			}
		default:
			if len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID().String() != origin.Annotations[task.AnnotationTraceparent][36:52] {
				t.Errorf("the rerun's task span links %v, want its origin's task span", s.Links())
			}
		}
	}
}

// TestTracePodGetsTheAttemptsContext: the pod the executor creates carries
// its attempt span's traceparent in an annotation and in its main
// container's TRACEPARENT (only there); without a Tracer, neither, and the
// stored task has no trace annotations.
func TestTracePodGetsTheAttemptsContext(t *testing.T) {
	for name, traced := range map[string]bool{"traced": true, "off": false} {
		t.Run(name, func(t *testing.T) {
			var f *fx
			if traced {
				f, _ = newTraced(t, nil)
			} else {
				f = newFx(t, nil)
			}
			f.submit("a", newTask())
			if _, _, err := f.sync("a"); err != nil {
				t.Fatal(err)
			}
			f.drainCreations()
			pods, err := f.client.CoreV1().Pods("ns").List(f.ctx, metav1.ListOptions{})
			if err != nil || len(pods.Items) != 1 {
				t.Fatalf("pods %v, %v; want one", pods, err)
			}
			pod := pods.Items[0]
			stored := f.storedTask("a")
			env := map[string][]string{}
			for _, c := range pod.Spec.Containers {
				for _, e := range c.Env {
					if e.Name == task.EnvTraceparent {
						env[c.Name] = append(env[c.Name], e.Value)
					}
				}
			}
			if !traced {
				if len(env) != 0 || pod.Annotations[task.AnnotationTraceparent] != "" || len(stored.Annotations) != 0 {
					t.Errorf("untraced: env %v, pod annotation %q, task annotations %v; want none", env, pod.Annotations[task.AnnotationTraceparent], stored.Annotations)
				}
				// A document that carries a context (a rerun's copy of a
				// traced task) is stored without it.
				f.submit("copy", newTask(func(t *task.Task) {
					t.Annotations = map[string]string{task.AnnotationTraceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "team": "a"}
				}))
				if got := f.storedTask("copy").Annotations; !cmp.Equal(got, map[string]string{"team": "a"}) {
					t.Errorf("untraced: a copy's annotations %v, want only its own", got)
				}
				return
			}
			sc, _ := ParseTraceparent(stored.Annotations[task.AnnotationTraceparent], "")
			want := FormatTraceparent(sc.WithSpanID(stepID(sc.SpanID(), SpanAttempt, 0)))
			if diff := cmp.Diff(map[string][]string{"main": {want}}, env); diff != "" {
				t.Errorf("TRACEPARENT (-want +got):\n%s", diff)
			}
			if got, ok := pod.Annotations[task.AnnotationTraceparent]; ok {
				t.Errorf("pod annotation %q: the context is in the environment only", got)
			}
		})
	}
}

// TestPodSteps: the steps a pod in a given state has been through, in
// order (the decision the attempt's spans are made from).
func TestPodSteps(t *testing.T) {
	pending := func() *podtest.PodWrapper { return podtest.MakePod("p", "ns").Main("main").Sidecar("envoy") }
	cases := map[string]struct {
		pod  *corev1.Pod
		want []string
	}{
		"no pod":          {nil, nil},
		"created, gated":  {pending().SchedulingGated().Obj(), []string{SpanGated}},
		"scheduled":       {pending().Scheduled().Obj(), []string{SpanGated, SpanSchedule}},
		"sidecar started": {pending().Scheduled().After(time.Second).On("envoy").Running().Obj(), []string{SpanGated, SpanSchedule, SpanPull}},
		"main running":    {running().Obj(), []string{SpanGated, SpanSchedule, SpanPull, SpanStart}},
		"main exited":     {mainExited(3).Obj(), []string{SpanGated, SpanSchedule, SpanPull, SpanStart, SpanMain}},
		"main OOMKilled":  {running().After(time.Minute).On("main").OOMKilled().Obj(), []string{SpanGated, SpanSchedule, SpanPull, SpanStart, SpanMain}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			steps := podSteps(tc.pod, "main", time.Time{}, time.Time{})
			var got []string
			var last time.Time
			for _, s := range steps {
				got = append(got, s.name)
				if s.start.Before(last) || s.end.Before(s.start) {
					t.Errorf("step %s from %s to %s, after one that ended %s", s.name, s.start, s.end, last)
				}
				last = s.end
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			if name == "main OOMKilled" {
				main := steps[len(steps)-1]
				if !slices.Contains(main.attrs, attribute.String("k8s.container.status.reason", "OOMKilled")) || main.err == nil {
					t.Errorf("OOMKilled main container's attributes %v, error %v", main.attrs, main.err)
				}
			}
		})
	}
}

// TestTraceWaitForSlot: an attempt that waited for a parallelism slot has
// a wait span, with the limit that held it, until its pod was created.
func TestTraceWaitForSlot(t *testing.T) {
	f2, sr2 := newTraced(t, func(c *Config) { c.Parallelism = 1 })
	f2.submit("a", newTask())
	if _, _, err := f2.sync("a"); err != nil {
		t.Fatal(err)
	}
	f2.drainCreations()
	f2.submit("b", newTask()) // waits: a holds the only slot
	if got := f2.state("b"); got != "Pending/"+reasonWaitingForSlot {
		t.Fatalf("b is %s, want waiting for a slot", got)
	}
	// a's pod is gone (its slot free): b takes it.
	f2.clk.Step(time.Minute)
	podA := f2.serverPod(f2.podOf("a", 0, created()).Name)
	if _, _, err := f2.sync("a"); err != nil {
		t.Fatal(err)
	}
	f2.cache(podA)
	f2.ex.podEvent(compactPod(podA), false)
	if _, _, err := f2.sync("a"); err != nil {
		t.Fatal(err)
	}
	if err := f2.client.CoreV1().Pods("ns").Delete(f2.ctx, podA.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f2.uncache(podA)
	if _, _, err := f2.sync("b"); err != nil {
		t.Fatal(err)
	}
	f2.drainCreations()
	podB := f2.serverPod(f2.podOf("b", 0, created()).Name)
	if podB == nil {
		t.Fatalf("b's pod was not created; b is %s", f2.state("b"))
	}
	endB := f2.podOf("b", 0, mainExited(0))
	endB.UID, endB.CreationTimestamp = podB.UID, podB.CreationTimestamp
	f2.both(endB)
	f2.clk.Step(time.Minute)
	if _, _, err := f2.sync("b"); err != nil {
		t.Fatal(err)
	}
	var wait sdktrace.ReadOnlySpan
	for _, s := range sr2.Ended() {
		if s.Name() == SpanWaitSlot {
			if wait != nil {
				t.Fatalf("two wait spans")
			}
			wait = s
		}
	}
	if wait == nil {
		t.Fatalf("no wait span among %q", spanNames(sr2.Ended()))
	}
	if got := attrOf(wait, attrLimit).AsString(); got == "" {
		t.Errorf("the wait span names no limit")
	}
	if !wait.StartTime().Equal(podtest.T0) || !wait.EndTime().After(wait.StartTime()) {
		t.Errorf("wait from %s to %s, want from the submission (%s) until the pod was created", wait.StartTime(), wait.EndTime(), podtest.T0)
	}
}

// TestParseTraceparent: which traceparent values a submission's context is
// taken from (W3C Trace Context, version 00; later versions by their first
// four fields).
func TestParseTraceparent(t *testing.T) {
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	cases := map[string]struct {
		in      string
		sampled bool
		ok      bool
	}{
		"sampled":               {"00-" + tid + "-" + sid + "-01", true, true},
		"not sampled":           {"00-" + tid + "-" + sid + "-00", false, true},
		"a later version, more": {"01-" + tid + "-" + sid + "-01-what", true, true},
		"version 00 with more":  {"00-" + tid + "-" + sid + "-01-what", false, false},
		"version ff":            {"ff-" + tid + "-" + sid + "-01", false, false},
		"zero trace ID":         {"00-00000000000000000000000000000000-" + sid + "-01", false, false},
		"zero span ID":          {"00-" + tid + "-0000000000000000-01", false, false},
		"short":                 {"00-" + tid + "-" + sid, false, false},
		"not hex":               {"00-" + tid + "-" + sid + "-zz", false, false},
		"empty":                 {"", false, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			sc, err := ParseTraceparent(tc.in, "")
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok %v", err, tc.ok)
			}
			if tc.ok && (sc.TraceID().String() != tid || sc.SpanID().String() != sid || sc.IsSampled() != tc.sampled || !sc.IsRemote()) {
				t.Errorf("%s: got %s (sampled %v, remote %v)", tc.in, FormatTraceparent(sc), sc.IsSampled(), sc.IsRemote())
			}
		})
	}
}

// TestTraceAcrossAHandOver: a task whose first attempt's outcome one
// process records and whose second another process (the instance handed
// over: a newer term over the same store) records is one trace: both
// processes' spans are children of the task span stored at submission, each
// attempt's spans made once, by the process that recorded its outcome, and
// the task span by the second.
func TestTraceAcrossAHandOver(t *testing.T) {
	a, spansA := newTraced(t, nil)
	a.submit("a", newTask(retryOn("ExitCode")))
	w0 := mainExited(1)
	a.both(a.podOf("a", 0, w0))
	a.clk.SetTime(w0.Now().Add(time.Second))
	if _, _, err := a.sync("a"); err != nil {
		t.Fatal(err)
	}

	b, spansB := newTraced(t, func(c *Config) { c.Store = a.ex.store })
	b.clk.SetTime(a.clk.Now())
	w1 := podtest.MakePod("p", "ns").After(2 * time.Minute).Scheduled().After(time.Second).
		Main("main").Running().Sidecar("envoy").Running().After(time.Minute).On("main").Terminated(0)
	pod1 := b.podOf("a", 1, w1)
	b.both(pod1)
	b.clk.SetTime(w1.Now().Add(time.Second))
	if _, _, err := b.sync("a"); err != nil {
		t.Fatal(err)
	}
	if !b.record("a").Terminal {
		t.Fatalf("task not finished: %s", b.state("a"))
	}
	stored, _ := ParseTraceparent(b.storedTask("a").Annotations[task.AnnotationTraceparent], "")
	attemptOf := func(spans []sdktrace.ReadOnlySpan) map[string][]int64 {
		out := map[string][]int64{}
		for _, s := range spans {
			if s.SpanContext().TraceID() != stored.TraceID() {
				t.Errorf("%s in trace %s, want %s", s.Name(), s.SpanContext().TraceID(), stored.TraceID())
			}
			if s.Name() == SpanAttempt {
				out[s.Name()] = append(out[s.Name()], attrOf(s, attrAttempt).AsInt64())
				if s.Parent().SpanID() != stored.SpanID() {
					t.Errorf("attempt %d's parent %s, want the stored task span %s", attrOf(s, attrAttempt).AsInt64(), s.Parent().SpanID(), stored.SpanID())
				}
			}
			if s.Name() == SpanTask {
				out[s.Name()] = append(out[s.Name()], 0)
				if s.SpanContext().SpanID() != stored.SpanID() {
					t.Errorf("task span %s, want the stored %s", s.SpanContext().SpanID(), stored.SpanID())
				}
			}
		}
		return out
	}
	if diff := cmp.Diff(map[string][]int64{SpanAttempt: {0}}, attemptOf(spansA.Ended())); diff != "" {
		t.Errorf("the first process's attempt and task spans (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string][]int64{SpanAttempt: {1}, SpanTask: {0}}, attemptOf(spansB.Ended())); diff != "" {
		t.Errorf("the second process's attempt and task spans (-want +got):\n%s", diff)
	}
	// Each step's span is a child of its own attempt's span, whichever
	// process made it.
	for _, s := range append(spansA.Ended(), spansB.Ended()...) {
		if s.Name() == SpanMain {
			want := stepID(stored.SpanID(), SpanAttempt, int(attrOf(s, "process.exit.code").AsInt64()^1))
			if s.Parent().SpanID() != want {
				t.Errorf("main container span (exit %d) has parent %s, want its attempt's %s", attrOf(s, "process.exit.code").AsInt64(), s.Parent().SpanID(), want)
			}
		}
	}
}
