package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/utils/clock"
)

// OpenPostgres connects to the PostgreSQL database at url (a postgres:// URL
// or a keyword/value string, as libpq takes them), creates or migrates its
// schema, and returns a durable Store that also implements Pager, Logs,
// Retention and Clusters. Several processes may open the same database at
// once (several `kubetask serve` replicas): every write is a PostgreSQL
// transaction of its own, and the compare-and-swap of Update (and of Move
// and PutCluster) holds across processes.
//
// Durability: a write call returns nil only after its transaction
// committed, with synchronous_commit on (a session whose server or role
// default is off is switched on, unless url sets synchronous_commit itself).
// Times round-trip to the nanosecond (stored as Unix nanoseconds) and come
// back in UTC; non-zero times must lie within the range of time.UnixNano.
// Every string but the ID is stored as its bytes (bytea), so any Go string
// round-trips, NUL bytes and invalid UTF-8 included, and compares in byte
// order whatever the database's collation; the ID (printable text by
// contract, task.ValidateID) is text in the "C" collation and must be valid
// UTF-8 without NUL (Create refuses another). nil and empty Task, Result, Labels and Attempts
// stay distinct.
//
// Concurrency: the store holds a pool of connections (pool_max_conns in url,
// else 16) and runs concurrent calls in concurrent transactions, whose
// commits PostgreSQL flushes together (its own group commit). Each write has
// the semantics it has alone: Update's version (and nonce) check is part of
// its UPDATE statement, so of concurrent updates from one version exactly
// one wins and the others get ErrConflict, in this process or another.
//
// Errors and cancellation: a call whose context ends before it has a
// connection returns the context's error and writes nothing; once its
// statement is sent, a write runs to its end whatever the context, so that
// an error always means "not applied" (only a connection lost during the
// commit itself leaves the outcome unknown, as with any database).
//
// Close waits for the calls in progress and closes the pool; calls after
// Close fail.
//
// Schema: versioned, forward-only migrations (postgresMigrations) run when
// the store opens, in one transaction under a transaction-level advisory
// lock, so processes that open the same database at once migrate it once;
// a database whose schema is newer than this binary knows is refused with an
// error that names both versions. The tables live in the connection's
// search_path (set search_path in url to give kubetask a schema of its own).
func OpenPostgres(ctx context.Context, url string, opts Options) (Store, error) {
	s, err := openPostgres(ctx, url, postgresOptions{Options: opts})
	if err != nil {
		return nil, fmt.Errorf("task store postgres %s: %w", redactURL(url), err)
	}
	return s, nil
}

// postgresOptions are openPostgres' unexported knobs for tests, beside the
// exported ones.
type postgresOptions struct {
	Options
	// migrations replaces postgresMigrations when set (a test opens a
	// database as an older binary would).
	migrations []string
	// retentionLogBytes replaces postgresRetentionLogBytes when positive.
	retentionLogBytes int64
	// callTimeout and listenCheck replace postgresCallTimeout and
	// postgresListenCheck when positive.
	callTimeout, listenCheck time.Duration
	// idleInTransaction replaces postgresIdleInTransaction when positive.
	idleInTransaction time.Duration
}

// postgresCallTimeout bounds every call on the server, reads and writes,
// whatever the caller's context: a server cut off without a word (a
// partition, a host paused) would otherwise hold a call, and whoever waits
// on it (a gate closing, a replica leaving, a SIGTERM hand-over), until the
// kernel gives up on the connection, about 15 minutes. A write that runs out
// of it may or may not have been applied, as with any lost connection: its
// error says so, and a caller reads the record again.
const postgresCallTimeout = 30 * time.Second

// postgresIdleInTransaction is the sessions' idle_in_transaction_session_timeout
// (unless the URL sets one): a transaction whose client sent nothing for
// that long is ended by the server, and its row locks with it. kubetask's
// transactions send their statements back to back; one that goes quiet
// belongs to a process that is paused (SIGSTOP, a long GC pause, a frozen
// VM) or cut off, and its locks (a log's state row, a term's row) would
// otherwise hold the other replicas' writes of those rows for as long as
// it stays paused. The paused process's next statement then fails, and its
// write with it (it may retry: a failed write changed nothing).
const postgresIdleInTransaction = 10 * time.Second

// postgresKeepAlive probes an idle connection (a LISTEN one waits for
// notifications for as long as none come): a peer that stopped answering
// is noticed after Idle + Count x Interval.
var postgresKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// postgresDefaultConns is the pool size when the URL sets no pool_max_conns:
// enough concurrent transactions for their commits to share WAL flushes
// (see BenchmarkPostgresWrites), few enough for a server's max_connections
// with several replicas.
const postgresDefaultConns = 16

