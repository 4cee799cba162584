package executor

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// The names of the spans of a task's trace (docs/tracing.md). Every span
// but the task's is a child of the task span, or of an attempt span.
const (
	SpanTask     = "task"    // the task, from its submission to its outcome
	SpanSubmit   = "submit"  // the submission, until the task is stored
	SpanDryRun   = "dry run" // the submission's dry run on the API server
	SpanAttempt  = "attempt" // one attempt, from its start to its recorded outcome
	SpanWaitSlot = "wait for slot"
	SpanGated    = "pod gated"        // pod created, gated by the fence, until ungated
	SpanSchedule = "schedule"         // ungated until bound to a node
	SpanPull     = "pull images"      // bound until the first container starts
	SpanStart    = "start containers" // the first container's start until the main container's
	SpanMain     = "main container"   // the main container's run
	SpanRecord   = "record outcome"   // the main container's end until the outcome is durable
	SpanLogs     = "archive log"      // one container's log capture, until archived
	SpanRelease  = "release pod"      // the outcome until the finalizer is removed
)

// Attributes of kubetask's own, where the semantic conventions have none.
const (
	attrAttempt   = attribute.Key("kubetask.attempt")
	attrReason    = attribute.Key("kubetask.reason")
	attrMessage   = attribute.Key("kubetask.message")
	attrRetryable = attribute.Key("kubetask.retryable")
	attrTerminal  = attribute.Key("kubetask.terminal")
	attrAttempts  = attribute.Key("kubetask.attempts")
	attrExecutor  = attribute.Key("kubetask.executor")
	attrCluster   = attribute.Key("kubetask.cluster")
	attrLimit     = attribute.Key("kubetask.slot.limit")
	attrOrigin    = attribute.Key("kubetask.origin")
	attrGated     = attribute.Key("kubetask.pod.gated")
)

// Tracer makes one trace per task (docs/tracing.md): a task span from the
// submission to the outcome, with a child span for each step. Create it with
// NewTracer and give it to every executor of a process (Config.Tracer); a
// nil *Tracer traces nothing and costs a nil check.
//
// Guarantees: the task span's trace ID and span ID are chosen at
// submission and stored with the task (task.AnnotationTraceparent on the
// stored document), so the spans of every later step, made by whichever
// process syncs the task then, are children of the same task span. Each
// span carries the times of the facts it reports (the record's, the pod's
// status), not the time it is made, and a span ID derived from the task
// span's, the step and the attempt, so that the same step reported twice
// (by two processes) is one span. An attempt's spans are made by the
// process whose write records its outcome, which the store lets only one
// do; the task span with the final outcome.
type Tracer struct {
	tr    trace.Tracer
	mu    sync.Mutex
	tasks map[string]*taskTrace // by task ID: the steps seen in memory
}

// taskTrace is what a Tracer remembers of one task between passes.
type taskTrace struct {
	sc      trace.SpanContext // the task span's
	attempt int               // the attempt the times below are of
	// waitStart, waitWhy: the attempt began waiting for a slot then, for
	// that limit; waitEnd: it stopped waiting (its pod created).
	waitStart, waitEnd time.Time
	waitWhy            string
	ungatedAt          time.Time // the fence's gate removed
	// recordedAt: when this process recorded each attempt's outcome (a
	// release may come after the next attempt began).
	recordedAt map[int]time.Time
}

// NewTracer returns a Tracer that makes its spans with tp's tracer. tp must
// choose span IDs with TraceIDGenerator (the SDK's
// sdktrace.WithIDGenerator(executor.TraceIDGenerator{})): the task span's
// IDs are chosen before it is made.
func NewTracer(tp trace.TracerProvider) *Tracer {
	return &Tracer{tr: tp.Tracer("github.com/kubetask/kubetask/pkg/executor"), tasks: map[string]*taskTrace{}}
}

// TraceIDGenerator chooses the IDs of kubetask's spans: the IDs a span's
// context asks for (the task span's, chosen at submission; a step's, derived
// from it), random ones for any other span. It implements the OpenTelemetry
// SDK's sdktrace.IDGenerator.
type TraceIDGenerator struct{}

