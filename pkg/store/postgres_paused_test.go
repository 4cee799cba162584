package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

// TestPostgresPausedTransactionEnds: a process paused in the middle of a
// transaction (a replica SIGSTOPped between AppendLog's lock of the log's
// state row and its commit) does not hold that row from the other replicas
// for as long as it stays paused: the server ends its session once it has
// been idle in the transaction for idle_in_transaction_session_timeout, and
// another replica's append of the same log goes through. Without the
// setting the other append waited for the paused one (the chaos suite: a
// replica SIGSTOPped mid-append held a task's log, and with it the release
// of its pod, from the replica that took the shard over, for 2 minutes),
// here until its call timed out.
func TestPostgresPausedTransactionEnds(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	ctx := context.Background()
	paused, err := store.OpenPostgresIdleInTransaction(ctx, dbURL, time.Second, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer paused.Close()
	other, err := store.OpenPostgresTimeouts(ctx, dbURL, 8*time.Second, 8*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if v, err := store.PostgresSetting(ctx, other, "idle_in_transaction_session_timeout"); err != nil || v != "10s" {
		t.Errorf("the default idle_in_transaction_session_timeout is %q (%v), want 10s", v, err)
	}
	rec := mustCreate(t, other, storetest.Sample("a"))
	key := store.LogKey{TaskID: rec.ID, Attempt: 0, Container: "main"}
	end, err := store.PostgresPausedAppend(ctx, paused, key)
	if err != nil {
		t.Fatal(err)
	}
	var ended error
	var once sync.Once
	resume := func() error { once.Do(func() { ended = end() }); return ended }
	defer func() { _ = resume() }() // before paused.Close, which waits for the transaction's connection
	start := time.Now()
	info, err := other.(store.Logs).AppendLog(ctx, key, store.LogAppend{Data: []byte("hello\n")})
	if err != nil {
		t.Fatalf("the other replica's append after %s: %v", time.Since(start).Round(time.Millisecond), err)
	}
	t.Logf("the other append went through after %s", time.Since(start).Round(time.Millisecond))
	if info.Size != 6 {
		t.Errorf("size %d, want 6", info.Size)
	}
	if err := resume(); err == nil {
		t.Error("the paused transaction went on after the server should have ended it")
	}
	// The paused store's pool replaces the ended session.
	if _, err := paused.(store.Logs).AppendLog(ctx, key, store.LogAppend{Offset: 6, Data: []byte("more\n"), Complete: true}); err != nil {
		t.Errorf("the paused store after it resumed: %v", err)
	}
}
