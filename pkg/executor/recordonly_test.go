package executor

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubetask/kubetask/pkg/store"
)

// TestRecordOnly: an executor for a shard another replica owns writes the
// Store on Submit and Cancel, emits Submitted, and queues nothing; it never
// starts.
func TestRecordOnly(t *testing.T) {
	f := newFx(t, func(c *Config) { c.RecordOnly = true })
	rec := f.submit("t1", newTask())
	if rec.Executor != "ex" || rec.Phase != "Pending" {
		t.Errorf("record %+v", rec)
	}
	if len(f.events) != 1 || f.events[0].Type != EventSubmitted {
		t.Errorf("events %+v, want one Submitted", f.events)
	}
	if err := f.ex.Cancel(f.ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if f.record("t1").CancelledAt.IsZero() {
		t.Error("Cancel did not write CancelledAt")
	}
	f.ex.Resync("t1")
	if f.ex.queue != nil {
		t.Errorf("a RecordOnly executor has a work queue (%d tasks); want none", f.ex.queue.Len())
	}
	f.ex.mu.Lock()
	waiting := len(f.ex.inLine)
	f.ex.mu.Unlock()
	if waiting != 0 {
		t.Errorf("%d tasks wait for a slot, want none", waiting)
	}
	if err := f.ex.Start(context.Background()); err == nil {
		t.Error("Start of a RecordOnly executor returned nil")
	}
}

// TestExecutorsShareARegistry: the executors of several shards register
// into one registry and count into the same collectors.
func TestExecutorsShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	var fs []*fx
	for range 2 {
		fs = append(fs, newFx(t, func(c *Config) { c.Registerer = reg; c.Store = store.NewMemory() }))
	}
	fs[0].ex.metrics.outcomes.WithLabelValues("Succeeded", "Completed").Inc()
	fs[1].ex.metrics.outcomes.WithLabelValues("Succeeded", "Completed").Inc()
	if got := testutil.ToFloat64(fs[0].ex.metrics.outcomes.WithLabelValues("Succeeded", "Completed")); got != 2 {
		t.Errorf("outcomes = %v, want 2 (shared)", got)
	}
	if n, err := testutil.GatherAndCount(reg, "kubetask_attempt_outcomes_total"); err != nil || n != 1 {
		t.Errorf("gathered %d series (err %v), want 1", n, err)
	}
}

// TestRecordOnlyLeavesNoGoroutine: a RecordOnly executor never starts, so
// nothing shuts down what it holds: it must hold nothing that runs (a
// replica makes one per shard; the simulator's replicas scenario found the
// work queue's goroutines left behind). synctest fails the test on a
// goroutine left in the bubble.
func TestRecordOnlyLeavesNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex, err := New(Config{Client: fake.NewClientset(), Execer: &fakeExec{}, InstanceID: "ex",
			Store: store.NewMemory(), RecordOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ex.Submit(t.Context(), "t1", newTask()); err != nil {
			t.Fatal(err)
		}
		if err := ex.Cancel(t.Context(), "t1"); err != nil {
			t.Fatal(err)
		}
		ex.Resync("t1")
	})
}