type chosenIDsKey struct{}

type chosenIDs struct {
	tid trace.TraceID
	sid trace.SpanID
}

// NewIDs returns the IDs ctx asks for, else random ones.
func (TraceIDGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if c, ok := ctx.Value(chosenIDsKey{}).(chosenIDs); ok && c.tid.IsValid() && c.sid.IsValid() {
		return c.tid, c.sid
	}
	var tid trace.TraceID
	for !tid.IsValid() {
		_, _ = rand.Read(tid[:]) // never fails (crypto/rand)
	}
	return tid, randomSpanID()
}

// NewSpanID returns the span ID ctx asks for in trace tid, else a random one.
func (TraceIDGenerator) NewSpanID(ctx context.Context, tid trace.TraceID) trace.SpanID {
	if c, ok := ctx.Value(chosenIDsKey{}).(chosenIDs); ok && c.tid == tid && c.sid.IsValid() {
		return c.sid
	}
	return randomSpanID()
}

func randomSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		_, _ = rand.Read(sid[:]) // never fails (crypto/rand)
	}
	return sid
}

// stepID is the span ID of step name of attempt n (-1: of the task) of the
// task whose span is task: the same on every process.
func stepID(task trace.SpanID, name string, n int) trace.SpanID {
	h := fnv.New64a()
	_, _ = h.Write(task[:])
	_, _ = h.Write([]byte(name))
	_, _ = h.Write([]byte(strconv.Itoa(n)))
	var sid trace.SpanID
	binary.BigEndian.PutUint64(sid[:], h.Sum64())
	if !sid.IsValid() {
		sid[7] = 1
	}
	return sid
}

// FormatTraceparent is sc as a W3C traceparent header value.
func FormatTraceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// ParseTraceparent reads a W3C traceparent (version 00), as a remote span
// context with state ts (a tracestate, "" for none).
func ParseTraceparent(v, ts string) (trace.SpanContext, error) {
	parts := strings.Split(strings.TrimSpace(v), "-")
	if len(parts) < 4 || len(parts[0]) != 2 || parts[0] == "ff" || parts[0] == "00" && len(parts) != 4 {
		return trace.SpanContext{}, fmt.Errorf("traceparent %q: want 00-<32 hex>-<16 hex>-<2 hex>", v)
	}
	tid, err := trace.TraceIDFromHex(parts[1])
	if err != nil {
		return trace.SpanContext{}, fmt.Errorf("traceparent %q: trace ID: %w", v, err)
	}
	sid, err := trace.SpanIDFromHex(parts[2])
	if err != nil {
		return trace.SpanContext{}, fmt.Errorf("traceparent %q: span ID: %w", v, err)
	}
	flags, err := hex.DecodeString(parts[3])
	if err != nil || len(flags) != 1 {
		return trace.SpanContext{}, fmt.Errorf("traceparent %q: bad flags", v)
	}
	cfg := trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]) & trace.FlagsSampled, Remote: true}
	if ts != "" {
		if state, err := trace.ParseTraceState(ts); err == nil {
			cfg.TraceState = state
		}
	}
	return trace.NewSpanContext(cfg), nil
}

// taskSpanContext is the task span's context stored on t, if any.
func taskSpanContext(t *task.Task) (trace.SpanContext, bool) {
	v := t.Annotations[task.AnnotationTraceparent]
	if v == "" {
		return trace.SpanContext{}, false
	}
	sc, err := ParseTraceparent(v, t.Annotations[task.AnnotationTracestate])
	return sc, err == nil
}

// submitNote is what a submission's caller noted of it (BeginSubmit).
type submitNote struct {
	start            time.Time
	dryStart, dryEnd time.Time
	dryErr           error
}

type submitNoteKey struct{}

// BeginSubmit returns ctx noting that a submission began at now, before the
// caller's own checks: the submission span of the task that ctx submits
// starts there. A nil Tracer returns ctx.
func (tr *Tracer) BeginSubmit(ctx context.Context, now time.Time) context.Context {
	if tr == nil {
		return ctx
	}
	return context.WithValue(ctx, submitNoteKey{}, &submitNote{start: now})
}

