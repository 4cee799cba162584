package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Change names a record that some process sharing the store created, or
// whose cancellation it asked for: the executor instance the record belongs
// to (Record.Executor) and the record's ID.
type Change struct {
	Executor, ID string
}

// Changes is implemented by stores that several processes share
// (PostgreSQL), so that the process running a record's executor instance
// acts on a task another process submitted or cancelled without polling.
type Changes interface {
	// WatchChanges calls fn, from one goroutine, for every record created
	// or cancelled by any process, until ctx ends; then it returns ctx's
	// error. Each time it starts listening (first, and again after the
	// connection was lost) it calls fn with the zero Change first: changes
	// may have been missed, look at every record again. Delivery is at least
	// once and prompt, never a substitute for the executor's own state.
	WatchChanges(ctx context.Context, fn func(Change)) error
}

var _ Changes = (*postgresStore)(nil)

// postgresChangesChannel is the NOTIFY channel of migration 2's trigger.
const postgresChangesChannel = "kubetask_tasks"

// WatchChanges listens on a connection of its own (LISTEN kubetask_tasks),
// reconnecting with a back-off of 100 ms doubling to 5 s while the server
// cannot be reached.
func (s *postgresStore) WatchChanges(ctx context.Context, fn func(Change)) error {
	return s.watch(ctx, postgresChangesChannel, func() { fn(Change{}) }, func(payload string) {
		if executor, id, ok := strings.Cut(payload, "/"); ok {
			fn(Change{Executor: executor, ID: id})
		}
	})
}

// Broadcaster passes small messages among the processes sharing a store
// (PostgreSQL NOTIFY): the replicas of `kubetask serve` share their task
// events so that a watch on any replica sees every task.
type Broadcaster interface {
	// Broadcast sends msg (at most MaxBroadcast bytes) to every process
	// watching, this one included. Delivery is at most once.
	Broadcast(ctx context.Context, msg []byte) error
	// WatchBroadcasts calls fn, from one goroutine, with every message
	// broadcast while it listens, until ctx ends; then it returns ctx's
	// error. Messages sent while its connection is down are lost: each time
	// it listens again after a lost connection, it calls missed first.
	WatchBroadcasts(ctx context.Context, fn func(msg []byte), missed func()) error
}

// MaxBroadcast is the largest message Broadcast sends (PostgreSQL's NOTIFY
// payload limit is 8000 bytes).
const MaxBroadcast = 7900

const postgresBroadcastChannel = "kubetask_events"

var _ Broadcaster = (*postgresStore)(nil)

func (s *postgresStore) Broadcast(ctx context.Context, msg []byte) error {
	if len(msg) > MaxBroadcast {
		return fmt.Errorf("broadcast: %d bytes, at most %d", len(msg), MaxBroadcast)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.conn(ctx)
	if err != nil {
		return fmt.Errorf("broadcast: %w", err)
	}
	defer c.Release()
	if _, err := c.Exec(ctx, `SELECT pg_notify($1, $2)`, postgresBroadcastChannel, string(msg)); err != nil {
		return fmt.Errorf("broadcast: %w", err)
	}
	return nil
}

func (s *postgresStore) WatchBroadcasts(ctx context.Context, fn func([]byte), missed func()) error {
	listened := false
	return s.watch(ctx, postgresBroadcastChannel, func() {
		if listened {
			missed()
		}
		listened = true
	}, func(payload string) { fn([]byte(payload)) })
}

// watch listens on channel until ctx ends, reconnecting with a back-off of
// 100 ms doubling to 5 s; onListen runs each time it (re)starts listening.
func (s *postgresStore) watch(ctx context.Context, channel string, onListen func(), fn func(string)) error {
	backoff := 100 * time.Millisecond
	for {
		if s.listen(ctx, channel, onListen, fn) {
			backoff = 100 * time.Millisecond
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// listen runs one LISTEN connection until it fails or ctx ends, and reports
// whether it got as far as listening.
func (s *postgresStore) listen(ctx context.Context, channel string, onListen func(), fn func(string)) bool {
	if s.closed.Load() {
		return false
	}
	cctx, cancel := s.bound(ctx)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(cctx, "LISTEN "+channel); err != nil {
		return false
	}
	onListen()
	for {
		wctx, cancel := context.WithTimeout(ctx, s.listenCheck)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			fn(n.Payload)
		case ctx.Err() == nil && wctx.Err() != nil:
			// Quiet for a while: make sure the server still answers (a server
			// cut off without a word would leave this wait with no end and
			// the changes it misses unreported).
			pctx, cancel := context.WithTimeout(ctx, s.callTimeout)
			_, err := conn.Exec(pctx, "SELECT 1")
			cancel()
			if err != nil {
				return true
			}
		default:
			return true
		}
	}
}

// postgresListenCheck is how long a LISTEN connection waits for a
// notification before it checks that the server still answers.
const postgresListenCheck = 15 * time.Second

// Pinger is implemented by stores on a server (PostgreSQL): Ping says
// whether it answers now (a service's readiness).
type Pinger interface {
	Ping(ctx context.Context) error
}

var _ Pinger = (*postgresStore)(nil)

// Ping checks that the server answers.
func (s *postgresStore) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return errClosed
	}
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	return nil
}
