package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// JSONExporter sends spans to an OTLP/HTTP receiver as JSON
// (ExportTraceServiceRequest in the protocol's JSON mapping). It
// implements sdktrace.SpanExporter: give it to sdktrace.WithBatcher.
type JSONExporter struct {
	ex     Exporter
	client *http.Client

	mu   sync.Mutex
	done bool
}

var _ sdktrace.SpanExporter = (*JSONExporter)(nil)

// NewJSONExporter returns an exporter that posts to ex.URL with client.
func NewJSONExporter(ex Exporter, client *http.Client) *JSONExporter {
	return &JSONExporter{ex: ex, client: client}
}

// ExportSpans sends spans in one request. An error says the receiver did
// not take them (the batcher logs it and drops them: spans are for people,
// never state).
func (e *JSONExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	done := e.done
	e.mu.Unlock()
	if done || len(spans) == 0 {
		return nil
	}
	body, err := json.Marshal(encodeRequest(spans))
	if err != nil {
		return fmt.Errorf("encoding spans: %w", err)
	}
	if e.ex.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.ex.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.ex.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("exporting spans: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range e.ex.Headers {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return fmt.Errorf("exporting spans: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("exporting spans: %s answered %s: %s", e.ex.URL, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// Shutdown makes later exports do nothing.
func (e *JSONExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	e.done = true
	e.mu.Unlock()
	return nil
}

// The OTLP JSON mapping (opentelemetry-proto, trace/v1 and common/v1):
// IDs in hex, 64-bit integers as decimal strings, enums as numbers.
type (
	otlpRequest struct {
		ResourceSpans []otlpResourceSpans `json:"resourceSpans"`
	}
	otlpResourceSpans struct {
		Resource   otlpResource     `json:"resource"`
		ScopeSpans []otlpScopeSpans `json:"scopeSpans"`
		SchemaURL  string           `json:"schemaUrl,omitempty"`
	}
	otlpResource struct {
		Attributes []otlpKeyValue `json:"attributes"`
	}
	otlpScopeSpans struct {
		Scope     otlpScope  `json:"scope"`
		Spans     []otlpSpan `json:"spans"`
		SchemaURL string     `json:"schemaUrl,omitempty"`
	}
	otlpScope struct {
		Name    string `json:"name"`
		Version string `json:"version,omitempty"`
	}
	otlpSpan struct {
		TraceID      string         `json:"traceId"`
		SpanID       string         `json:"spanId"`
		TraceState   string         `json:"traceState,omitempty"`
		ParentSpanID string         `json:"parentSpanId,omitempty"`
		Name         string         `json:"name"`
		Kind         int            `json:"kind"`
		Start        string         `json:"startTimeUnixNano"`
		End          string         `json:"endTimeUnixNano"`
		Attributes   []otlpKeyValue `json:"attributes,omitempty"`
		Events       []otlpEvent    `json:"events,omitempty"`
		Links        []otlpLink     `json:"links,omitempty"`
		Status       otlpStatus     `json:"status"`
	}
	otlpEvent struct {
		Time       string         `json:"timeUnixNano"`
		Name       string         `json:"name"`
		Attributes []otlpKeyValue `json:"attributes,omitempty"`
	}
	otlpLink struct {
		TraceID    string         `json:"traceId"`
		SpanID     string         `json:"spanId"`
		TraceState string         `json:"traceState,omitempty"`
		Attributes []otlpKeyValue `json:"attributes,omitempty"`
	}
	otlpStatus struct {
		Message string `json:"message,omitempty"`
		Code    int    `json:"code,omitempty"`
	}
	otlpKeyValue struct {
		Key   string       `json:"key"`
		Value otlpAnyValue `json:"value"`
	}
	otlpAnyValue struct {
		String *string    `json:"stringValue,omitempty"`
		Bool   *bool      `json:"boolValue,omitempty"`
		Int    *string    `json:"intValue,omitempty"`
		Double *float64   `json:"doubleValue,omitempty"`
		Array  *otlpArray `json:"arrayValue,omitempty"`
	}
	otlpArray struct {
		Values []otlpAnyValue `json:"values"`
	}
)

// encodeRequest groups spans by resource and scope.
func encodeRequest(spans []sdktrace.ReadOnlySpan) otlpRequest {
	type scopeKey struct {
		res   *sdkresource.Resource
		scope instrumentation.Scope
	}
	var req otlpRequest
	resIdx := map[*sdkresource.Resource]int{}
	scopeIdx := map[scopeKey]int{}
	for _, s := range spans {
		res := s.Resource()
		ri, ok := resIdx[res]
		if !ok {
			ri = len(req.ResourceSpans)
			resIdx[res] = ri
			rs := otlpResourceSpans{Resource: otlpResource{Attributes: keyValues(res.Attributes())}}
			if res != nil {
				rs.SchemaURL = res.SchemaURL()
			}
			req.ResourceSpans = append(req.ResourceSpans, rs)
		}
		sk := scopeKey{res, s.InstrumentationScope()}
		si, ok := scopeIdx[sk]
		if !ok {
			si = len(req.ResourceSpans[ri].ScopeSpans)
			scopeIdx[sk] = si
			req.ResourceSpans[ri].ScopeSpans = append(req.ResourceSpans[ri].ScopeSpans,
				otlpScopeSpans{Scope: otlpScope{Name: sk.scope.Name, Version: sk.scope.Version}, SchemaURL: sk.scope.SchemaURL})
		}
		ss := &req.ResourceSpans[ri].ScopeSpans[si]
		ss.Spans = append(ss.Spans, encodeSpan(s))
	}
	return req
}

func encodeSpan(s sdktrace.ReadOnlySpan) otlpSpan {
	sc := s.SpanContext()
	out := otlpSpan{
		TraceID: sc.TraceID().String(), SpanID: sc.SpanID().String(), TraceState: sc.TraceState().String(),
		Name: s.Name(), Kind: int(s.SpanKind()),
		Start:      strconv.FormatInt(s.StartTime().UnixNano(), 10),
		End:        strconv.FormatInt(s.EndTime().UnixNano(), 10),
		Attributes: keyValues(s.Attributes()),
	}
	if p := s.Parent(); p.SpanID().IsValid() {
		out.ParentSpanID = p.SpanID().String()
	}
	for _, ev := range s.Events() {
		out.Events = append(out.Events, otlpEvent{Time: strconv.FormatInt(ev.Time.UnixNano(), 10), Name: ev.Name, Attributes: keyValues(ev.Attributes)})
	}
	for _, l := range s.Links() {
		out.Links = append(out.Links, otlpLink{TraceID: l.SpanContext.TraceID().String(), SpanID: l.SpanContext.SpanID().String(),
			TraceState: l.SpanContext.TraceState().String(), Attributes: keyValues(l.Attributes)})
	}
	// OTLP's status codes: 0 unset, 1 ok, 2 error (the Go API numbers
	// them otherwise).
	switch st := s.Status(); st.Code {
	case codes.Error:
		out.Status = otlpStatus{Code: 2, Message: st.Description}
	case codes.Ok:
		out.Status = otlpStatus{Code: 1}
	}
	return out
}

func keyValues(attrs []attribute.KeyValue) []otlpKeyValue {
	if len(attrs) == 0 {
		return nil
	}
	out := make([]otlpKeyValue, 0, len(attrs))
	for _, kv := range attrs {
		out = append(out, otlpKeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return out
}

func anyValue(v attribute.Value) otlpAnyValue {
	switch v.Type() {
	case attribute.BOOL:
		b := v.AsBool()
		return otlpAnyValue{Bool: &b}
	case attribute.INT64:
		i := strconv.FormatInt(v.AsInt64(), 10)
		return otlpAnyValue{Int: &i}
	case attribute.FLOAT64:
		f := v.AsFloat64()
		return otlpAnyValue{Double: &f}
	case attribute.BOOLSLICE, attribute.INT64SLICE, attribute.FLOAT64SLICE, attribute.STRINGSLICE:
		var vals []otlpAnyValue
		switch v.Type() {
		case attribute.BOOLSLICE:
			for _, b := range v.AsBoolSlice() {
				vals = append(vals, anyValue(attribute.BoolValue(b)))
			}
		case attribute.INT64SLICE:
			for _, i := range v.AsInt64Slice() {
				vals = append(vals, anyValue(attribute.Int64Value(i)))
			}
		case attribute.FLOAT64SLICE:
			for _, f := range v.AsFloat64Slice() {
				vals = append(vals, anyValue(attribute.Float64Value(f)))
			}
		default:
			for _, s := range v.AsStringSlice() {
				vals = append(vals, anyValue(attribute.StringValue(s)))
			}
		}
		return otlpAnyValue{Array: &otlpArray{Values: vals}}
	default:
		s := v.String()
		return otlpAnyValue{String: &s}
	}
}
