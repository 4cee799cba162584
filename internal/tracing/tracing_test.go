package tracing

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/kubetask/kubetask/pkg/executor"
)

// TestFromEnv: which OTEL_* settings turn tracing on, where the spans go,
// and which settings are refused.
func TestFromEnv(t *testing.T) {
	cases := map[string]struct {
		env     map[string]string
		want    *Exporter
		wantErr bool
	}{
		"nothing set: off":       {env: nil},
		"exporter none: off":     {env: map[string]string{EnvEndpoint: "http://c:4318", EnvTracesExporter: "none"}},
		"SDK disabled: off":      {env: map[string]string{EnvEndpoint: "http://c:4318", EnvSDKDisabled: "true"}},
		"a sampler alone: off":   {env: map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}},
		"base endpoint":          {env: map[string]string{EnvEndpoint: "http://c:4318/"}, want: &Exporter{URL: "http://c:4318/v1/traces", Timeout: 10 * time.Second, Headers: map[string]string{}}},
		"traces endpoint as is":  {env: map[string]string{EnvEndpoint: "http://c:4318", EnvTracesEndpoint: "https://t:443/x"}, want: &Exporter{URL: "https://t:443/x", Timeout: 10 * time.Second, Headers: map[string]string{}}},
		"headers and a timeout":  {env: map[string]string{EnvEndpoint: "http://c:4318", EnvHeaders: "a=1,b=x%20y", EnvTracesHeaders: "a=2", EnvTimeout: "500"}, want: &Exporter{URL: "http://c:4318/v1/traces", Timeout: 500 * time.Millisecond, Headers: map[string]string{"a": "2", "b": "x y"}}},
		"http/json":              {env: map[string]string{EnvEndpoint: "http://c:4318", EnvProtocol: "http/json"}, want: &Exporter{URL: "http://c:4318/v1/traces", Timeout: 10 * time.Second, Headers: map[string]string{}}},
		"grpc: refused":          {env: map[string]string{EnvEndpoint: "http://c:4317", EnvProtocol: "grpc"}, wantErr: true},
		"http/protobuf: refused": {env: map[string]string{EnvEndpoint: "http://c:4318", EnvTracesProtocol: "http/protobuf"}, wantErr: true},
		"another exporter":       {env: map[string]string{EnvEndpoint: "http://c:4318", EnvTracesExporter: "zipkin"}, wantErr: true},
		"not a URL":              {env: map[string]string{EnvEndpoint: "c:4318"}, wantErr: true},
		"bad timeout":            {env: map[string]string{EnvEndpoint: "http://c:4318", EnvTimeout: "5s"}, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := FromEnv(func(k string) string { return tc.env[k] })
			if (err != nil) != tc.wantErr || err != nil && !errors.Is(err, ErrConfig) {
				t.Fatalf("err %v, want an ErrConfig: %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("exporter (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSetupOffCostsNothing: without an endpoint, Setup gives a nil Tracer
// (the executor's "off") and a shutdown that does nothing.
func TestSetupOffCostsNothing(t *testing.T) {
	tr, stop, err := Setup(context.Background(), func(string) string { return "" }, "kubetask", "v0", "")
	if err != nil || tr != nil {
		t.Fatalf("Setup = %v, %v; want nil, nil", tr, err)
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestJSONExporter: spans reach the receiver as OTLP/HTTP JSON: hex IDs,
// the parent, nanosecond times as strings, typed attributes, OTLP's status
// code for an error, links, the resource's service.name, the headers.
func TestJSONExporter(t *testing.T) {
	var (
		mu     sync.Mutex
		bodies [][]byte
		header http.Header
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies, header = append(bodies, b), r.Header.Clone()
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	env := map[string]string{EnvEndpoint: srv.URL, EnvHeaders: "authorization=Bearer%20x", "OTEL_SERVICE_NAME": "svc"}
	tr, stop, err := Setup(context.Background(), func(k string) string { return env[k] }, "kubetask", "v1", "r0")
	if err != nil || tr == nil {
		t.Fatalf("Setup: %v, %v", tr, err)
	}
	_ = tr
	// A span made through a provider like the one Setup builds.
	tp := sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(executor.TraceIDGenerator{}),
		sdktrace.WithSyncer(NewJSONExporter(Exporter{URL: srv.URL + "/v1/traces", Headers: map[string]string{"authorization": "Bearer x"}}, srv.Client())))
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true})
	link := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{3}, SpanID: trace.SpanID{4}})
	start := time.Unix(1700000000, 5)
	_, sp := tp.Tracer("test").Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "step",
		trace.WithTimestamp(start), trace.WithLinks(trace.Link{SpanContext: link}),
		trace.WithAttributes(attribute.String("s", "v"), attribute.Int("i", 7), attribute.Bool("b", true), attribute.StringSlice("l", []string{"x"})))
	sp.SetStatus(codes.Error, "boom")
	sp.End(trace.WithTimestamp(start.Add(time.Second)))
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 {
		t.Fatalf("%d requests, want 1", len(bodies))
	}
	if got := header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q", got)
	}
	if got := header.Get("authorization"); got != "Bearer x" {
		t.Errorf("authorization %q", got)
	}
	var req struct {
		ResourceSpans []struct {
			Resource struct {
				Attributes []map[string]any `json:"attributes"`
			} `json:"resource"`
			ScopeSpans []struct {
				Spans []map[string]any `json:"spans"`
			} `json:"scopeSpans"`
		} `json:"resourceSpans"`
	}
	if err := json.Unmarshal(bodies[0], &req); err != nil {
		t.Fatal(err)
	}
	span := req.ResourceSpans[0].ScopeSpans[0].Spans[0]
	want := map[string]any{
		"traceId": "01000000000000000000000000000000", "parentSpanId": "0200000000000000", "name": "step", "kind": float64(1),
		"startTimeUnixNano": "1700000000000000005", "endTimeUnixNano": "1700000001000000005",
		"status": map[string]any{"code": float64(2), "message": "boom"},
		"attributes": []any{
			map[string]any{"key": "s", "value": map[string]any{"stringValue": "v"}},
			map[string]any{"key": "i", "value": map[string]any{"intValue": "7"}},
			map[string]any{"key": "b", "value": map[string]any{"boolValue": true}},
			map[string]any{"key": "l", "value": map[string]any{"arrayValue": map[string]any{"values": []any{map[string]any{"stringValue": "x"}}}}},
		},
		"links": []any{map[string]any{"traceId": "03000000000000000000000000000000", "spanId": "0400000000000000"}},
	}
	delete(span, "spanId")
	if diff := cmp.Diff(want, span); diff != "" {
		t.Errorf("span (-want +got):\n%s", diff)
	}
}

// TestResourceNamesTheInstance: the process's resource carries the
// replica's ID as service.instance.id (a trace then says which replica made
// each span), none when it has no ID, and OTEL_RESOURCE_ATTRIBUTES wins.
func TestResourceNamesTheInstance(t *testing.T) {
	tests := map[string]struct {
		instance, envAttrs string
		want               string // "" for none
	}{
		"the replica's ID":               {instance: "r0", want: "r0"},
		"none without an ID":             {},
		"OTEL_RESOURCE_ATTRIBUTES wins":  {instance: "r0", envAttrs: "service.instance.id=mine", want: "mine"},
		"other resource attributes kept": {instance: "r1", envAttrs: "deployment.environment.name=ci", want: "r1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", tc.envAttrs)
			t.Setenv("OTEL_SERVICE_NAME", "")
			res, err := newResource(context.Background(), "kubetask", "v1", tc.instance)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := res.Set().Value(semconv.ServiceInstanceIDKey)
			if (tc.want != "") != ok || ok && got.AsString() != tc.want {
				t.Errorf("service.instance.id %q (set: %v), want %q", got.AsString(), ok, tc.want)
			}
			if name, _ := res.Set().Value(semconv.ServiceNameKey); name.AsString() != "kubetask" {
				t.Errorf("service.name %q, want kubetask", name.AsString())
			}
		})
	}
}