// NoteDryRun notes on ctx (from BeginSubmit) that the submission's dry run
// ran from start to end and ended with err: a child of the submission span.
func (tr *Tracer) NoteDryRun(ctx context.Context, start, end time.Time, err error) {
	if tr == nil {
		return
	}
	if n, ok := ctx.Value(submitNoteKey{}).(*submitNote); ok {
		n.dryStart, n.dryEnd, n.dryErr = start, end, err
	}
}

// stamp writes the trace context of a new task on t before it is stored:
// a new task span, a child of ctx's span (a traceparent header) or else of
// the traceparent t carries, in a new trace when neither is there; a rerun
// (origin set) links to its origin's task span instead. It returns when the
// submission began. Without tracing (a nil Tracer) it only removes such
// annotations t carries (a rerun's copy of a traced task's), so that no
// task is ever stored with a context the executor did not choose for it.
func (tr *Tracer) stamp(ctx context.Context, t *task.Task, origin string, now time.Time) time.Time {
	if tr == nil {
		if len(t.Annotations) > 0 {
			task.WithoutTraceContext(t)
		}
		return now
	}
	start := now
	if n, ok := ctx.Value(submitNoteKey{}).(*submitNote); ok {
		start = n.start
	}
	carried, _ := taskSpanContext(t)
	task.WithoutTraceContext(t)
	if t.Annotations == nil {
		t.Annotations = map[string]string{}
	}
	parent := trace.SpanContextFromContext(ctx)
	if !parent.IsValid() && origin == "" {
		parent = carried
	}
	if origin != "" && carried.IsValid() {
		t.Annotations[task.AnnotationTraceOrigin] = FormatTraceparent(carried)
	}
	cfg := trace.SpanContextConfig{TraceFlags: trace.FlagsSampled}
	if parent.IsValid() {
		cfg.TraceID, cfg.TraceFlags, cfg.TraceState = parent.TraceID(), parent.TraceFlags(), parent.TraceState()
		t.Annotations[task.AnnotationTraceParentSpan] = parent.SpanID().String()
		if ts := parent.TraceState().String(); ts != "" {
			t.Annotations[task.AnnotationTracestate] = ts
		}
	} else {
		_, _ = rand.Read(cfg.TraceID[:])
	}
	_, _ = rand.Read(cfg.SpanID[:])
	if !cfg.TraceID.IsValid() || !cfg.SpanID.IsValid() {
		cfg.TraceID[15], cfg.SpanID[7] = 1, 1
	}
	t.Annotations[task.AnnotationTraceparent] = FormatTraceparent(trace.NewSpanContext(cfg))
	t.Annotations[task.AnnotationTraceStart] = start.UTC().Format(time.RFC3339Nano)
	return start
}

// submitted makes the submission span (and its dry run's) of the task rec
// just stored, from start to now; runs says the task runs in this process
// (not a RecordOnly executor's), which then remembers its context.
func (tr *Tracer) submitted(ctx context.Context, rec store.Record, t *task.Task, start, now time.Time, runs bool) {
	if tr == nil {
		return
	}
	sc, ok := taskSpanContext(t)
	if !ok {
		return
	}
	if runs {
		tr.note(rec.ID, sc)
	}
	attrs := []attribute.KeyValue{
		semconv.CICDPipelineTaskRunID(rec.ID), semconv.CICDPipelineTaskName(rec.Name),
		semconv.K8SNamespaceName(rec.Namespace), attrExecutor.String(rec.Executor),
	}
	sub := tr.span(sc, stepID(sc.SpanID(), SpanSubmit, -1), SpanSubmit, start, now, attrs, nil, nil)
	if n, ok := ctx.Value(submitNoteKey{}).(*submitNote); ok && !n.dryStart.IsZero() {
		tr.span(sub, stepID(sc.SpanID(), SpanDryRun, -1), SpanDryRun, n.dryStart, n.dryEnd, nil, n.dryErr, nil)
	}
}

