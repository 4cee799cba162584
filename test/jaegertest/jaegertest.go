// Package jaegertest starts a real Jaeger (the pinned all-in-one with
// in-memory storage, from the components cache) for end-to-end tests of
// kubetask's traces, reads a trace back through Jaeger's query API, and
// checks that an attempt's steps are in order.
package jaegertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/components"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// Jaeger is a Jaeger all-in-one (in-memory storage) started by a test.
type Jaeger struct {
	OTLP  string // OTLP/HTTP base URL: the value of OTEL_EXPORTER_OTLP_ENDPOINT
	Query string // query API base URL
}

// freePort is a loopback port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start builds (or takes from the components cache) the pinned Jaeger,
// starts it on free loopback ports with in-memory storage, waits until its
// query API answers, and stops it when the test ends (printing its output
// when the test failed).
func Start(t *testing.T) *Jaeger {
	t.Helper()
	b, err := components.NewBuilder(os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bin, err := b.Ensure(ctx, components.Jaeger)
	if err != nil {
		t.Fatal(err)
	}
	otlp, query, qgrpc := freePort(t), freePort(t), freePort(t)
	cfg := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`, query, qgrpc, otlp)
	path := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	cmd := exec.Command(bin, "--config", path)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("jaeger's output:\n%s", out.String())
		}
	})
	j := &Jaeger{OTLP: fmt.Sprintf("http://127.0.0.1:%d", otlp), Query: fmt.Sprintf("http://127.0.0.1:%d", query)}
	clustertest.Eventually(t, time.Minute, "jaeger to answer", func(ctx context.Context) error {
		select {
		case <-done:
			t.Fatalf("jaeger exited: %v\n%s", cmd.ProcessState, out.String())
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.Query+"/api/services", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /api/services: %s", resp.Status)
		}
		return nil
	})
	return j
}

// KeyValue is a tag of a span or of its process, as Jaeger answers it.
type KeyValue struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

// Span is a span as Jaeger's query API answers it, with the tags of the
// process (the OpenTelemetry resource) that made it.
type Span struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime   int64      `json:"startTime"` // µs
	Duration    int64      `json:"duration"`  // µs
	Tags        []KeyValue `json:"tags"`
	ProcessID   string     `json:"processID"`
	ProcessTags []KeyValue `json:"-"`
	ServiceName string     `json:"-"`
}

// Parent is the ID of the span's parent (its CHILD_OF reference), "" for
// a root.
func (s Span) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// End is when the span ended (µs).
func (s Span) End() int64 { return s.StartTime + s.Duration }

// Tag is the span's attribute k, "" when it has none.
func (s Span) Tag(k string) string { return tag(s.Tags, k) }

// ProcessTag is the attribute k of the resource of the process that made
// the span (service.instance.id, host.name, ...), "" when it has none.
func (s Span) ProcessTag(k string) string { return tag(s.ProcessTags, k) }

func tag(kvs []KeyValue, k string) string {
	for _, t := range kvs {
		if t.Key == k {
			return fmt.Sprint(t.Value)
		}
	}
	return ""
}

// get GETs path of Jaeger's query API and returns the body and the status:
// 200, or 404 (its body), any other status an error.
func (j *Jaeger) get(ctx context.Context, path string) ([]byte, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.Query+path, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, 0, err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound {
		return nil, 0, fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return b, resp.StatusCode, nil
}

// Trace reads trace id's spans (none while Jaeger has not got it).
func (j *Jaeger) Trace(ctx context.Context, id string) ([]Span, error) {
	b, status, err := j.get(ctx, "/api/traces/"+id)
	if err != nil || status == http.StatusNotFound {
		return nil, err
	}
	var body struct {
		Data []struct {
			Spans     []Span `json:"spans"`
			Processes map[string]struct {
				ServiceName string     `json:"serviceName"`
				Tags        []KeyValue `json:"tags"`
			} `json:"processes"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, err
	}
	var spans []Span
	for _, d := range body.Data {
		for _, sp := range d.Spans {
			p := d.Processes[sp.ProcessID]
			sp.ServiceName, sp.ProcessTags = p.ServiceName, p.Tags
			spans = append(spans, sp)
		}
	}
	return spans, nil
}

// TraceIDs lists the IDs of the traces with a span of service that
// started since since (at most 1000).
func (j *Jaeger) TraceIDs(ctx context.Context, service string, since time.Time) ([]string, error) {
	q := url.Values{"service": {service}, "start": {strconv.FormatInt(since.UnixMicro(), 10)},
		"end": {strconv.FormatInt(time.Now().Add(time.Minute).UnixMicro(), 10)}, "limit": {"1000"}}
	b, status, err := j.get(ctx, "/api/traces?"+q.Encode())
	if err != nil {
		return nil, err
	}
	if status == http.StatusNotFound {
		return nil, fmt.Errorf("GET /api/traces?%s: 404 Not Found: %s", q.Encode(), b)
	}
	var body struct {
		Data []struct {
			TraceID string `json:"traceID"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, err
	}
	var ids []string
	for _, d := range body.Data {
		if !slices.Contains(ids, d.TraceID) {
			ids = append(ids, d.TraceID)
		}
	}
	return ids, nil
}

// StepsInOrder checks an attempt's step spans against names, the steps in
// the order they happen: each is there, and each starts where the one
// before it ended or later (the first no earlier than the attempt's
// start). The pod's times have a second's precision, so the steps of a fast
// pod last 0 µs. A step named in beside (the log's capture, which follows
// its container from the pod's start) must be there but is not in the
// chain. It returns one error per step out of place or missing.
func StepsInOrder(attempt Span, steps []Span, names []string, beside ...string) []error {
	byName := map[string]Span{}
	for _, sp := range steps {
		byName[sp.OperationName] = sp
	}
	var errs []error
	prevEnd, prevName := attempt.StartTime, "the attempt's start"
	for _, name := range names {
		sp, ok := byName[name]
		if !ok {
			errs = append(errs, fmt.Errorf("no %q span", name))
			continue
		}
		if slices.Contains(beside, name) {
			continue
		}
		if sp.StartTime < prevEnd {
			errs = append(errs, fmt.Errorf("%s starts %d µs before %s ended", name, prevEnd-sp.StartTime, prevName))
		}
		prevEnd, prevName = sp.End(), name
	}
	return errs
}

// syncBuffer is a bytes.Buffer safe for a writer and a concurrent reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
