package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/components"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
)

// jaeger is a Jaeger all-in-one (in-memory storage) started by a test.
type jaeger struct {
	OTLP  string // OTLP/HTTP base URL
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

// startJaeger builds (or takes from the components cache) the pinned
// Jaeger, starts it on free loopback ports with in-memory storage, waits
// until its query API answers, and stops it when the test ends.
func startJaeger(t *testing.T) *jaeger {
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
	dir := t.TempDir()
	path := filepath.Join(dir, "jaeger.yaml")
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
	j := &jaeger{OTLP: fmt.Sprintf("http://127.0.0.1:%d", otlp), Query: fmt.Sprintf("http://127.0.0.1:%d", query)}
	eventually(t, time.Minute, "jaeger to answer", func() bool {
		select {
		case <-done:
			t.Fatalf("jaeger exited: %v\n%s", cmd.ProcessState, out.String())
		default:
		}
		resp, err := http.Get(j.Query + "/api/services")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return j
}

// jaegerSpan is a span as Jaeger's query API answers it.
type jaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime int64 `json:"startTime"` // µs
	Duration  int64 `json:"duration"`  // µs
	Tags      []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
}

func (s jaegerSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

func (s jaegerSpan) tag(k string) string {
	for _, t := range s.Tags {
		if t.Key == k {
			return fmt.Sprint(t.Value)
		}
	}
	return ""
}

// trace reads trace id's spans (none while Jaeger has not got it).
func (j *jaeger) trace(ctx context.Context, id string) ([]jaegerSpan, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.Query+"/api/traces/"+id, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /api/traces/%s: %s: %s", id, resp.Status, b)
	}
	var body struct {
		Data []struct {
			Spans []jaegerSpan `json:"spans"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, err
	}
	var spans []jaegerSpan
	for _, d := range body.Data {
		spans = append(spans, d.Spans...)
	}
	return spans, nil
}

// TestServeTrace: with OTEL_EXPORTER_OTLP_ENDPOINT naming a real OTLP
// receiver (Jaeger), a task submitted with a caller's traceparent, whose
// first attempt fails and is retried, beside a sidecar and with a File
// result, gives one trace in the caller's: the task span a child of the
// caller's span, the submission (with its dry run) and both attempts its
// children, and each attempt's steps under it, in order, once each.
func TestServeTrace(t *testing.T) {
	j := startJaeger(t)
	env := clustertest.New(t)
	s := &service{t: t, process: &process{env: env, stateDir: t.TempDir(), environ: []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + j.OTLP, "OTEL_SERVICE_NAME=kubetask-e2e", "OTEL_BSP_SCHEDULE_DELAY=200"}}}
	s.args = []string{"serve", "--kubeconfig", env.Kubeconfig, "--namespaces", env.Namespace, "-n", env.Namespace,
		"--listen", "127.0.0.1:0", "--instance-id", "serve-" + env.Namespace}
	s.start()
	t.Cleanup(func() { s.stop(syscall.SIGTERM) })

	marker := filepath.Join(t.TempDir(), "tried")
	script := fmt.Sprintf(`if [ -e %[1]s ]; then echo '{"rows": 3}' > /kubetask/result.json; exit 0; fi; touch %[1]s; exit 1`, marker)
	doc := taskDoc("traced", "  retries: {limit: 1, backoff: 1s, retryOn: [ExitCode]}\n  result: {from: File, path: /kubetask/result.json}",
		fmt.Sprintf(`      containers:
        - {name: main, image: busybox, command: [sh, -c, %q]}
        - {name: sidecar, image: busybox, command: [sh, -c, "exec sleep 600"]}`, script))
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, err := http.NewRequest(http.MethodPost, s.URL+api.Prefix+"/namespaces/"+env.Namespace+"/tasks", bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/yaml")
	req.Header.Set("Authorization", "Bearer "+s.Token)
	req.Header.Set("traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("submit: %s\n%s", resp.Status, b)
	}
	var tk api.Task
	if err := json.Unmarshal(b, &tk); err != nil {
		t.Fatal(err)
	}
	tk = s.waitTask(tk.ID, 3*time.Minute, "the task to finish", func(tk api.Task) bool { return tk.Terminal })
	if tk.Phase != "Succeeded" || len(tk.Attempts) != 2 || len(tk.Result) == 0 {
		t.Fatalf("%s/%s with %d attempts and result %q; want Succeeded on the second, with the file's result", tk.Phase, tk.Reason, len(tk.Attempts), tk.Result)
	}

	perAttempt := []string{executor.SpanGated, executor.SpanSchedule, executor.SpanPull, executor.SpanStart, executor.SpanMain,
		executor.SpanRecord, executor.SpanLogs, executor.SpanRelease}
	var spans []jaegerSpan
	clustertest.Eventually(t, time.Minute, "the task's trace in Jaeger", func(ctx context.Context) error {
		got, err := j.trace(ctx, callerTrace)
		if err != nil {
			return err
		}
		count := map[string]int{}
		for _, sp := range got {
			count[sp.OperationName]++
		}
		want := map[string]int{executor.SpanTask: 1, executor.SpanSubmit: 1, executor.SpanDryRun: 1, executor.SpanAttempt: 2}
		for _, name := range perAttempt {
			want[name] = 2
		}
		for name, n := range want {
			if count[name] < n {
				return fmt.Errorf("%d spans %v so far; want %v", len(got), count, want)
			}
		}
		spans = got
		return nil
	})

	byID := map[string]jaegerSpan{}
	count := map[string]int{}
	for _, sp := range spans {
		if sp.TraceID != callerTrace {
			t.Errorf("span %s in trace %s, want the caller's", sp.OperationName, sp.TraceID)
		}
		byID[sp.SpanID] = sp
		count[sp.OperationName]++
	}
	for name, n := range count {
		if n > 2 || n > 1 && !slices.Contains(append(perAttempt, executor.SpanAttempt), name) {
			t.Errorf("%d spans %q: each step once", n, name)
		}
	}
	var taskSpan jaegerSpan
	attempts := map[string]int{} // attempt span ID -> attempt
	for _, sp := range spans {
		switch sp.OperationName {
		case executor.SpanTask:
			taskSpan = sp
		case executor.SpanAttempt:
			n, _ := strconv.Atoi(sp.tag("kubetask.attempt"))
			attempts[sp.SpanID] = n
		}
	}
	if taskSpan.parent() != callerSpan {
		t.Errorf("the task span's parent %q, want the caller's span %s", taskSpan.parent(), callerSpan)
	}
	if got := taskSpan.tag("cicd.pipeline.task.run.id"); got != tk.ID {
		t.Errorf("the task span's cicd.pipeline.task.run.id %q, want %s", got, tk.ID)
	}
	if got := taskSpan.tag("cicd.pipeline.task.run.result"); got != "success" {
		t.Errorf("the task span's result %q, want success", got)
	}
	steps := map[int][]jaegerSpan{}
	var attemptSpans []jaegerSpan
	for _, sp := range spans {
		switch sp.OperationName {
		case executor.SpanTask:
		case executor.SpanSubmit, executor.SpanAttempt:
			if sp.parent() != taskSpan.SpanID {
				t.Errorf("%s's parent %s, want the task span %s", sp.OperationName, sp.parent(), taskSpan.SpanID)
			}
			if sp.OperationName == executor.SpanAttempt {
				attemptSpans = append(attemptSpans, sp)
			}
		case executor.SpanDryRun:
			if byID[sp.parent()].OperationName != executor.SpanSubmit {
				t.Errorf("the dry run's parent is %q, want the submission", byID[sp.parent()].OperationName)
			}
		default:
			n, ok := attempts[sp.parent()]
			if !ok {
				t.Errorf("%s's parent %s is no attempt span", sp.OperationName, sp.parent())
				continue
			}
			steps[n] = append(steps[n], sp)
		}
	}
	sort.Slice(attemptSpans, func(a, b int) bool { return attemptSpans[a].StartTime < attemptSpans[b].StartTime })
	if len(attemptSpans) == 2 && attemptSpans[1].StartTime < attemptSpans[0].StartTime+attemptSpans[0].Duration {
		t.Errorf("attempt 1 starts before attempt 0's outcome was recorded")
	}
	for n := range 2 {
		got := steps[n]
		byName := map[string]jaegerSpan{}
		for _, sp := range got {
			byName[sp.OperationName] = sp
		}
		// In order: each step starts where the one before it ended, or
		// later (the pod's times have a second's precision: steps of a
		// fast pod last 0 µs). The log's capture follows its container
		// from the pod's start, beside the steps.
		prev := attemptSpans[min(n, len(attemptSpans)-1)]
		prevEnd, prevName := prev.StartTime, "the attempt's start"
		for _, name := range perAttempt {
			sp, ok := byName[name]
			if !ok {
				t.Errorf("attempt %d has no %q span", n, name)
				continue
			}
			if name == executor.SpanLogs {
				continue
			}
			if sp.StartTime < prevEnd {
				t.Errorf("attempt %d: %s starts %d µs before %s ended", n, name, prevEnd-sp.StartTime, prevName)
				for _, sp := range got {
					t.Logf("attempt %d: %-16s start %d µs, duration %d µs", n, sp.OperationName, sp.StartTime-taskSpan.StartTime, sp.Duration)
				}
			}
			prevEnd, prevName = sp.StartTime+sp.Duration, name
		}
		for _, sp := range got {
			if sp.OperationName == executor.SpanMain {
				wantCode := map[int]string{0: "1", 1: "0"}[n]
				if code := sp.tag("process.exit.code"); code != wantCode {
					t.Errorf("attempt %d's main container exit code %q, want %s", n, code, wantCode)
				}
			}
		}
	}
}
