package service

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

type fakeRetention struct {
	mu      sync.Mutex
	left    int
	calls   []time.Time
	batches []int
	done    chan struct{}
}

func (f *fakeRetention) DeleteFinishedBefore(_ context.Context, t time.Time, batch int) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, t)
	n := min(f.left, batch)
	f.left -= n
	f.batches = append(f.batches, n)
	if f.left == 0 && n < batch && f.done != nil {
		close(f.done)
		f.done = nil
	}
	return n, nil
}

// TestRetentionDeletesInSmallBatches: a run deletes batch after batch until a
// batch comes back short, with the cut-off keep before now.
func TestRetentionDeletesInSmallBatches(t *testing.T) {
	now := time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(now)
	f := &fakeRetention{left: 250, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := f.done
	go retain(ctx, f, 720*time.Hour, time.Hour, clk, slog.New(slog.NewTextHandler(io.Discard, nil)))
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("retention did not run")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if want := []int{100, 100, 50}; len(f.batches) != 3 || f.batches[0] != want[0] || f.batches[2] != want[2] {
		t.Errorf("batches %v, want %v", f.batches, want)
	}
	if !f.calls[0].Equal(now.Add(-720 * time.Hour)) {
		t.Errorf("cut-off %s", f.calls[0])
	}
}