// span makes one span, a child of parent, with ID sid, from start to end;
// err, when set, is its error status. It returns the span's context.
func (tr *Tracer) span(parent trace.SpanContext, sid trace.SpanID, name string, start, end time.Time, attrs []attribute.KeyValue, err error, links []trace.Link) trace.SpanContext {
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	ctx = context.WithValue(ctx, chosenIDsKey{}, chosenIDs{tid: parent.TraceID(), sid: sid})
	if end.Before(start) {
		end = start
	}
	_, s := tr.tr.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...), trace.WithLinks(links...))
	if err != nil {
		s.SetStatus(codes.Error, err.Error())
	}
	sc := s.SpanContext()
	s.End(trace.WithTimestamp(end))
	return sc
}

// taskSpan makes the task span with the task's outcome (rec terminal).
func (tr *Tracer) taskSpan(t *task.Task, sc trace.SpanContext, rec store.Record, end time.Time) {
	var parent trace.SpanContext
	if p := t.Annotations[task.AnnotationTraceParentSpan]; p != "" {
		if sid, err := trace.SpanIDFromHex(p); err == nil {
			parent = sc.WithSpanID(sid)
		}
	}
	start := rec.CreatedAt
	if s, err := time.Parse(time.RFC3339Nano, t.Annotations[task.AnnotationTraceStart]); err == nil && s.Before(start) {
		start = s
	}
	attrs := []attribute.KeyValue{
		semconv.CICDPipelineTaskRunID(rec.ID), semconv.CICDPipelineTaskName(rec.Name),
		semconv.K8SNamespaceName(rec.Namespace), runResult(rec.Phase, rec.Reason),
		attrReason.String(rec.Reason), attrAttempts.Int(len(rec.Attempts)), attrExecutor.String(rec.Executor),
	}
	if rec.Cluster != "" {
		attrs = append(attrs, attrCluster.String(rec.Cluster))
	}
	var links []trace.Link
	if rec.Origin != "" {
		attrs = append(attrs, attrOrigin.String(rec.Origin))
		if o, err := ParseTraceparent(t.Annotations[task.AnnotationTraceOrigin], ""); err == nil {
			links = append(links, trace.Link{SpanContext: o, Attributes: []attribute.KeyValue{attrOrigin.String(rec.Origin)}})
		}
	}
	var err error
	if rec.Phase != string(podstate.Succeeded) {
		err = fmt.Errorf("%s: %s", rec.Reason, rec.Message)
	}
	// The task span is the root of kubetask's part: its parent is the
	// caller's span, or none, and its IDs the ones chosen at submission.
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	ctx = context.WithValue(ctx, chosenIDsKey{}, chosenIDs{tid: sc.TraceID(), sid: sc.SpanID()})
	_, s := tr.tr.Start(ctx, SpanTask, trace.WithTimestamp(start), trace.WithAttributes(attrs...), trace.WithLinks(links...), trace.WithSpanKind(trace.SpanKindServer))
	if err != nil {
		s.SetStatus(codes.Error, err.Error())
	}
	s.End(trace.WithTimestamp(end))
}

// runResult is cicd.pipeline.task.run.result for an outcome.
func runResult(phase, reason string) attribute.KeyValue {
	switch {
	case phase == string(podstate.Succeeded):
		return semconv.CICDPipelineTaskRunResultSuccess
	case reason == string(podstate.ReasonCancelled):
		return semconv.CICDPipelineTaskRunResultCancellation
	case strings.Contains(reason, "Timeout") || reason == "DeadlineExceeded":
		return semconv.CICDPipelineTaskRunResultTimeout
	case phase == string(podstate.Failed):
		return semconv.CICDPipelineTaskRunResultFailure
	default:
		return semconv.CICDPipelineTaskRunResultError
	}
}

// note remembers task id's span context; it returns the task's memo. tr.mu
// is not held.
func (tr *Tracer) note(id string, sc trace.SpanContext) *taskTrace {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	m := tr.tasks[id]
	if m == nil || !m.sc.Equal(sc) {
		m = &taskTrace{sc: sc}
		tr.tasks[id] = m
	}
	return m
}

