// Package tracing sets up kubetask serve's OpenTelemetry traces from the
// standard OTEL_* environment variables (docs/tracing.md): an SDK tracer
// provider that chooses span IDs with executor.TraceIDGenerator and sends
// its spans in batches to an OTLP/HTTP receiver, encoded as JSON.
//
// The OpenTelemetry Go exporters are not used: both OTLP exporters link
// gRPC (the HTTP one through the generated collector service package),
// which the kubetask binary keeps out (cmd/kubetask's heavy packages). The
// JSON encoding of OTLP/HTTP is part of the protocol, and every OTLP
// receiver (the Collector, Jaeger, Tempo ...) accepts it.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/kubetask/kubetask/pkg/executor"
)

// The environment variables read here (the SDK reads OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_*
// itself).
const (
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvHeaders        = "OTEL_EXPORTER_OTLP_HEADERS"
	EnvTracesHeaders  = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
	EnvTimeout        = "OTEL_EXPORTER_OTLP_TIMEOUT"
	EnvTracesTimeout  = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
)

// ErrConfig reports an OTEL_* setting kubetask cannot follow.
var ErrConfig = errors.New("tracing configuration")

// Exporter is where and how spans are sent, as the environment says.
type Exporter struct {
	// URL receives the spans (POST, OTLP/HTTP JSON).
	URL string
	// Headers go with every request (OTEL_EXPORTER_OTLP_HEADERS).
	Headers map[string]string
	// Timeout bounds one export. Default 10s.
	Timeout time.Duration
}

// FromEnv reads the exporter's settings with getenv. It returns nil (and no
// error) when tracing is off: OTEL_SDK_DISABLED=true, OTEL_TRACES_EXPORTER
// =none, or no OTLP endpoint set (the default: kubetask sends no spans
// unless told where).
func FromEnv(getenv func(string) string) (*Exporter, error) {
	if strings.EqualFold(getenv(EnvSDKDisabled), "true") {
		return nil, nil
	}
	switch ex := strings.TrimSpace(getenv(EnvTracesExporter)); ex {
	case "", "otlp":
	case "none":
		return nil, nil
	default:
		return nil, fmt.Errorf("%w: %s=%s: kubetask exports traces with otlp only (or none)", ErrConfig, EnvTracesExporter, ex)
	}
	target := strings.TrimSpace(getenv(EnvTracesEndpoint))
	if target == "" {
		base := strings.TrimSpace(getenv(EnvEndpoint))
		if base == "" {
			return nil, nil
		}
		target = strings.TrimSuffix(base, "/") + "/v1/traces"
	}
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: OTLP traces endpoint %q: want an http:// or https:// URL", ErrConfig, target)
	}
	proto := first(getenv(EnvTracesProtocol), getenv(EnvProtocol))
	if proto != "" && proto != "http/json" {
		return nil, fmt.Errorf("%w: OTLP protocol %q: kubetask sends http/json only (set %s=http/json; every OTLP/HTTP receiver accepts it on the same port as http/protobuf)", ErrConfig, proto, EnvProtocol)
	}
	ex := &Exporter{URL: target, Timeout: 10 * time.Second, Headers: map[string]string{}}
	for _, name := range []string{EnvHeaders, EnvTracesHeaders} { // the traces' own win
		for _, kv := range strings.Split(getenv(name), ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) == "" {
				continue
			}
			if dv, err := url.QueryUnescape(strings.TrimSpace(v)); err == nil {
				v = dv
			}
			ex.Headers[strings.TrimSpace(k)] = v
		}
	}
	if ms := first(getenv(EnvTracesTimeout), getenv(EnvTimeout)); ms != "" {
		n, err := strconv.Atoi(ms)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: OTLP timeout %q: want milliseconds", ErrConfig, ms)
		}
		if n > 0 {
			ex.Timeout = time.Duration(n) * time.Millisecond
		}
	}
	return ex, nil
}

func first(vs ...string) string {
	for _, v := range vs {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

// Setup returns the executor.Tracer of process instance (the default
// service.instance.id: the replica's ID, so that a trace says which replica
// made each span) of service (the default service.name) at version, and the
// function that flushes and stops it, from the environment (FromEnv);
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the defaults.
// When tracing is off it returns a nil Tracer, which the executor and the
// server take as "no tracing", and a shutdown that does nothing.
func Setup(ctx context.Context, getenv func(string) string, service, version, instance string) (*executor.Tracer, func(context.Context) error, error) {
	ex, err := FromEnv(getenv)
	if err != nil || ex == nil {
		return nil, func(context.Context) error { return nil }, err
	}
	res, err := newResource(ctx, service, version, instance)
	if err != nil {
		return nil, nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithIDGenerator(executor.TraceIDGenerator{}),
		sdktrace.WithBatcher(NewJSONExporter(*ex, http.DefaultClient)))
	return executor.NewTracer(tp), tp.Shutdown, nil
}

// newResource describes the process: service, version and instance (left
// out when ""), then what OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
// say (they win), the SDK and the host.
func newResource(ctx context.Context, service, version, instance string) (*sdkresource.Resource, error) {
	attrs := []attribute.KeyValue{semconv.ServiceName(service), semconv.ServiceVersion(version)}
	if instance != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(instance))
	}
	res, err := sdkresource.New(ctx, sdkresource.WithAttributes(attrs...),
		sdkresource.WithFromEnv(), sdkresource.WithTelemetrySDK(), sdkresource.WithHost())
	if err != nil && res == nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	return res, nil
}
