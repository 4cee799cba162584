package executor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

// TestSecondProcessWithTheSameInstanceIDWaits (defect c): two executors with
// one InstanceID never run at once; the second starts when the first ends.
func TestSecondProcessWithTheSameInstanceIDWaits(t *testing.T) {
	for name, ephemeral := range map[string]bool{"lease": false, "ephemeral lease": true} {
		t.Run(name, func(t *testing.T) { testSecondProcessWaits(t, ephemeral) })
	}
}

func testSecondProcessWaits(t *testing.T, ephemeral bool) {
	client := fake.NewClientset()
	var logs syncBuffer
	newEx := func(holder string) *Executor {
		ex, err := New(Config{RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, Client: client, InstanceID: "twin", LeaseHolder: holder, EphemeralLease: ephemeral,
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return ex
	}
	first, second := newEx("first"), newEx("second")
	running := make(chan string, 2)
	first.cfg.OnLeading = func(context.Context) error { running <- "first"; return nil }
	second.cfg.OnLeading = func(context.Context) error { running <- "second"; return nil }

	ctx1, stop1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- first.Start(ctx1) }()
	if got := <-running; got != "first" {
		t.Fatalf("%s started first", got)
	}
	ctx2, stop2 := context.WithCancel(context.Background())
	defer stop2()
	done2 := make(chan error, 1)
	go func() { done2 <- second.Start(ctx2) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "another process holds this executor's instance lease") {
		if time.Now().After(deadline) {
			t.Fatalf("the second process does not say it waits; log:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case who := <-running:
		t.Fatalf("%s runs while the first holds the lease", who)
	case <-time.After(500 * time.Millisecond):
	}
	stop1() // releases the lease
	if err := <-done1; err != nil {
		t.Fatalf("first: %v", err)
	}
	select {
	case who := <-running:
		if who != "second" {
			t.Fatalf("%s", who)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second process did not take over after the first ended")
	}
	stop2()
	if err := <-done2; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("second: %v", err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
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

var _ io.Writer = (*syncBuffer)(nil)

// unreachableLeases is a fake clientset whose Lease requests all fail while
// failing is set, as when the API server is unreachable. Every request, not
// only updates: an ephemeral Lease, deleted when its term ended, would
// otherwise be created again at once, and the gate closed for too short a
// while to be seen (4 of 15 runs of TestLeaseLostAndTakenAgain).
func unreachableLeases() (*fake.Clientset, *atomic.Bool) {
	client := fake.NewClientset()
	failing := &atomic.Bool{}
	client.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failing.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	return client, failing
}

// cutLeases makes the API server unreachable for Lease requests (failing,
// from unreachableLeases) until ex's gate closes, by deadline, then
// reachable again.
func cutLeases(t *testing.T, ex *Executor, failing *atomic.Bool, deadline time.Time) {
	t.Helper()
	failing.Store(true)
	for ex.gate.closedSince().IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("still acting after the lease could not be renewed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	failing.Store(false)
}

// TestLeaseLostAndTakenAgain: when the Lease cannot be renewed (the API
// server unreachable), the executor stops acting and, once it holds the
// Lease again, resumes; Start does not return.
func TestLeaseLostAndTakenAgain(t *testing.T) {
	for name, ephemeral := range map[string]bool{"lease": false, "ephemeral lease": true} {
		t.Run(name, func(t *testing.T) { testLeaseLostAndTakenAgain(t, ephemeral) })
	}
}

func testLeaseLostAndTakenAgain(t *testing.T, ephemeral bool) {
	client, failing := unreachableLeases()
	terms := make(chan int, 4)
	n := 0
	ex, err := New(Config{RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, Client: client, InstanceID: "flaky", EphemeralLease: ephemeral,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnLeading: func(context.Context) error { n++; terms <- n; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	}()
	select {
	case <-terms:
	case <-time.After(10 * time.Second):
		t.Fatal("never took the lease")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !ex.gate.closedSince().IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("never opened")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cutLeases(t, ex, failing, deadline)
	select {
	case got := <-terms:
		if got != 2 {
			t.Fatalf("term %d", got)
		}
	case err := <-done:
		t.Fatalf("Start returned %v instead of taking the lease again", err)
	case <-time.After(15 * time.Second):
		t.Fatal("did not take the lease again")
	}
}

// TestStartReturnsALaterTermsError: when OnLeading fails in a term after
// an earlier term opened the gate, Start returns its error. Its creators and
// cleaners, parked on their channels since the earlier term, used to wait
// for Start's context for ever, and Start with them in its wg.Wait: the
// chaos suite's replica whose shard nobody ran for 16 minutes.
func TestStartReturnsALaterTermsError(t *testing.T) {
	client, failing := unreachableLeases()
	errRefused := errors.New("the second term is refused")
	var n atomic.Int32
	ex, err := New(Config{RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, Client: client, InstanceID: "flaky",
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnLeading: func(context.Context) error {
			if n.Add(1) > 1 {
				return errRefused
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ex.Start(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !ex.gate.closedSince().IsZero() || n.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first term never opened the gate")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cutLeases(t, ex, failing, deadline)
	select {
	case err := <-done:
		if !errors.Is(err, errRefused) {
			t.Fatalf("Start: %v, want %v", err, errRefused)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Start did not return after the second term's OnLeading failed (%d terms)", n.Load())
	}
}
