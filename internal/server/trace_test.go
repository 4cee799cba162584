package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// TestSubmitContinuesTheCallersTrace: with tracing on, a submission's
// traceparent header makes the task's trace the caller's (the stored task
// names the caller's span as its task span's parent), the submission span
// is made with its dry run under it, and the same document submitted again
// under the same ID is the same task (200), not a conflict, though the
// stored one carries the trace context.
func TestSubmitContinuesTheCallersTrace(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithIDGenerator(executor.TraceIDGenerator{}))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := executor.NewTracer(tp)
	h := newHarnessWith(t, store.NewMemory(), func(c *executor.Config) { c.Tracer = tracer }, func(c *server.Config) {
		c.Tracer = tracer
		c.ValidateOnServer = true
	})
	const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	hdr := []string{"traceparent", caller, "Idempotency-Key", "traced"}
	first := h.mustSubmit("default", taskDoc("traced"), hdr...)
	rec, err := h.store.Get(context.Background(), first.ID)
	if err != nil {
		t.Fatal(err)
	}
	var stored task.Task
	if err := json.Unmarshal(rec.Task, &stored); err != nil {
		t.Fatal(err)
	}
	tp0 := stored.Annotations[task.AnnotationTraceparent]
	if !strings.HasPrefix(tp0, "00-4bf92f3577b34da6a3ce929d0e0e4736-") || strings.Contains(tp0, "00f067aa0ba902b7") {
		t.Errorf("stored traceparent %q, want a span of its own in the caller's trace", tp0)
	}
	if got := stored.Annotations[task.AnnotationTraceParentSpan]; got != "00f067aa0ba902b7" {
		t.Errorf("stored parent span %q, want the caller's", got)
	}
	var names []string
	for _, s := range sr.Ended() {
		names = append(names, s.Name())
	}
	if strings.Join(names, ",") != executor.SpanDryRun+","+executor.SpanSubmit && strings.Join(names, ",") != executor.SpanSubmit+","+executor.SpanDryRun {
		t.Errorf("spans %q, want the submission and its dry run", names)
	}
	resp, again := h.submit("default", taskDoc("traced"), hdr...)
	if resp.StatusCode != http.StatusOK || again.ID != first.ID {
		t.Errorf("the same document again: %s, task %q; want 200 with %q", resp.Status, again.ID, first.ID)
	}
}
