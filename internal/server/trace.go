package server

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/propagation"
)

// beginTrace, when the server traces (Config.Tracer), makes a submission
// continue the caller's trace (its W3C traceparent and tracestate
// headers: the task span becomes a child of the caller's span) and notes
// when the submission began, the start of its submission span.
func (s *Server) beginTrace(ctx context.Context) context.Context {
	if s.cfg.Tracer == nil {
		return ctx
	}
	if info := requestFrom(ctx); info != nil && info.req != nil {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(info.req.Header))
	}
	return s.cfg.Tracer.BeginSubmit(ctx, time.Now())
}