// postgresLockKey is the advisory lock key the migrations run under
// (pg_advisory_xact_lock), the same in every kubetask process: the bytes of
// "kubetask" as a big-endian int64.
const postgresLockKey int64 = 0x6b75626574617368

// postgresMigrations are applied in order; kubetask_schema_version holds one
// row per applied migration. Append only: never edit a released migration.
//
// Migration 1 holds the whole schema of the first release: tasks and one
// index per page filter, each ending in the page order (created_at, id), so
// a filtered page is an ordered range of one index; the labels as rows
// (task_labels, with the immutable created_at copied so a label's range is
// in page order too); the log archive (per-log state, and chunks keyed by
// offset so a read from an offset is a range scan); a partial index of
// terminal tasks by last update for retention. Foreign keys delete a task's
// labels and logs (and a log's chunks) with it.
var postgresMigrations = []string{
	`CREATE TABLE tasks (
		id              text COLLATE "C" NOT NULL PRIMARY KEY,
		namespace       bytea   NOT NULL,
		name            bytea   NOT NULL,
		executor        bytea   NOT NULL,
		labels          json,
		origin          bytea   NOT NULL,
		task            bytea,
		attempt         integer NOT NULL,
		phase           bytea   NOT NULL,
		reason          bytea   NOT NULL,
		message         bytea   NOT NULL,
		exit_code       integer,
		retryable       boolean NOT NULL,
		result          bytea,
		terminal        boolean NOT NULL,
		cancelled_at    bigint,
		next_attempt_at bigint,
		pod_created     boolean NOT NULL,
		attempts        json,
		created_at      bigint  NOT NULL,
		updated_at      bigint  NOT NULL,
		version         bigint  NOT NULL
	);
	CREATE INDEX tasks_by_executor ON tasks (executor, terminal, id);
	CREATE INDEX tasks_by_terminal ON tasks (terminal, id);
	CREATE INDEX tasks_by_created ON tasks (created_at, id);
	CREATE INDEX tasks_by_namespace ON tasks (namespace, created_at, id);
	CREATE INDEX tasks_by_namespace_phase ON tasks (namespace, phase, created_at, id);
	CREATE INDEX tasks_by_phase ON tasks (phase, created_at, id);
	CREATE INDEX tasks_by_reason ON tasks (reason, created_at, id);
	CREATE INDEX tasks_by_name ON tasks (name, created_at, id);
	CREATE INDEX tasks_by_terminal_created ON tasks (terminal, created_at, id);
	CREATE INDEX tasks_finished ON tasks (updated_at, id) WHERE terminal;
	CREATE TABLE task_labels (
		task_id    text COLLATE "C" NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
		key        bytea  NOT NULL,
		value      bytea  NOT NULL,
		created_at bigint NOT NULL,
		PRIMARY KEY (task_id, key)
	);
	CREATE INDEX task_labels_by_value ON task_labels (key, value, created_at, task_id);
	CREATE TABLE logs (
		task_id   text COLLATE "C" NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
		attempt   integer NOT NULL,
		container bytea   NOT NULL,
		size      bigint  NOT NULL,
		complete  boolean NOT NULL,
		truncated boolean NOT NULL,
		cursor    bytea,
		PRIMARY KEY (task_id, attempt, container)
	);
	CREATE TABLE log_chunks (
		task_id   text COLLATE "C" NOT NULL,
		attempt   integer NOT NULL,
		container bytea   NOT NULL,
		"offset"  bigint  NOT NULL,
		data      bytea   NOT NULL,
		PRIMARY KEY (task_id, attempt, container, "offset"),
		FOREIGN KEY (task_id, attempt, container) REFERENCES logs ON DELETE CASCADE
	);`,
	// Migration 2: every created record, and every record whose
	// cancellation is asked, is announced on the channel kubetask_tasks
	// (payload "executor/id") in the transaction of the write, for the
	// replica that runs the record's executor (WatchChanges).
	`CREATE FUNCTION kubetask_notify_task() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM pg_notify('` + postgresChangesChannel + `', convert_from(NEW.executor, 'UTF8') || '/' || NEW.id);
		RETURN NULL;
	END $$;
	CREATE TRIGGER tasks_created AFTER INSERT ON tasks
		FOR EACH ROW EXECUTE FUNCTION kubetask_notify_task();
	CREATE TRIGGER tasks_cancelled AFTER UPDATE OF cancelled_at ON tasks
		FOR EACH ROW WHEN (OLD.cancelled_at IS DISTINCT FROM NEW.cancelled_at)
		EXECUTE FUNCTION kubetask_notify_task();`,
	// Migration 3: the fence (docs/executor.md). Each executor instance's
	// term epoch, raised by BeginTerm; a record's nonce, the epoch of its
	// last fenced write, and its current attempt's pod (UID and creating
	// epoch); the replicas of each group as they last said they run (Groups).
	`ALTER TABLE tasks
		ADD COLUMN nonce bytea NOT NULL DEFAULT ''::bytea,
		ADD COLUMN epoch bigint NOT NULL DEFAULT 0,
		ADD COLUMN pod_uid bytea NOT NULL DEFAULT ''::bytea,
		ADD COLUMN pod_epoch bigint NOT NULL DEFAULT 0;
	CREATE TABLE kubetask_terms (
		instance   text COLLATE "C" NOT NULL PRIMARY KEY,
		epoch      bigint NOT NULL,
		started_at bigint NOT NULL
	);
	CREATE TABLE kubetask_members (
		grp             text COLLATE "C" NOT NULL,
		member          text COLLATE "C" NOT NULL,
		lease_namespace text NOT NULL,
		seen_at         timestamptz NOT NULL,
		PRIMARY KEY (grp, member)
	);`,
	// Migration 4: who submitted (or reran) each task and who cancelled it
	// (Actor, JSON; '' when unknown).
	`ALTER TABLE tasks
		ADD COLUMN submitted_by text NOT NULL DEFAULT '',
		ADD COLUMN cancelled_by text NOT NULL DEFAULT '';`,
	// Migration 5: each replica's shard count (--shards) and its place in
	// its group's join order (Groups.Join). A row an older binary wrote,
	// or writes still (its statements name neither column), has 0 for
	// both: count unknown.
	`ALTER TABLE kubetask_members
		ADD COLUMN shards integer NOT NULL DEFAULT 0,
		ADD COLUMN joined bigint  NOT NULL DEFAULT 0;`,
	// Migration 6: many clusters (docs/multicluster.md). The cluster each
	// task is placed on ('' for a record written before, or not placed, and
	// in the rows an older binary still writes: its statements do not name
	// it), with an index for List's filter (as tasks_by_executor) and one
	// for Page's (in page order, as the other page indexes); the indexes
	// are built in the migration's transaction, a while on a large table,
	// once. And the clusters' rows: state, since when (Unix nanoseconds)
	// and why, labels (JSON, NULL for nil), mode and version (Clusters).
	`ALTER TABLE tasks ADD COLUMN cluster bytea NOT NULL DEFAULT ''::bytea;
	CREATE INDEX tasks_by_cluster ON tasks (cluster, terminal, id);
	CREATE INDEX tasks_by_cluster_created ON tasks (cluster, created_at, id);
	CREATE TABLE kubetask_clusters (
		name       text COLLATE "C" NOT NULL PRIMARY KEY,
		state      text   NOT NULL,
		since      bigint NOT NULL,
		reason     bytea  NOT NULL,
		message    bytea  NOT NULL,
		labels     json,
		mode       text   NOT NULL,
		version    bigint NOT NULL,
		updated_at bigint NOT NULL
	);`,
	// Migration 7: a record moved to another instance (Clusters.Move: to
	// another cluster, where a replica group's shard instance runs it) is
	// announced as a created one is, for the replica that runs its new
	// executor.
	`CREATE TRIGGER tasks_moved AFTER UPDATE OF executor ON tasks
		FOR EACH ROW WHEN (OLD.executor IS DISTINCT FROM NEW.executor)
		EXECUTE FUNCTION kubetask_notify_task();`,
}

