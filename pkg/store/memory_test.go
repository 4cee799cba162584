package store_test

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

func TestMemory(t *testing.T) {
	storetest.RunWithOptions(t, func(t *testing.T, opts store.Options) store.Store { return store.NewMemoryWithOptions(opts) })
}

func TestMemoryClusters(t *testing.T) {
	storetest.RunClusters(t, func(*testing.T) store.Store { return store.NewMemory() })
}

func TestMemoryClock(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	clk := clocktesting.NewFakePassiveClock(t0)
	s := store.NewMemoryWithClock(clk)
	defer s.Close()

	rec, _, err := s.Create(ctx, storetest.Sample("a"))
	if err != nil {
		t.Fatal(err)
	}
	if !rec.CreatedAt.Equal(t0) || !rec.UpdatedAt.Equal(t0) {
		t.Errorf("after Create: CreatedAt %v UpdatedAt %v, want both %v", rec.CreatedAt, rec.UpdatedAt, t0)
	}
	t1 := t0.Add(time.Minute)
	clk.SetTime(t1)
	rec, err = s.Update(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.CreatedAt.Equal(t0) || !rec.UpdatedAt.Equal(t1) {
		t.Errorf("after Update: CreatedAt %v UpdatedAt %v, want %v and %v", rec.CreatedAt, rec.UpdatedAt, t0, t1)
	}
}

func TestMemoryClosed(t *testing.T) {
	s := store.NewMemory()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), "a"); err == nil {
		t.Errorf("Get after Close: err = nil")
	}
}
