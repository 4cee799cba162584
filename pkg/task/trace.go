package task

// The trace context of a task (docs/tracing.md). The executor writes these
// annotations on the task document it stores when tracing is on, so that
// every later step of the task, in whichever process, makes its span a
// child of the same task span; a submission may carry AnnotationTraceparent
// itself to continue a caller's trace.
const (
	// AnnotationTraceparent is the W3C traceparent of the task's span:
	// "00-<trace ID>-<span ID>-<flags>". On a stored task it names the
	// task span; on a submitted one (without a traceparent header) it names
	// the caller's span, which the task span continues. Each attempt's pod
	// carries the traceparent of its attempt span in its main container's
	// TRACEPARENT environment variable (not as an annotation).
	AnnotationTraceparent = Prefix + "traceparent"
	// AnnotationTracestate is the W3C tracestate that came with the
	// caller's traceparent, when it had one.
	AnnotationTracestate = Prefix + "tracestate"
	// AnnotationTraceParentSpan is the span ID (16 hex digits) of the
	// caller's span, the task span's parent, when the task continues a
	// caller's trace.
	AnnotationTraceParentSpan = Prefix + "trace-parent-span"
	// AnnotationTraceOrigin is the traceparent of the task span of the task
	// this one reruns: the task span links to it.
	AnnotationTraceOrigin = Prefix + "trace-origin"
	// AnnotationTraceStart is when the task's submission began (RFC 3339,
	// nanoseconds): the start of the task span.
	AnnotationTraceStart = Prefix + "trace-start"
	// EnvTraceparent is the environment variable of the main container of
	// a traced task's pod: the traceparent of the attempt's span, so that
	// the task's own code can make its spans children of it.
	EnvTraceparent = "TRACEPARENT"
	// EnvTracestate carries the tracestate beside EnvTraceparent, when
	// there is one.
	EnvTracestate = "TRACESTATE"
)

// TraceAnnotations are the annotations above: what the executor writes on
// a stored task document, and what a comparison of two submissions of one
// task ignores.
var TraceAnnotations = []string{AnnotationTraceparent, AnnotationTracestate, AnnotationTraceParentSpan, AnnotationTraceOrigin, AnnotationTraceStart}

// WithoutTraceContext removes t's trace annotations (TraceAnnotations), and
// its annotations map when nothing else is left in it.
func WithoutTraceContext(t *Task) {
	for _, k := range TraceAnnotations {
		delete(t.Annotations, k)
	}
	if len(t.Annotations) == 0 {
		t.Annotations = nil
	}
}
