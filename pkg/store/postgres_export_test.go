package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// OpenPostgresMigrations opens a PostgreSQL store as a binary that knows only
// the first n migrations would.
func OpenPostgresMigrations(ctx context.Context, url string, n int) (Store, error) {
	return openPostgres(ctx, url, postgresOptions{migrations: postgresMigrations[:n:n]})
}

// PostgresSchemaVersion is the schema version of this binary.
var PostgresSchemaVersion = len(postgresMigrations)

// OpenPostgresRetentionBudget opens a PostgreSQL store whose
// DeleteFinishedBefore stops once the deleted logs reach budget bytes.
func OpenPostgresRetentionBudget(ctx context.Context, url string, budget int64) (Store, error) {
	return openPostgres(ctx, url, postgresOptions{retentionLogBytes: budget})
}

// PostgresPageSQL returns the statement and arguments of the page opts
// selects.
func PostgresPageSQL(opts PageOptions) (string, []any, error) {
	q, err := opts.query()
	if err != nil {
		return "", nil, err
	}
	query, args := postgresPageSQL(q)
	return query, args, nil
}

// PostgresStatements are the store's other statements whose plans the tests
// check, by name, with arguments of the right types.
var PostgresStatements = map[string]struct {
	SQL  string
	Args []any
}{
	"get":                  {postgresSQL.get, []any{"x"}},
	"version":              {postgresSQL.version, []any{"x"}},
	"begin term":           {postgresSQL.beginTerm, []any{"x", int64(1)}},
	"epoch":                {postgresSQL.epoch, []any{"x"}},
	"create":               {postgresSQL.create, createArgs()},
	"update":               {postgresSQL.update, updateArgs()},
	"list by executor":     {`SELECT ` + postgresColumns + ` FROM tasks WHERE executor = $1 AND NOT terminal ORDER BY id`, []any{[]byte("x")}},
	"list by cluster":      {`SELECT ` + postgresColumns + ` FROM tasks WHERE cluster = $1 AND NOT terminal ORDER BY id`, []any{[]byte("x")}},
	"move":                 {postgresSQL.move, updateArgs()},
	"move state":           {postgresSQL.moveState, []any{"x"}},
	"log state":            {postgresLogSQL.state, logKeyArgs()},
	"log create":           {postgresLogSQL.create, logKeyArgs()},
	"log last byte":        {postgresLogSQL.lastByte, logKeyArgs()},
	"log chunk":            {postgresLogSQL.chunk, append(logKeyArgs(), int64(0), []byte("x"))},
	"log save":             {postgresLogSQL.save, append(logKeyArgs(), int64(1), false, false, []byte("c"))},
	"log read":             {postgresLogSQL.read, append(logKeyArgs(), int64(100), int64(1000))},
	"log keys":             {postgresLogSQL.keys, []any{"x"}},
	"retention":            {postgresRetentionSQL, []any{int64(1), int64(100), int64(1 << 26)}},
	"cascade: task labels": {`DELETE FROM task_labels WHERE task_id = $1`, []any{"x"}},
	"cascade: task logs":   {`DELETE FROM logs WHERE task_id = $1`, []any{"x"}},
	"cascade: log chunks":  {`DELETE FROM log_chunks WHERE task_id = $1 AND attempt = $2 AND container = $3`, logKeyArgs()},
}

func logKeyArgs() []any { return []any{"x", int32(0), []byte("main")} }

func createArgs() []any {
	args, err := postgresCreateArgs(Record{ID: "x", Labels: map[string]string{"app": "web"}})
	if err != nil {
		panic(err)
	}
	return args
}

func updateArgs() []any {
	args, err := postgresUpdateArgs(Record{ID: "x", Labels: map[string]string{"app": "web"}}, 1)
	if err != nil {
		panic(err)
	}
	return args
}

// PostgresSetting returns a setting of a session of s's pool.
func PostgresSetting(ctx context.Context, s Store, name string) (string, error) {
	var v string
	err := s.(*postgresStore).pool.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v)
	return v, err
}

// PostgresInsertAtSchema writes rec as a binary of schema version 1 to 5
// did: versions 1 and 2 without the fence's columns (nonce, epoch, pod_uid,
// pod_epoch), 3 without the actors (submitted_by, cancelled_by), 4 and 5
// without the cluster.
func PostgresInsertAtSchema(ctx context.Context, c *pgx.Conn, rec Record, version int) error {
	args, err := postgresArgs(rec)
	if err != nil {
		return err
	}
	n := 22
	switch version {
	case 3:
		n = 26
	case 4, 5:
		n = 28
	case 6:
		n = 29
	}
	cols := strings.Split(postgresColumns, ",")[:n]
	marks := make([]string, len(cols))
	for i := range marks {
		marks[i] = fmt.Sprintf("$%d", i+1)
	}
	_, err = c.Exec(ctx, "INSERT INTO tasks ("+strings.Join(cols, ",")+") VALUES ("+strings.Join(marks, ",")+")", args[:n]...)
	return err
}

// OpenPostgresTimeouts opens a PostgreSQL store whose calls time out after
// call and whose LISTEN connections check the server after a quiet listen.
func OpenPostgresTimeouts(ctx context.Context, url string, call, listen time.Duration) (Store, error) {
	return openPostgres(ctx, url, postgresOptions{callTimeout: call, listenCheck: listen})
}

// OpenPostgresIdleInTransaction opens a PostgreSQL store whose sessions'
// idle_in_transaction_session_timeout is idle and whose calls time out
// after call.
func OpenPostgresIdleInTransaction(ctx context.Context, url string, idle, call time.Duration) (Store, error) {
	return openPostgres(ctx, url, postgresOptions{idleInTransaction: idle, callTimeout: call})
}

// PostgresPausedAppend begins AppendLog's transaction on s for key, locks
// the log's state row as it does, and goes quiet: a process paused in the
// middle of an append. end rolls it back (an error once the server ended
// the session).
func PostgresPausedAppend(ctx context.Context, s Store, key LogKey) (end func() error, err error) {
	tx, err := s.(*postgresStore).pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	k := []any{key.TaskID, int32(key.Attempt), bytesOf(key.Container)} //nolint:gosec // attempts are few
	var info LogInfo
	if err := tx.QueryRow(ctx, postgresLogSQL.create, k...).Scan(&info.Size, &info.Complete, &info.Truncated, &info.Cursor); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return func() error {
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return tx.Rollback(ctx)
	}, nil
}
