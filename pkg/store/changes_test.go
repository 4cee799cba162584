package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/store"
)

// TestPostgresChanges: a created record, a cancelled one and one moved to
// another instance (Clusters.Move) are announced to a listener, for the
// record's executor (the new one's, after a move); other updates are not,
// and a listener whose connection is cut listens again and says so with
// the zero Change.
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
	t4, _, err := s.Create(ctx, store.Record{ID: "t4", Executor: "east-shard-0", Cluster: "east", Phase: "Pending"})
	if err != nil {
		t.Fatal(err)
	}
	if c := next("a third create"); c != (store.Change{Executor: "east-shard-0", ID: "t4"}) {
		t.Fatalf("after the third create: %+v", c)
	}
	if _, err := s.(store.Clusters).Move(ctx, t4, "west-shard-1", "west"); err != nil {
		t.Fatal(err)
	}
	if c := next("move"); c != (store.Change{Executor: "west-shard-1", ID: "t4"}) {
		t.Fatalf("after the move to west-shard-1: %+v", c)
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

// TestPostgresBroadcast: a message reaches every listener, the sender's own
// included; one over the limit is refused.
func TestPostgresBroadcast(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.Database(t)
	a, b := openPostgresURL(t, url).(store.Broadcaster), openPostgresURL(t, url).(store.Broadcaster)
	got := make(chan string, 8)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for i, s := range []store.Broadcaster{a, b} {
		go func() {
			_ = s.WatchBroadcasts(wctx, func(m []byte) { got <- fmt.Sprintf("%d:%s", i, m) }, func() { got <- fmt.Sprintf("%d:missed", i) })
		}()
	}
	// Listening starts asynchronously: send until both listeners heard one.
	heard := map[string]bool{}
	for !heard[`0:{"n":1}`] || !heard[`1:{"n":1}`] {
		if err := a.Broadcast(ctx, []byte(`{"n":1}`)); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			heard[m] = true
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("heard only %v", heard)
		}
	}
	if len(heard) != 2 {
		t.Errorf("heard %v", heard)
	}
	// Cut both listening connections: each listens again and says that it
	// may have missed messages.
	var n int
	if err := rawPostgres(t, url).QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("terminating the listeners: %d terminated, err %v", n, err)
	}
	for !heard["0:missed"] || !heard["1:missed"] {
		select {
		case m := <-got:
			heard[m] = true
		case <-ctx.Done():
			t.Fatalf("after the cut, heard only %v", heard)
		}
	}
	if err := a.Broadcast(ctx, make([]byte, store.MaxBroadcast+1)); err == nil {
		t.Error("a message over MaxBroadcast was sent")
	}
}
