package executor

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

// TestStartActsOnceCachesSynced: Start opens the gate as soon as its pod
// caches have synced, not at the next tick of a poll. In a synctest bubble
// time moves only when every goroutine waits for it, so an executor that
// polls HasSynced (client-go's WaitForCacheSync, every 100 ms) is not ready
// when the bubble first settles; one that waits on the caches' done
// channels is, at the bubble's start time.
func TestStartActsOnceCachesSynced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex, err := New(Config{RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, Client: fake.NewClientset(),
			InstanceID: "quick", Namespaces: []string{"ns"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- ex.Start(ctx) }()
		synctest.Wait()
		if !ex.Ready() {
			t.Errorf("not ready once every goroutine waits: the start waits for a timer (a poll of the caches)")
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("ready after %s of the bubble's time, want 0", d)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}
