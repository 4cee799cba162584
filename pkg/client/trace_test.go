package client_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// TestClientSendsTheContextsSpan: a request made with a context whose span
// is valid carries it as traceparent (and its tracestate), so that the
// task continues the caller's trace; without one, no header.
func TestClientSendsTheContextsSpan(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []http.Header
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"version":"v1","goVersion":"go","platform":"p"}`))
	}))
	defer srv.Close()
	c := newClient(t, srv.URL)
	ts, err := trace.ParseTraceState("vendor=x")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, TraceState: ts})
	if _, err := c.Version(trace.ContextWithSpanContext(testContext(t), sc)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Version(testContext(t)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got, want := seen[0].Get("traceparent"), "00-01000000000000000000000000000000-0200000000000000-01"; got != want {
		t.Errorf("traceparent %q, want %q", got, want)
	}
	if got := seen[0].Get("tracestate"); got != "vendor=x" {
		t.Errorf("tracestate %q", got)
	}
	if got := seen[1].Get("traceparent"); got != "" {
		t.Errorf("traceparent %q without a span, want none", got)
	}
}