// see notes the trace context of task t (rec) as a sync pass reads it, for
// the steps that have no record at hand (a release, a log archived).
func (tr *Tracer) see(rec store.Record, t *task.Task) {
	if tr == nil {
		return
	}
	if sc, ok := taskSpanContext(t); ok {
		tr.note(rec.ID, sc)
	}
}

// forget drops what tr remembers of task id.
func (tr *Tracer) forget(id string) {
	if tr == nil {
		return
	}
	tr.mu.Lock()
	delete(tr.tasks, id)
	tr.mu.Unlock()
}

// memoOf is task id's memo for attempt n (reset when it was of another),
// nil when the task is not known; tr.mu is held.
func (tr *Tracer) memoOfLocked(id string, n int) *taskTrace {
	m := tr.tasks[id]
	if m != nil && m.attempt != n {
		*m = taskTrace{sc: m.sc, attempt: n, recordedAt: m.recordedAt}
	}
	return m
}

// waiting notes that attempt n of task id waits for a slot from now, for
// the limit why (the first time only).
func (tr *Tracer) waiting(id string, n int, now time.Time, why string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if m := tr.memoOfLocked(id, n); m != nil && m.waitStart.IsZero() {
		m.waitStart, m.waitWhy = now, why
	}
}

// ungated notes that the fence's gate of attempt n's pod was removed now.
func (tr *Tracer) ungated(id string, n int, now time.Time) {
	if tr == nil {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if m := tr.memoOfLocked(id, n); m != nil && m.ungatedAt.IsZero() {
		m.ungatedAt = now
	}
}

// event follows the executor's events: a wait for a slot, its end, a
// release (its span).
func (tr *Tracer) event(ev Event) {
	if tr == nil {
		return
	}
	switch {
	case (ev.Type == EventState || ev.Type == EventSubmitted) && ev.Reason == reasonWaitingForSlot:
		tr.waiting(ev.ID, ev.Attempt, ev.Time, ev.Message)
	case ev.Type == EventPodCreated || ev.Type == EventPodAdopted:
		tr.mu.Lock()
		if m := tr.memoOfLocked(ev.ID, ev.Attempt); m != nil && !m.waitStart.IsZero() && m.waitEnd.IsZero() {
			m.waitEnd = ev.Time
		}
		tr.mu.Unlock()
	case ev.Type == EventPodReleased:
		tr.mu.Lock()
		m := tr.tasks[ev.ID]
		var sc trace.SpanContext
		start := ev.Time
		if m != nil {
			sc = m.sc
			if at, ok := m.recordedAt[ev.Attempt]; ok {
				start = at
				delete(m.recordedAt, ev.Attempt)
			}
		}
		tr.mu.Unlock()
		if !sc.IsValid() {
			return
		}
		att := sc.WithSpanID(stepID(sc.SpanID(), SpanAttempt, ev.Attempt))
		ns, name, _ := strings.Cut(ev.Pod, "/")
		tr.span(att, stepID(sc.SpanID(), SpanRelease, ev.Attempt), SpanRelease, start, ev.Time,
			[]attribute.KeyValue{attrAttempt.Int(ev.Attempt), semconv.K8SNamespaceName(ns), semconv.K8SPodName(name), semconv.K8SPodUID(string(ev.PodUID))}, nil, nil)
	}
}

// logArchived makes the span of container's log capture of attempt n of
// task id, from start to end.
func (tr *Tracer) logArchived(id string, n int, container string, start, end time.Time) {
	if tr == nil {
		return
	}
	tr.mu.Lock()
	var sc trace.SpanContext
	if m := tr.tasks[id]; m != nil {
		sc = m.sc
	}
	tr.mu.Unlock()
	if !sc.IsValid() {
		return
	}
	att := sc.WithSpanID(stepID(sc.SpanID(), SpanAttempt, n))
	tr.span(att, stepID(sc.SpanID(), SpanLogs+"/"+container, n), SpanLogs, start, end,
		[]attribute.KeyValue{attrAttempt.Int(n), semconv.K8SContainerName(container)}, nil, nil)
}

// stampPod gives attempt n's pod of task t the attempt span's context, in
// its main container's environment. Not in an annotation too: every byte
// of a pod is paid by every watcher of pods (the API server, etcd, the
// scheduler, the controllers, the nodes) at each of the pod's writes, and
// the annotation with its managed fields was a large part of what tracing
// added to a pod, for nothing the environment does not give (make
// bench-observe).
func (tr *Tracer) stampPod(t *task.Task, pod *corev1.Pod, n int) {
	if tr == nil {
		return
	}
	sc, ok := taskSpanContext(t)
	if !ok {
		return
	}
	att := sc.WithSpanID(stepID(sc.SpanID(), SpanAttempt, n))
	tp := FormatTraceparent(att)
	ts := sc.TraceState().String()
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.Name != t.Spec.MainContainer {
			continue
		}
		c.Env = append(c.Env, corev1.EnvVar{Name: task.EnvTraceparent, Value: tp})
		if ts != "" {
			c.Env = append(c.Env, corev1.EnvVar{Name: task.EnvTracestate, Value: ts})
		}
	}
}