var _ Store = (*postgresStore)(nil)

type postgresStore struct {
	clock             clock.PassiveClock
	maxLogSize        int64
	retentionLogBytes int64
	pool              *pgxpool.Pool
	closed            atomic.Bool
	callTimeout       time.Duration
	listenCheck       time.Duration
}

func openPostgres(ctx context.Context, url string, opts postgresOptions) (_ *postgresStore, err error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = postgresDefaultConns
	}
	params := cfg.ConnConfig.RuntimeParams
	if _, ok := params["application_name"]; !ok {
		params["application_name"] = "kubetask"
	}
	var setup []func(context.Context, *pgx.Conn) error
	if _, ok := params["synchronous_commit"]; !ok {
		setup = append(setup, ensureSynchronousCommit)
	}
	if _, ok := params["idle_in_transaction_session_timeout"]; !ok {
		idle := postgresIdleInTransaction
		if opts.idleInTransaction > 0 {
			idle = opts.idleInTransaction
		}
		setup = append(setup, func(ctx context.Context, conn *pgx.Conn) error {
			// A SET after the start-up rather than a start-up parameter,
			// which some connection poolers refuse.
			_, err := conn.Exec(ctx, fmt.Sprintf("SET idle_in_transaction_session_timeout = %d", idle.Milliseconds()))
			return err
		})
	}
	if len(setup) > 0 {
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			for _, f := range setup {
				if err := f(ctx, conn); err != nil {
					return err
				}
			}
			return nil
		}
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAliveConfig: postgresKeepAlive}
	cfg.ConnConfig.DialFunc = dialer.DialContext
	s := &postgresStore{
		clock:             opts.clock(),
		maxLogSize:        opts.maxLogSize(),
		retentionLogBytes: opts.retentionLogBytes,
		callTimeout:       postgresCallTimeout,
		listenCheck:       postgresListenCheck,
	}
	if opts.callTimeout > 0 {
		s.callTimeout = opts.callTimeout
	}
	if opts.listenCheck > 0 {
		s.listenCheck = opts.listenCheck
	}
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("database open: %w", err)
	}
	defer func() {
		if err != nil {
			s.pool.Close()
		}
	}()
	migrations := postgresMigrations
	if opts.migrations != nil {
		migrations = opts.migrations
	}
	if err := s.migrate(ctx, migrations); err != nil {
		return nil, err
	}
	return s, nil
}

