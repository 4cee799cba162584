package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/store"
)

// TestPostgresChanges: a created record and a cancelled one are announced
// to a listener, other updates are not, and a listener whose connection is
// cut listens again and says so with the zero Change.
func TestPostgresChanges(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.Database(t)
	s := openPostgresURL(t, url)
	ch := s.(store.Changes)
	got := make(chan store.Change, 16)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ch.WatchChanges(wctx, func(c store.Change) { got <- c }) }()
	defer func() {
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("WatchChanges returned %v, want context.Canceled", err)
		}
	}()
	next := func(what string) store.Change {
		t.Helper()
		select {
		case c := <-got:
			return c
		case <-ctx.Done():
			t.Fatalf("no change: %s", what)
			return store.Change{}
		}
	}
	if c := next("first listen"); c != (store.Change{}) {
		t.Fatalf("first change %+v, want the zero Change", c)
	}

	rec, _, err := s.Create(ctx, store.Record{ID: "t1", Namespace: "ns", Executor: "shard-3", Phase: "Pending"})
	if err != nil {
		t.Fatal(err)
	}
	if c := next("create"); c != (store.Change{Executor: "shard-3", ID: "t1"}) {
		t.Fatalf("after create: %+v", c)
	}
	rec.Phase = "Running"
	if rec, err = s.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	rec.CancelledAt = time.Now()
	if _, err = s.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// The phase update is not announced: the next change is the cancel.
	if c := next("cancel"); c != (store.Change{Executor: "shard-3", ID: "t1"}) {
		t.Fatalf("after cancel: %+v", c)
	}
	if _, _, err := s.Create(ctx, store.Record{ID: "t2", Executor: "shard-1"}); err != nil {
		t.Fatal(err)
	}
	if c := next("second create"); c != (store.Change{Executor: "shard-1", ID: "t2"}) {
		t.Fatalf("after the second create (an update was announced?): %+v", c)
	}

	// Cut the listening connection: it listens again, with the zero Change.
	raw := rawPostgres(t, url)
	var n int
	if err := raw.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminating the listener: %d terminated, err %v", n, err)
	}
	if c := next("listen again"); c != (store.Change{}) {
		t.Fatalf("after the cut: %+v, want the zero Change", c)
	}
	if _, _, err := s.Create(ctx, store.Record{ID: "t3", Executor: "shard-1"}); err != nil {
		t.Fatal(err)
	}
	if c := next("create after the cut"); c != (store.Change{Executor: "shard-1", ID: "t3"}) {
		t.Fatalf("after the cut: %+v", c)
	}
}