// recorded makes the spans of attempt n of task t, whose outcome this
// process just recorded in rec at now (the store lets one write do it):
// the attempt span, the pod's steps read from pod (nil: it had none), the
// recording; and the task span when the outcome is the task's.
func (tr *Tracer) recorded(t *task.Task, rec store.Record, n int, pod *corev1.Pod, now time.Time) {
	if tr == nil {
		return
	}
	sc, ok := taskSpanContext(t)
	if !ok {
		return
	}
	out, ok := outcomeOf(rec, n)
	if !ok {
		return
	}
	tr.note(rec.ID, sc)
	tr.mu.Lock()
	m := tr.memoOfLocked(rec.ID, n)
	memo := *m
	if m.recordedAt == nil {
		m.recordedAt = map[int]time.Time{}
	}
	m.recordedAt[n] = now
	tr.mu.Unlock()

	start := rec.CreatedAt
	if s, err := time.Parse(time.RFC3339Nano, t.Annotations[task.AnnotationTraceStart]); err == nil && s.Before(start) {
		start = s
	}
	if prev, ok := outcomeOf(rec, n-1); ok {
		start = prev.ObservedAt
	}
	attrs := []attribute.KeyValue{
		attrAttempt.Int(n), runResult(out.Phase, out.Reason), attrReason.String(out.Reason),
		attrMessage.String(out.Message), attrRetryable.Bool(out.Retryable), attrTerminal.Bool(rec.Terminal && rec.Attempt == n),
		semconv.K8SNamespaceName(rec.Namespace),
	}
	if out.Cluster != "" {
		attrs = append(attrs, attrCluster.String(out.Cluster))
	}
	if out.Pod != "" {
		attrs = append(attrs, semconv.K8SPodName(out.Pod), semconv.K8SPodUID(out.PodUID))
	}
	if pod != nil && pod.Spec.NodeName != "" {
		attrs = append(attrs, semconv.K8SNodeName(pod.Spec.NodeName))
	}
	var err error
	if out.Phase != string(podstate.Succeeded) {
		err = fmt.Errorf("%s: %s", out.Reason, out.Message)
	}
	att := tr.span(sc, stepID(sc.SpanID(), SpanAttempt, n), SpanAttempt, start, now, attrs, err, nil)

	if !memo.waitStart.IsZero() {
		end := memo.waitEnd
		if end.IsZero() && pod != nil {
			end = pod.CreationTimestamp.Time
		}
		if end.IsZero() {
			end = now
		}
		tr.span(att, stepID(sc.SpanID(), SpanWaitSlot, n), SpanWaitSlot, memo.waitStart, end, []attribute.KeyValue{attrLimit.String(memo.waitWhy)}, nil, nil)
	}
	// The outcome's recording follows the last step the pod reached (the
	// main container's end), or the attempt's start when it had no pod.
	decided := start
	for _, s := range podSteps(pod, t.Spec.MainContainer, memo.ungatedAt, start) {
		tr.span(att, stepID(sc.SpanID(), s.name, n), s.name, s.start, s.end, s.attrs, s.err, nil)
		decided = s.end
	}
	recAttrs := []attribute.KeyValue{runResult(out.Phase, out.Reason), attrReason.String(out.Reason)}
	if pod != nil && pod.Status.Reason != "" {
		recAttrs = append(recAttrs, semconv.K8SPodStatusReasonKey.String(pod.Status.Reason))
	}
	if decided.After(now) {
		decided = now
	}
	tr.span(att, stepID(sc.SpanID(), SpanRecord, n), SpanRecord, decided, now, recAttrs, nil, nil)
	if rec.Terminal && rec.Attempt == n {
		tr.taskSpan(t, sc, rec, now)
	}
}