// ensureSynchronousCommit turns synchronous_commit on in a session whose
// default is off, so that a commit returns only once it is durable.
func ensureSynchronousCommit(ctx context.Context, conn *pgx.Conn) error {
	var v string
	if err := conn.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&v); err != nil {
		return err
	}
	if v == "off" {
		_, err := conn.Exec(ctx, `SET synchronous_commit = on`)
		return err
	}
	return nil
}

// redactURL returns url without its password, for errors.
func redactURL(url string) string {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return "(unparsable URL)"
	}
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// migrate brings the schema to len(migrations) in one transaction, under an
// advisory lock that serialises the processes that open the database at
// once: the first migrates, the others then find the schema current.
func (s *postgresStore) migrate(ctx context.Context, migrations []string) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("database open: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, postgresLockKey); err != nil {
		return fmt.Errorf("schema lock: %w", err)
	}
	// Created only when missing: CREATE TABLE IF NOT EXISTS needs the
	// CREATE privilege even when the table exists.
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('kubetask_schema_version') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, `CREATE TABLE kubetask_schema_version (
			version    integer     NOT NULL PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
			return fmt.Errorf("schema version: %w", err)
		}
	}
	var version int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM kubetask_schema_version`).Scan(&version); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	if version > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this binary's %d: run a kubetask release that knows it", version, len(migrations))
	}
	for i := version; i < len(migrations); i++ {
		if _, err := tx.Exec(ctx, migrations[i]); err != nil {
			return fmt.Errorf("schema migration %d: %w", i+1, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO kubetask_schema_version (version) VALUES ($1)`, i+1); err != nil {
			return fmt.Errorf("schema migration %d: %w", i+1, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("schema migration commit: %w", err)
	}
	return nil
}

// postgresColumns are a record's columns, in postgresArgs' and
// scanPostgresRecord's order.
const postgresColumns = `id, namespace, name, executor, task, attempt, phase, reason, message,
	exit_code, retryable, result, terminal, cancelled_at, next_attempt_at, pod_created,
	attempts, created_at, updated_at, version, labels, origin, nonce, epoch, pod_uid, pod_epoch,
	submitted_by, cancelled_by, cluster`

// postgresSQL are the statements of the record paths.
var postgresSQL = struct {
	create, update, move, moveState, get, version, beginTerm, epoch string
}{
	// One statement, so one transaction: the task, and its labels as rows
	// unless the ID exists. It returns a row only when it created the task.
	create: `WITH t AS (
			INSERT INTO tasks (` + postgresColumns + `)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22,
				$23, $24, $25, $26, $27, $28, $29)
			ON CONFLICT (id) DO NOTHING
			RETURNING id, created_at
		), l AS (
			INSERT INTO task_labels (task_id, key, value, created_at)
			SELECT t.id, x.k, x.v, t.created_at FROM t, unnest($30::bytea[], $31::bytea[]) AS x (k, v)
		)
		SELECT created_at FROM t`,
	// update writes a record from its version (postgresUpdateSQL).
	update: postgresUpdateSQL(""),
	// move is update that also requires the stored record to be unfinished
	// and without a pod (Clusters.Move), checked on the row it locks as the
	// version is; moveState then tells why a move matched nothing.
	move:      postgresUpdateSQL(" AND NOT t.pod_created AND NOT t.terminal"),
	moveState: `SELECT version, nonce, pod_created, terminal FROM tasks WHERE id = $1`,
	get:       `SELECT ` + postgresColumns + ` FROM tasks WHERE id = $1`,
	version:   `SELECT version, nonce FROM tasks WHERE id = $1`,
	beginTerm: `INSERT INTO kubetask_terms (instance, epoch, started_at) VALUES ($1, 1, $2)
		ON CONFLICT (instance) DO UPDATE SET epoch = kubetask_terms.epoch + 1, started_at = excluded.started_at
		RETURNING epoch`,
	epoch: `SELECT epoch FROM kubetask_terms WHERE instance = $1`,
}

// postgresUpdateSQL is the statement that writes every column of a record
// but id and created_at (args: postgresUpdateArgs) if the stored version is
// the expected one, the stored record is the same use of the ID as the
// written one (sameUse: its nonce is the written one, $24, or it has none),
// the fence lets the write through and the further conditions cond on the
// row (t) hold. The version and nonce checks are part of the UPDATE: of
// concurrent updates from one version, the first to lock the row writes it
// and the others, re-checking the row once it is committed, match nothing.
// The labels follow in the same statement, only when the update matched
// and the labels changed (the stored JSON, canonical since
// json.Marshal sorts the keys, differs): keys no longer there are deleted,
// new ones inserted, changed ones updated; a label that stays is not
// touched. A fenced write ($25, the epoch, not 0) also requires the epoch
// to be its instance's current one, read under a share lock of the
// instance's term row: BeginTerm's update of that row waits for the write
// to commit, and a write that comes after it reads the new epoch.
func postgresUpdateSQL(cond string) string {
	return `WITH u AS (
			UPDATE tasks AS t SET
				namespace = $3, name = $4, executor = $5, task = $6, attempt = $7, phase = $8,
				reason = $9, message = $10, exit_code = $11, retryable = $12, result = $13,
				terminal = $14, cancelled_at = $15, next_attempt_at = $16, pod_created = $17,
				attempts = $18, updated_at = $19, version = $2 + 1, labels = $20, origin = $21,
				nonce = $24, epoch = $25, pod_uid = $26, pod_epoch = $27,
				submitted_by = $29, cancelled_by = $30, cluster = $31
			FROM (SELECT labels::text AS labels FROM tasks WHERE id = $1) AS old
			WHERE t.id = $1 AND t.version = $2 AND (t.nonce = ''::bytea OR t.nonce = $24)` + cond + `
				AND ($25 = 0 OR $25 = (SELECT epoch FROM kubetask_terms WHERE instance = $28::text FOR SHARE))
			RETURNING t.id, t.created_at, old.labels IS DISTINCT FROM $20::json::text AS relabel
		), d AS (
			DELETE FROM task_labels AS l USING u
			WHERE u.relabel AND l.task_id = u.id AND NOT (l.key = ANY ($22::bytea[]))
		), i AS (
			INSERT INTO task_labels (task_id, key, value, created_at)
			SELECT u.id, x.k, x.v, u.created_at FROM u, unnest($22::bytea[], $23::bytea[]) AS x (k, v)
			WHERE u.relabel AND NOT EXISTS (SELECT 1 FROM task_labels AS l WHERE l.task_id = u.id AND l.key = x.k AND l.value = x.v)
			ON CONFLICT (task_id, key) DO UPDATE SET value = excluded.value
		)
		SELECT created_at FROM u`
}

// errBadID reports an ID that PostgreSQL's text cannot hold.
var errBadID = errors.New("ID is not valid UTF-8 without NUL bytes")

// storableID reports whether id can be stored (text: valid UTF-8, no NUL);
// no record has another.
func storableID(id string) bool {
	return utf8.ValidString(id) && !strings.ContainsRune(id, 0)
}

// unavailable marks err with ErrUnavailable when it says that PostgreSQL
// cannot be reached or is going away (errors.Is(err, ErrUnavailable) then
// holds), and returns other errors as they are.
func unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || !postgresUnavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// postgresUnavailable reports whether err is a failure to reach the server
// rather than a verdict on the statement: no connection could be made, the
// connection broke, or the server is shutting down, starting or out of
// connections.
func postgresUnavailable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false // the caller's context, not the server
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"): // connection exception
			return true
		case pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return true
		case pe.Code == "53300": // too_many_connections
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// conn takes a connection from the pool for one call: the context's error if
// it ends first (nothing was sent), errClosed after Close.
func (s *postgresStore) conn(ctx context.Context) (*pgxpool.Conn, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		if s.closed.Load() {
			return nil, errClosed
		}
		return nil, unavailable(err)
	}
	return c, nil
}

// write runs fn on a connection with a context that the caller's
// cancellation does not interrupt: once a write is sent, it runs to its end,
// so that its error says whether it was applied.
func (s *postgresStore) write(ctx context.Context, fn func(ctx context.Context, c *pgxpool.Conn) error) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.conn(ctx)
	if err != nil {
		return timedOut(ctx, err)
	}
	defer c.Release()
	if err := ctx.Err(); err != nil {
		return timedOut(ctx, err)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.callTimeout)
	defer cancel()
	if err := fn(wctx, c); err != nil {
		if wctx.Err() != nil {
			return fmt.Errorf("%w: no answer from the server within %s; the write may or may not be applied: %w", ErrUnavailable, s.callTimeout, err)
		}
		return unavailable(err)
	}
	return nil
}

// errCallTimeout is the cause of a call's context ending at the call
// timeout (bound) rather than by its caller: the server did not answer in
// time, which is the store being unavailable, not the caller giving up.
var errCallTimeout = fmt.Errorf("%w: no answer from the server within the call timeout", ErrUnavailable)

// bound is ctx ending at the latest callTimeout from now, with cause
// errCallTimeout: a read's context.
func (s *postgresStore) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, s.callTimeout, errCallTimeout)
}

// timedOut marks err with ErrUnavailable when ctx, from bound, ended at the
// call timeout: a read over a silent connection then answers "unavailable"
// (HTTP 503, retried by clients) rather than a bare deadline (500). Errors
// of a call whose caller gave up, and other errors, are returned as they are.
func timedOut(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || !errors.Is(context.Cause(ctx), errCallTimeout) {
		return err
	}
	return fmt.Errorf("%w: %w", errCallTimeout, err)
}

func (s *postgresStore) Create(ctx context.Context, rec Record) (Record, bool, error) {
	if rec.ID == "" {
		return Record{}, false, errors.New("task record create: empty ID")
	}
	if !storableID(rec.ID) {
		return Record{}, false, fmt.Errorf("task record %q create: %w", rec.ID, errBadID)
	}
	now := time.Unix(0, s.clock.Now().UnixNano()).UTC()
	rec = rec.DeepCopy()
	rec.Version = 1
	rec.CreatedAt, rec.UpdatedAt = now, now
	args, err := postgresCreateArgs(rec)
	if err != nil {
		return Record{}, false, fmt.Errorf("task record %s create: %w", rec.ID, err)
	}
	var (
		out     Record
		created bool
	)
	err = s.write(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		// A record that exists is returned as it is; one that is deleted
		// between the insert and the read is created after all.
		for range 3 {
			var createdAt int64
			switch err := c.QueryRow(ctx, postgresSQL.create, args...).Scan(&createdAt); {
			case err == nil:
				out, created = rec, true
				return nil
			case !errors.Is(err, pgx.ErrNoRows):
				return err
			}
			got, err := scanPostgresRecord(c.QueryRow(ctx, postgresSQL.get, rec.ID))
			if err == nil {
				out = got
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		return errors.New("the record was created and deleted concurrently, three times")
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("task record %s create: %w", rec.ID, err)
	}
	return out, created, nil
}

func (s *postgresStore) Get(ctx context.Context, id string) (_ Record, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	defer func() { err = timedOut(ctx, err) }()
	c, err := s.conn(ctx)
	if err != nil {
		return Record{}, fmt.Errorf("task record %s: %w", id, err)
	}
	defer c.Release()
	if !storableID(id) {
		return Record{}, fmt.Errorf("task record %q: %w", id, ErrNotFound)
	}
	rec, err := scanPostgresRecord(c.QueryRow(ctx, postgresSQL.get, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("task record %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("task record %s: %w", id, unavailable(err))
	}
	return rec, nil
}

func (s *postgresStore) Update(ctx context.Context, rec Record) (Record, error) {
	rec = rec.DeepCopy()
	expected := rec.Version
	rec.Version = expected + 1
	rec.UpdatedAt = time.Unix(0, s.clock.Now().UnixNano()).UTC()
	args, err := postgresUpdateArgs(rec, expected)
	if err != nil {
		return Record{}, fmt.Errorf("task record %s update: %w", rec.ID, err)
	}
	err = s.write(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		if !storableID(rec.ID) {
			return ErrNotFound
		}
		var createdAt int64
		err := c.QueryRow(ctx, postgresSQL.update, args...).Scan(&createdAt)
		if errors.Is(err, pgx.ErrNoRows) {
			// Nothing written: the record read now tells why (updateRefused).
			var (
				stored      int64
				storedNonce []byte
			)
			switch err := c.QueryRow(ctx, postgresSQL.version, rec.ID).Scan(&stored, &storedNonce); {
			case errors.Is(err, pgx.ErrNoRows):
				return ErrNotFound
			case err != nil:
				return err
			}
			return updateRefused(rec, expected, stored, string(storedNonce))
		}
		if err != nil {
			return err
		}
		rec.CreatedAt = time.Unix(0, createdAt).UTC()
		return nil
	})
	if err != nil {
		return Record{}, fmt.Errorf("task record %s update: %w", rec.ID, err)
	}
	return rec, nil
}

func (s *postgresStore) BeginTerm(ctx context.Context, instance string) (int64, error) {
	var epoch int64
	err := s.write(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		return c.QueryRow(ctx, postgresSQL.beginTerm, instance, s.clock.Now().UnixNano()).Scan(&epoch)
	})
	if err != nil {
		return 0, fmt.Errorf("term of %s: %w", instance, err)
	}
	return epoch, nil
}

func (s *postgresStore) Epoch(ctx context.Context, instance string) (_ int64, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	defer func() { err = timedOut(ctx, err) }()
	c, err := s.conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("epoch of %s: %w", instance, err)
	}
	defer c.Release()
	var epoch int64
	if err := c.QueryRow(ctx, postgresSQL.epoch, instance).Scan(&epoch); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("epoch of %s: %w", instance, err)
	}
	return epoch, nil
}

func (s *postgresStore) List(ctx context.Context, opts ListOptions) (_ []Record, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	defer func() { err = timedOut(ctx, err) }()
	c, err := s.conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("task record list: %w", unavailable(err))
	}
	defer c.Release()
	q := `SELECT ` + postgresColumns + ` FROM tasks`
	var (
		where []string
		args  []any
	)
	if opts.Executor != "" {
		args = append(args, []byte(opts.Executor))
		where = append(where, fmt.Sprintf("executor = $%d", len(args)))
	}
	if opts.Cluster != "" {
		args = append(args, []byte(opts.Cluster))
		where = append(where, fmt.Sprintf("cluster = $%d", len(args)))
	}
	if opts.NonTerminal {
		where = append(where, "NOT terminal")
	}
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id"
	rows, err := c.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("task record list: %w", unavailable(err))
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		rec, err := scanPostgresRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("task record list: %w", unavailable(err))
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("task record list: %w", unavailable(err))
	}
	return out, nil
}

// Close makes later calls fail and waits until the calls in progress have
// returned their connections, then closes them. A second Close returns nil.
func (s *postgresStore) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.pool.Close()
	return nil
}

// postgresArgs returns rec's column values in postgresColumns order.
func postgresArgs(rec Record) ([]any, error) {
	var labels, attempts []byte // nil: NULL
	var err error
	if rec.Labels != nil {
		if labels, err = json.Marshal(rec.Labels); err != nil {
			return nil, fmt.Errorf("labels encoding: %w", err)
		}
	}
	if rec.Attempts != nil {
		if attempts, err = json.Marshal(rec.Attempts); err != nil {
			return nil, fmt.Errorf("attempts encoding: %w", err)
		}
	}
	for _, t := range []time.Time{rec.CancelledAt, rec.NextAttemptAt, rec.CreatedAt, rec.UpdatedAt} {
		if !t.IsZero() && !inUnixNanoRange(t) {
			return nil, fmt.Errorf("time %v out of the storable range", t)
		}
	}
	return []any{
		rec.ID, bytesOf(rec.Namespace), bytesOf(rec.Name), bytesOf(rec.Executor), rec.Task, int32(rec.Attempt), //nolint:gosec // attempts are few
		bytesOf(rec.Phase), bytesOf(rec.Reason), bytesOf(rec.Message), rec.ExitCode, rec.Retryable, rec.Result,
		rec.Terminal, nanosOrNil(rec.CancelledAt), nanosOrNil(rec.NextAttemptAt), rec.PodCreated,
		attempts, rec.CreatedAt.UnixNano(), rec.UpdatedAt.UnixNano(), rec.Version,
		labels, bytesOf(rec.Origin), bytesOf(rec.Nonce), rec.Epoch, bytesOf(rec.PodUID), rec.PodEpoch,
		rec.SubmittedBy.String(), rec.CancelledBy.String(), bytesOf(rec.Cluster),
	}, nil
}

// postgresCreateArgs returns postgresSQL.create's arguments: rec's columns
// and its labels as arrays.
func postgresCreateArgs(rec Record) ([]any, error) {
	args, err := postgresArgs(rec)
	if err != nil {
		return nil, err
	}
	keys, values := labelArrays(rec.Labels)
	return append(args, keys, values), nil
}

// postgresUpdateArgs returns postgresSQL.update's arguments: the ID, the
// expected version, the columns from namespace to attempts, updated_at,
// labels, origin, the labels as arrays, nonce, epoch, pod_uid, pod_epoch,
// the executor as text (for the fence), submitted_by, cancelled_by and
// cluster. created_at is not written and the new version is computed.
func postgresUpdateArgs(rec Record, expected int64) ([]any, error) {
	a, err := postgresArgs(rec) // in postgresColumns order
	if err != nil {
		return nil, err
	}
	keys, values := labelArrays(rec.Labels)
	args := append([]any{a[0], expected}, a[1:17]...)
	return append(args, a[18], a[20], a[21], keys, values, a[22], a[23], a[24], a[25], rec.Executor, a[26], a[27], a[28]), nil
}

// bytesOf returns s as a non-nil byte slice (an empty string is an empty
// bytea, not NULL).
func bytesOf(s string) []byte {
	return append([]byte{}, s...)
}

// nanosOrNil stores the zero time as NULL and any other as Unix nanoseconds.
func nanosOrNil(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	n := t.UnixNano()
	return &n
}

// labelArrays returns the labels as two parallel arrays, by key; empty (not
// NULL) for no labels.
func labelArrays(labels map[string]string) (keys, values [][]byte) {
	keys, values = [][]byte{}, [][]byte{}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		keys = append(keys, bytesOf(k))
		values = append(values, bytesOf(labels[k]))
	}
	return keys, values
}

func scanPostgresRecord(row pgx.Row) (Record, error) {
	var (
		rec                                                   Record
		namespace, name, executor, phase, reason, msg, origin []byte
		nonce, podUID, cluster                                []byte
		attempt                                               int32
		cancelledAt, nextAttemptAt                            *int64
		attempts, labels                                      []byte
		createdAt, updatedAt                                  int64
		submittedBy, cancelledBy                              string
	)
	if err := row.Scan(&rec.ID, &namespace, &name, &executor, &rec.Task, &attempt,
		&phase, &reason, &msg, &rec.ExitCode, &rec.Retryable, &rec.Result,
		&rec.Terminal, &cancelledAt, &nextAttemptAt, &rec.PodCreated,
		&attempts, &createdAt, &updatedAt, &rec.Version, &labels, &origin,
		&nonce, &rec.Epoch, &podUID, &rec.PodEpoch, &submittedBy, &cancelledBy, &cluster); err != nil {
		return Record{}, err
	}
	if err := parseActors(&rec, submittedBy, cancelledBy); err != nil {
		return Record{}, err
	}
	rec.Nonce, rec.PodUID, rec.Cluster = string(nonce), string(podUID), string(cluster)
	rec.Namespace, rec.Name, rec.Executor = string(namespace), string(name), string(executor)
	rec.Phase, rec.Reason, rec.Message, rec.Origin = string(phase), string(reason), string(msg), string(origin)
	rec.Attempt = int(attempt)
	if labels != nil {
		if err := json.Unmarshal(labels, &rec.Labels); err != nil {
			return Record{}, fmt.Errorf("task record %s labels decoding: %w", rec.ID, err)
		}
	}
	if attempts != nil {
		if err := json.Unmarshal(attempts, &rec.Attempts); err != nil {
			return Record{}, fmt.Errorf("task record %s attempts decoding: %w", rec.ID, err)
		}
	}
	if cancelledAt != nil {
		rec.CancelledAt = time.Unix(0, *cancelledAt).UTC()
	}
	if nextAttemptAt != nil {
		rec.NextAttemptAt = time.Unix(0, *nextAttemptAt).UTC()
	}
	rec.CreatedAt = time.Unix(0, createdAt).UTC()
	rec.UpdatedAt = time.Unix(0, updatedAt).UTC()
	return rec, nil
}
