package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/test/jaegertest"
)

// TestServeTrace: with OTEL_EXPORTER_OTLP_ENDPOINT naming a real OTLP
// receiver (Jaeger), a task submitted with a caller's traceparent, whose
// first attempt fails and is retried, beside a sidecar and with a File
// result, gives one trace in the caller's: the task span a child of the
// caller's span, the submission (with its dry run) and both attempts its
// children, and each attempt's steps under it, in order, once each.
func TestServeTrace(t *testing.T) {
	j := jaegertest.Start(t)
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
	var spans []jaegertest.Span
	clustertest.Eventually(t, time.Minute, "the task's trace in Jaeger", func(ctx context.Context) error {
		got, err := j.Trace(ctx, callerTrace)
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

	byID := map[string]jaegertest.Span{}
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
	var taskSpan jaegertest.Span
	attempts := map[string]int{} // attempt span ID -> attempt
	for _, sp := range spans {
		switch sp.OperationName {
		case executor.SpanTask:
			taskSpan = sp
		case executor.SpanAttempt:
			n, _ := strconv.Atoi(sp.Tag("kubetask.attempt"))
			attempts[sp.SpanID] = n
		}
	}
	if taskSpan.Parent() != callerSpan {
		t.Errorf("the task span's parent %q, want the caller's span %s", taskSpan.Parent(), callerSpan)
	}
	if got := taskSpan.Tag("cicd.pipeline.task.run.id"); got != tk.ID {
		t.Errorf("the task span's cicd.pipeline.task.run.id %q, want %s", got, tk.ID)
	}
	if got := taskSpan.Tag("cicd.pipeline.task.run.result"); got != "success" {
		t.Errorf("the task span's result %q, want success", got)
	}
	steps := map[int][]jaegertest.Span{}
	var attemptSpans []jaegertest.Span
	for _, sp := range spans {
		switch sp.OperationName {
		case executor.SpanTask:
		case executor.SpanSubmit, executor.SpanAttempt:
			if sp.Parent() != taskSpan.SpanID {
				t.Errorf("%s's parent %s, want the task span %s", sp.OperationName, sp.Parent(), taskSpan.SpanID)
			}
			if sp.OperationName == executor.SpanAttempt {
				attemptSpans = append(attemptSpans, sp)
			}
		case executor.SpanDryRun:
			if byID[sp.Parent()].OperationName != executor.SpanSubmit {
				t.Errorf("the dry run's parent is %q, want the submission", byID[sp.Parent()].OperationName)
			}
		default:
			n, ok := attempts[sp.Parent()]
			if !ok {
				t.Errorf("%s's parent %s is no attempt span", sp.OperationName, sp.Parent())
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
		// In order, each once; the log's capture follows its container
		// from the pod's start, beside the steps.
		if errs := jaegertest.StepsInOrder(attemptSpans[min(n, len(attemptSpans)-1)], got, perAttempt, executor.SpanLogs); len(errs) > 0 {
			for _, err := range errs {
				t.Errorf("attempt %d: %v", n, err)
			}
			for _, sp := range got {
				t.Logf("attempt %d: %-16s start %d µs, duration %d µs", n, sp.OperationName, sp.StartTime-taskSpan.StartTime, sp.Duration)
			}
		}
		for _, sp := range got {
			if sp.OperationName == executor.SpanMain {
				wantCode := map[int]string{0: "1", 1: "0"}[n]
				if code := sp.Tag("process.exit.code"); code != wantCode {
					t.Errorf("attempt %d's main container exit code %q, want %s", n, code, wantCode)
				}
			}
		}
	}
}
