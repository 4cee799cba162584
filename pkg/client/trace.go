package client

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/trace"
)

// injectTraceContext sends ctx's span, when it has a valid one, as the W3C
// traceparent (and tracestate) headers: a task submitted with a context in
// which the caller's span is current continues the caller's trace
// (docs/tracing.md). A header the caller set itself is kept.
func injectTraceContext(ctx context.Context, h http.Header) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || h.Get("traceparent") != "" {
		return
	}
	h.Set("traceparent", "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-"+sc.TraceFlags().String())
	if ts := sc.TraceState().String(); ts != "" {
		h.Set("tracestate", ts)
	}
}
