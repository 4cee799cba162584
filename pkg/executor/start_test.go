package executor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/watchlist"
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

// TestPlainListDecidesTheCachesList: with Config.PlainList the pod caches
// tell client-go's Reflector that their client cannot do streaming lists
// (so it LISTs); without it, a real clientset's answer stands (it can).
func TestPlainListDecidesTheCachesList(t *testing.T) {
	rc := &rest.Config{Host: "https://127.0.0.1:1"}
	for name, tc := range map[string]struct {
		plain     bool
		streaming bool
	}{
		"default":    {plain: false, streaming: true},
		"plain list": {plain: true, streaming: false},
	} {
		t.Run(name, func(t *testing.T) {
			ex, err := New(Config{RESTConfig: rc, InstanceID: "lists", PlainList: tc.plain})
			if err != nil {
				t.Fatal(err)
			}
			if got := !watchlist.DoesClientNotSupportWatchListSemantics(ex.podCacheOptions("ns").Client); got != tc.streaming {
				t.Errorf("streaming list: %v, want %v", got, tc.streaming)
			}
		})
	}
}

// TestOnLeadingRunsWhileTheCachesList: OnLeading and the pod caches' first
// list run at once (neither waits for the other's requests): an OnLeading
// that waits for the caches' LIST returns, and the workers act only after
// both.
func TestOnLeadingRunsWhileTheCachesList(t *testing.T) {
	client := fake.NewClientset()
	listed := make(chan struct{})
	var once sync.Once
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() { close(listed) })
		return false, nil, nil
	})
	ex, err := New(Config{RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, Client: client,
		InstanceID: "overlap", Namespaces: []string{"ns"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnLeading: func(ctx context.Context) error {
			select {
			case <-listed:
				return nil
			case <-time.After(10 * time.Second):
				return errors.New("the pod caches did not list while OnLeading ran")
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Start(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for !ex.Ready() {
		select {
		case err := <-done:
			t.Fatalf("Start returned: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
