package executor

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestHealthyTurnsFalseWhenPodsCannotBeListed is a unit test of the liveness
// rule (the fake clientset stands in for an API server that refuses LISTs).
func TestHealthyTurnsFalseWhenPodsCannotBeListed(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("apiserver unavailable")
	})
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, nil, errors.New("apiserver unavailable")
	})
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	ex, err := New(Config{RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, Client: client, InstanceID: "health", Clock: clk, LivenessTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := ex.Healthy(); err == nil {
		t.Error("healthy before Start")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Start(ctx) }()
	defer func() { cancel(); <-done }()

	// The pod cache's first LIST fails: healthy until the timeout passes.
	deadline := time.Now().Add(10 * time.Second)
	for !ex.anyCacheBlind() {
		if time.Now().After(deadline) {
			t.Fatal("the pod cache never tried to list")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := ex.Healthy(); err != nil {
		t.Errorf("unhealthy within the liveness timeout: %v", err)
	}
	clk.Step(2 * time.Minute)
	err = ex.Healthy()
	if err == nil || !strings.Contains(err.Error(), "cannot list") {
		t.Errorf("Healthy() = %v after failing to list for longer than the timeout", err)
	}
}

// anyCacheBlind reports whether one of the executor's pod caches is blind.
func (e *Executor) anyCacheBlind() bool {
	e.mu.Lock()
	caches := e.caches
	e.mu.Unlock()
	for _, c := range caches {
		if since, _ := c.blind(); !since.IsZero() {
			return true
		}
	}
	return false
}