// podStep is one step of a pod, read from its status.
type podStep struct {
	name       string
	start, end time.Time
	attrs      []attribute.KeyValue
	err        error
}

// podSteps are the steps pod went through, in order, each from the end of
// the one before, none before floor (the attempt's start): created (gated
// by the fence until ungatedAt, zero when not known), scheduled, its images
// pulled (until its first container started), its containers started (until
// the main one did), the main container's run. A step the pod did not reach
// is left out, and so are the ones after it. The pod's times have the API's
// precision (a second) and the executor's the clock's: each step ends no
// earlier than it starts, so the chain stays in order.
func podSteps(pod *corev1.Pod, main string, ungatedAt, floor time.Time) []podStep {
	if pod == nil || pod.CreationTimestamp.IsZero() {
		return nil
	}
	var steps []podStep
	cursor := maxTime(pod.CreationTimestamp.Time, floor)
	add := func(name string, end time.Time, attrs []attribute.KeyValue, err error) {
		end = maxTime(end, cursor)
		steps = append(steps, podStep{name: name, start: cursor, end: end, attrs: attrs, err: err})
		cursor = end
	}
	podAttrs := []attribute.KeyValue{semconv.K8SPodName(pod.Name), semconv.K8SNamespaceName(pod.Namespace), attrGated.Bool(pod.Annotations[task.AnnotationEpoch] != "")}
	if pod.UID != "" {
		podAttrs = append(podAttrs, semconv.K8SPodUID(string(pod.UID)))
	}
	add(SpanGated, ungatedAt, podAttrs, nil)
	var scheduled time.Time
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			scheduled = c.LastTransitionTime.Time
		}
	}
	if scheduled.IsZero() {
		return steps
	}
	add(SpanSchedule, scheduled, []attribute.KeyValue{semconv.K8SNodeName(pod.Spec.NodeName)}, nil)
	var first, mainStart time.Time
	var term *corev1.ContainerStateTerminated
	var restarts int32
	all := append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...)
	for _, cs := range all {
		st := podstate.StartedAt(cs.State)
		if cs.LastTerminationState.Terminated != nil && !cs.LastTerminationState.Terminated.StartedAt.IsZero() {
			st = cs.LastTerminationState.Terminated.StartedAt.Time
		}
		if !st.IsZero() && (first.IsZero() || st.Before(first)) {
			first = st
		}
		if cs.Name == main {
			mainStart, restarts = st, cs.RestartCount
			term = cs.State.Terminated
		}
	}
	if first.IsZero() {
		return steps
	}
	add(SpanPull, first, nil, nil)
	if mainStart.IsZero() {
		return steps
	}
	add(SpanStart, mainStart, nil, nil)
	if term == nil {
		return steps
	}
	ma := []attribute.KeyValue{semconv.K8SContainerName(main), semconv.ProcessExitCode(int(term.ExitCode)), semconv.K8SContainerRestartCount(int(restarts))}
	if term.Reason != "" {
		ma = append(ma, semconv.K8SContainerStatusReasonKey.String(term.Reason))
	}
	var err error
	if term.ExitCode != 0 {
		err = fmt.Errorf("exit code %d (%s)", term.ExitCode, term.Reason)
	}
	add(SpanMain, term.FinishedAt.Time, ma, err)
	return steps
}
