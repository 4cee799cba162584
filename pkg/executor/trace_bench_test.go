package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// BenchmarkTraceCost measures what tracing costs a task on the submission
// path (Submit) and on the sync path (the pass that records a finished
// attempt's outcome, where an attempt's spans are made), with tracing off
// (Config.Tracer nil) and on (the SDK, its batch processor, and an exporter
// that drops the batches: the cost in the executor, not the network's).
// Each sub-benchmark reports the two paths' time per task; the parent logs
// on/off for each path.
//
//	go test -run '^$' -bench BenchmarkTraceCost -benchtime 2000x ./pkg/executor
func BenchmarkTraceCost(b *testing.B) {
	type result struct{ submit, sync float64 } // ns per task
	results := map[bool]result{}
	run := func(traced bool) func(b *testing.B) {
		return func(b *testing.B) {
			clk := clocktesting.NewFakeClock(podtest.T0)
			cfg := Config{Client: fake.NewClientset(), Execer: &fakeExec{out: "42"}, InstanceID: "ex", Namespaces: []string{"ns"},
				Clock: clk, Store: store.NewMemoryWithClock(clk), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if traced {
				tp := sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(TraceIDGenerator{}),
					sdktrace.WithBatcher(tracetest.NewNoopExporter(), sdktrace.WithBatchTimeout(time.Second)))
				defer func() { _ = tp.Shutdown(context.Background()) }()
				cfg.Tracer = NewTracer(tp)
			}
			ex, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer ex.queue.ShutDown()
			ctx := context.Background()
			epoch, err := ex.store.BeginTerm(ctx, "ex")
			if err != nil {
				b.Fatal(err)
			}
			ex.epoch.Store(epoch)
			tctx, end := context.WithCancelCause(ctx)
			defer end(nil)
			ex.termCtx, ex.endTerm = tctx, end
			idx := newPodIndexer()
			ex.indexers.Store(&[]cache.Indexer{idx})
			tk := newTask()
			tk.Namespace = "ns"
			finished := mainExited(0).Obj()
			var submit, sync time.Duration
			b.ResetTimer()
			for i := range b.N {
				id := fmt.Sprintf("t-%d", i)
				start := time.Now()
				rec, err := ex.Submit(ctx, id, tk)
				if err != nil {
					b.Fatal(err)
				}
				submit += time.Since(start)
				b.StopTimer()
				var t task.Task
				if err := json.Unmarshal(rec.Task, &t); err != nil {
					b.Fatal(err)
				}
				pod, err := task.BuildPod(&t, task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Executor: "ex", Nonce: rec.Nonce}, 0)
				if err != nil {
					b.Fatal(err)
				}
				pod.UID, pod.CreationTimestamp, pod.Spec.NodeName, pod.Status = types.UID(fmt.Sprint("uid-", i)), finished.CreationTimestamp, finished.Spec.NodeName, finished.Status
				if err := idx.Add(compactPod(pod)); err != nil {
					b.Fatal(err)
				}
				clk.SetTime(podtest.T0.Add(2 * time.Minute))
				b.StartTimer()
				start = time.Now()
				if _, err := ex.sync(ctx, id); err != nil {
					b.Fatal(err)
				}
				sync += time.Since(start)
				if r, _ := ex.store.Get(ctx, id); !r.Terminal {
					b.Fatalf("task %s not finished: %s/%s", id, r.Phase, r.Reason)
				}
			}
			res := result{float64(submit) / float64(b.N), float64(sync) / float64(b.N)}
			results[traced] = res
			b.ReportMetric(res.submit, "submit-ns/task")
			b.ReportMetric(res.sync, "sync-ns/task")
			b.ReportMetric(0, "ns/op") // the two paths' figures say it
		}
	}
	b.Run("off", run(false))
	b.Run("on", run(true))
	if off, on := results[false], results[true]; off.submit > 0 && off.sync > 0 {
		b.Logf("tracing on/off: submission %.2fx (%.0f/%.0f ns), sync pass recording an outcome %.2fx (%.0f/%.0f ns)",
			on.submit/off.submit, on.submit, off.submit, on.sync/off.sync, on.sync, off.sync)
	}
}
