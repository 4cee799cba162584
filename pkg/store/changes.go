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
	backoff := 100 * time.Millisecond
	for {
		listened, err := s.listen(ctx, fn)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if listened {
			backoff = 100 * time.Millisecond
		}
		_ = err // the next connection, or ctx's end, says more
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
func (s *postgresStore) listen(ctx context.Context, fn func(Change)) (bool, error) {
	if s.closed.Load() {
		return false, errClosed
	}
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, fmt.Errorf("store changes: connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+postgresChangesChannel); err != nil {
		return false, fmt.Errorf("store changes: listen: %w", err)
	}
	fn(Change{})
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, fmt.Errorf("store changes: %w", err)
		}
		executor, id, ok := strings.Cut(n.Payload, "/")
		if !ok {
			continue // not ours
		}
		fn(Change{Executor: executor, ID: id})
	}
}

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
