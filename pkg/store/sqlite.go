package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver (pure Go)
)

// OpenSQLite opens the SQLite database at path, creating the file and its
// schema if needed, and returns a durable Store. It is safe for concurrent
// use. Another process that opens the same file waits on SQLite's lock for up
// to sqliteBusyTimeout (10s) before a write fails.
//
// Durability: once Create or Update returns nil, the write is committed in
// WAL mode with synchronous=FULL, so it survives the process being killed and
// the machine losing power. Times round-trip to the nanosecond and come back
// in UTC; non-zero times must lie within the range of time.UnixNano (years
// 1678 to 2262). nil and empty Task, Result and Attempts stay distinct.
//
// Group commit: one writer goroutine commits the writes of concurrent calls
// together, several per transaction, so one sync serves them all (see
// writeLoop). Each write keeps the semantics it has alone: its own
// compare-and-swap on Version (and Nonce), ErrConflict or ErrNotFound for
// that write only (the others in its transaction commit); of several
// Creates of one ID the first queued creates the record and the others
// return it with created=false. Get and List see every write whose call has returned.
//
// Errors and cancellation: an error from Create or Update means the write was
// not applied. A call whose context ends before the writer took its write
// into a transaction returns the context's error, and the write is never
// applied; once taken, the call waits for that one transaction and reports
// its outcome. If a transaction fails (an I/O error, or another process
// holding the lock past the busy timeout), every write in it fails with that
// error and none is applied; only a failing sync of the commit itself leaves
// the outcome unknown, as in any database.
//
// Close stops accepting writes (later calls fail), commits the writes already
// queued and answers their callers, then closes the database.
//
// A file that is not a SQLite database, or one whose schema is newer than
// this binary knows, is refused with an error that names path.
//
// Schema: a database of an earlier release is migrated forward when it is
// opened (see sqliteMigrations), in one transaction; migration 2 adds the
// labels, origin, page indexes, log archive and retention index to a
// version-1 database, and migration 5 the cluster column and its two
// indexes, which on a large file takes a while, once.
func OpenSQLite(ctx context.Context, path string) (Store, error) {
	return OpenSQLiteWithOptions(ctx, path, Options{})
}

// OpenSQLiteWithClock is OpenSQLite with the clock that sets CreatedAt and
// UpdatedAt, so tests can control them.
func OpenSQLiteWithClock(ctx context.Context, path string, clk clock.PassiveClock) (Store, error) {
	return OpenSQLiteWithOptions(ctx, path, Options{Clock: clk})
}

// OpenSQLiteWithOptions is OpenSQLite with options. The store also
// implements Pager, Logs, Retention and Clusters: Page serves every filter
// from an index (see sqlitePageSQL); AppendLog, DeleteFinishedBefore,
// PutCluster and Move are writes of the group-commit writer with the
// guarantees of Update above.
func OpenSQLiteWithOptions(ctx context.Context, path string, opts Options) (Store, error) {
	return openSQLiteStore(ctx, path, sqliteOptions{Options: opts})
}

// sqliteOptions are the unexported knobs of openSQLite, for tests and
// benchmarks, beside the exported ones.
type sqliteOptions struct {
	Options
	// oneTxPerWrite selects the write path before group commit: every Create
	// and Update runs its own transaction (and sync) in the caller's
	// goroutine, serialised on the one writer connection. The benchmark uses
	// it as the baseline.
	oneTxPerWrite bool
	// beforeCommit, when set, is called by the writer with the number of
	// writes applied in a group just before it commits them, so a test can
	// hold the writer there while it queues more writes.
	beforeCommit func(applied int)
	// retentionLogBytes replaces sqliteRetentionLogBytes when positive.
	retentionLogBytes int64
	// fullUpdates makes every Update set every column (no progress
	// statement), the benchmark's baseline.
	fullUpdates bool
}

func openSQLiteStore(ctx context.Context, path string, opts sqliteOptions) (Store, error) {
	s, err := openSQLite(ctx, path, opts)
	if err != nil {
		return nil, fmt.Errorf("task store %s: %w", path, err)
	}
	return s, nil
}

// sqliteBusyTimeout bounds how long a connection waits for another one's
// lock (another process holding the file, or a checkpoint) before failing.
const sqliteBusyTimeout = 10 * time.Second

// sqliteReaders is the number of connections serving Get and List. WAL lets
// them read while the single writer commits.
const sqliteReaders = 2

// sqliteMigrations are applied in order; schema_version holds how many ran.
// Append only: never edit a released migration.
var sqliteMigrations = []string{
	`CREATE TABLE tasks (
		id              TEXT    NOT NULL PRIMARY KEY,
		namespace       TEXT    NOT NULL,
		name            TEXT    NOT NULL,
		executor        TEXT    NOT NULL,
		task            BLOB,
		attempt         INTEGER NOT NULL,
		phase           TEXT    NOT NULL,
		reason          TEXT    NOT NULL,
		message         TEXT    NOT NULL,
		exit_code       INTEGER,
		retryable       INTEGER NOT NULL,
		result          BLOB,
		terminal        INTEGER NOT NULL,
		cancelled_at    INTEGER,
		next_attempt_at INTEGER,
		pod_created     INTEGER NOT NULL,
		attempts        TEXT,
		created_at      INTEGER NOT NULL,
		updated_at      INTEGER NOT NULL,
		version         INTEGER NOT NULL
	);
	CREATE INDEX tasks_by_executor ON tasks (executor, terminal, id);
	CREATE INDEX tasks_by_terminal ON tasks (terminal, id);`,

	// 2: what kubetask serve needs. Labels (JSON, NULL for nil) and origin;
	// one index per page filter, each ending in the page order (created_at,
	// id) so a filtered page is a range of one index read in order; the
	// labels as rows (task_labels, kept by triggers from tasks.labels, with
	// the immutable created_at copied so a label's range is in page order
	// too); the log archive (per-log state and chunks keyed by offset, so a
	// read from an offset is a range scan); a partial index of terminal
	// tasks by last update for retention. Deleting a task deletes its
	// labels and logs (trigger).
	`ALTER TABLE tasks ADD COLUMN labels TEXT;
	ALTER TABLE tasks ADD COLUMN origin TEXT NOT NULL DEFAULT '';
	CREATE INDEX tasks_by_created ON tasks (created_at, id);
	CREATE INDEX tasks_by_namespace ON tasks (namespace, created_at, id);
	CREATE INDEX tasks_by_namespace_phase ON tasks (namespace, phase, created_at, id);
	CREATE INDEX tasks_by_phase ON tasks (phase, created_at, id);
	CREATE INDEX tasks_by_reason ON tasks (reason, created_at, id);
	CREATE INDEX tasks_by_name ON tasks (name, created_at, id);
	CREATE INDEX tasks_by_terminal_created ON tasks (terminal, created_at, id);
	CREATE INDEX tasks_finished ON tasks (updated_at, id) WHERE terminal = 1;
	CREATE TABLE task_labels (
		task_id    TEXT    NOT NULL,
		key        TEXT    NOT NULL,
		value      TEXT    NOT NULL,
		created_at INTEGER NOT NULL,
		PRIMARY KEY (task_id, key)
	) WITHOUT ROWID;
	CREATE INDEX task_labels_by_value ON task_labels (key, value, created_at, task_id);
	CREATE TRIGGER tasks_labels_insert AFTER INSERT ON tasks WHEN NEW.labels IS NOT NULL BEGIN
		INSERT INTO task_labels (task_id, key, value, created_at)
			SELECT NEW.id, key, value, NEW.created_at FROM json_each(NEW.labels);
	END;
	CREATE TRIGGER tasks_labels_update AFTER UPDATE OF labels ON tasks
	WHEN OLD.labels IS NOT NEW.labels BEGIN
		DELETE FROM task_labels WHERE task_id = OLD.id;
		INSERT INTO task_labels (task_id, key, value, created_at)
			SELECT NEW.id, key, value, NEW.created_at FROM json_each(NEW.labels);
	END;
	CREATE TABLE logs (
		task_id   TEXT    NOT NULL,
		attempt   INTEGER NOT NULL,
		container TEXT    NOT NULL,
		size      INTEGER NOT NULL,
		complete  INTEGER NOT NULL,
		truncated INTEGER NOT NULL,
		cursor    BLOB,
		PRIMARY KEY (task_id, attempt, container)
	) WITHOUT ROWID;
	CREATE TABLE log_chunks (
		task_id   TEXT    NOT NULL,
		attempt   INTEGER NOT NULL,
		container TEXT    NOT NULL,
		offset    INTEGER NOT NULL,
		data      BLOB    NOT NULL,
		PRIMARY KEY (task_id, attempt, container, offset)
	);
	CREATE TRIGGER tasks_delete AFTER DELETE ON tasks BEGIN
		DELETE FROM task_labels WHERE task_id = OLD.id;
		DELETE FROM log_chunks WHERE task_id = OLD.id;
		DELETE FROM logs WHERE task_id = OLD.id;
	END;`,

	// 3: the fence (docs/executor.md). Each executor instance's term epoch,
	// raised by BeginTerm; a record's nonce, the epoch of its last fenced
	// write, and its current attempt's pod (UID and creating epoch).
	`ALTER TABLE tasks ADD COLUMN nonce TEXT NOT NULL DEFAULT '';
	ALTER TABLE tasks ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE tasks ADD COLUMN pod_uid TEXT NOT NULL DEFAULT '';
	ALTER TABLE tasks ADD COLUMN pod_epoch INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE executor_terms (
		instance   TEXT    NOT NULL PRIMARY KEY,
		epoch      INTEGER NOT NULL,
		started_at INTEGER NOT NULL
	) WITHOUT ROWID;`,

	// 4: who submitted (or reran) each task and who cancelled it (Actor,
	// JSON; '' when unknown).
	`ALTER TABLE tasks ADD COLUMN submitted_by TEXT NOT NULL DEFAULT '';
	ALTER TABLE tasks ADD COLUMN cancelled_by TEXT NOT NULL DEFAULT '';`,

	// 5: many clusters (docs/multicluster.md). The cluster each task is
	// placed on ('' for a record written before, or not placed), with an
	// index for List's filter (as tasks_by_executor) and one for Page's (in
	// page order, as the other page indexes); and the clusters' rows, their
	// state, since when (Unix nanoseconds) and why, labels (JSON, NULL for
	// nil), mode and version (Clusters).
	`ALTER TABLE tasks ADD COLUMN cluster TEXT NOT NULL DEFAULT '';
	CREATE INDEX tasks_by_cluster ON tasks (cluster, terminal, id);
	CREATE INDEX tasks_by_cluster_created ON tasks (cluster, created_at, id);
	CREATE TABLE clusters (
		name       TEXT    NOT NULL PRIMARY KEY,
		state      TEXT    NOT NULL,
		since      INTEGER NOT NULL,
		reason     TEXT    NOT NULL,
		message    TEXT    NOT NULL,
		labels     TEXT,
		mode       TEXT    NOT NULL,
		version    INTEGER NOT NULL,
		updated_at INTEGER NOT NULL
	) WITHOUT ROWID;`,
}

var (
	_ Store     = (*sqliteStore)(nil)
	_ Pager     = (*sqliteStore)(nil)
	_ Logs      = (*sqliteStore)(nil)
	_ Retention = (*sqliteStore)(nil)
)

type sqliteStore struct {
	clock      clock.PassiveClock
	maxLogSize int64
	// w is the only connection that writes: one writer serialises Create and
	// Update in-process instead of making them wait on SQLite's file lock.
	w *sql.DB
	// r serves Get and List on read-only connections.
	r *sql.DB
	// stmts are the write statements, prepared on w.
	stmts *sqliteWriteStmts
	// get and epoch are Get's and Epoch's statements on r, prepared once
	// (database/sql prepares each on a connection the first time it runs
	// there and keeps it): a query string is parsed and planned again at
	// every call, about half of a Get's time.
	get, epoch *sql.Stmt

	oneTxPerWrite     bool
	fullUpdates       bool
	beforeCommit      func(applied int)
	retentionLogBytes int64

	// mu guards closed and every send on queue: Close holds it exclusively
	// to close queue, so no call sends on a closed channel and no write
	// slips in after the writer drained the queue.
	mu     sync.RWMutex
	closed bool
	// queue carries writes to writeLoop, the one goroutine that commits them.
	queue chan *sqliteWrite
	// writerDone is closed when writeLoop has drained queue and returned.
	writerDone chan struct{}
	// commits counts writeLoop's committed transactions (a benchmark metric).
	commits atomic.Int64
}

func openSQLite(ctx context.Context, path string, opts sqliteOptions) (_ *sqliteStore, err error) {
	if path == "" || strings.ContainsRune(path, '?') || strings.HasPrefix(path, "file:") {
		return nil, errors.New("path must be a plain file name (no '?', no file: URI)")
	}
	pragmas := []string{
		fmt.Sprintf("busy_timeout(%d)", sqliteBusyTimeout.Milliseconds()),
		"journal_mode(WAL)",
		"synchronous(FULL)",
	}
	dsn := path + "?_txlock=immediate"
	for _, p := range pragmas {
		dsn += "&_pragma=" + p
	}
	s := &sqliteStore{
		clock:         opts.clock(),
		maxLogSize:    opts.maxLogSize(),
		oneTxPerWrite: opts.oneTxPerWrite,
		fullUpdates:   opts.fullUpdates,
		beforeCommit:  opts.beforeCommit,

		retentionLogBytes: opts.retentionLogBytes,
	}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	if s.w, err = sql.Open("sqlite", dsn); err != nil {
		return nil, fmt.Errorf("database open: %w", err)
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	if s.stmts, err = prepareWriteStmts(ctx, s.w); err != nil {
		return nil, err
	}
	if s.r, err = sql.Open("sqlite", dsn+"&_pragma=query_only(1)&_pragma=mmap_size(2147418112)"); err != nil {
		return nil, fmt.Errorf("database open: %w", err)
	}
	s.r.SetMaxOpenConns(sqliteReaders)
	s.r.SetMaxIdleConns(sqliteReaders)
	if err := s.r.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("database open: %w", err)
	}
	if s.get, err = s.r.PrepareContext(ctx, `SELECT `+sqliteColumns+` FROM tasks WHERE id = ?`); err != nil {
		return nil, fmt.Errorf("database open: Get's statement: %w", err)
	}
	if s.epoch, err = s.r.PrepareContext(ctx, `SELECT epoch FROM executor_terms WHERE instance = ?`); err != nil {
		return nil, fmt.Errorf("database open: Epoch's statement: %w", err)
	}
	if !s.oneTxPerWrite {
		s.queue = make(chan *sqliteWrite, sqliteMaxGroup)
		s.writerDone = make(chan struct{})
		go s.writeLoop()
	}
	return s, nil
}

// migrate creates or upgrades the schema in one transaction.
func (s *sqliteStore) migrate(ctx context.Context) error {
	return migrateSQLite(ctx, s.w, sqliteMigrations)
}

// migrateSQLite brings the schema of db to len(migrations) in one
// transaction.
func migrateSQLite(ctx context.Context, db *sql.DB, migrations []string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("database open: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	var version int
	switch err := tx.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&version); {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version) VALUES (0)`); err != nil {
			return fmt.Errorf("schema version: %w", err)
		}
	case err != nil:
		return fmt.Errorf("schema version: %w", err)
	}
	if version > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this binary's %d", version, len(migrations))
	}
	if version == len(migrations) {
		return nil
	}
	for i := version; i < len(migrations); i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return fmt.Errorf("schema migration %d: %w", i+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, len(migrations)); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("schema migration commit: %w", err)
	}
	return nil
}

// sqliteColumns are a record's columns, in recordArgs' and scanRecord's order.
const sqliteColumns = `id, namespace, name, executor, task, attempt, phase, reason, message,
	exit_code, retryable, result, terminal, cancelled_at, next_attempt_at, pod_created,
	attempts, created_at, updated_at, version, labels, origin, nonce, epoch, pod_uid, pod_epoch,
	submitted_by, cancelled_by, cluster`

func (s *sqliteStore) Create(ctx context.Context, rec Record) (Record, bool, error) {
	if rec.ID == "" {
		return Record{}, false, errors.New("task record create: empty ID")
	}
	now := s.clock.Now()
	rec = rec.DeepCopy()
	rec.Version = 1
	rec.CreatedAt, rec.UpdatedAt = now, now
	args, err := recordArgs(rec)
	if err != nil {
		return Record{}, false, fmt.Errorf("task record %s create: %w", rec.ID, err)
	}
	res := s.write(ctx, &sqliteWrite{create: true, rec: rec, args: args})
	if res.err != nil {
		return Record{}, false, fmt.Errorf("task record %s create: %w", rec.ID, res.err)
	}
	return res.rec, res.created, nil
}

func (s *sqliteStore) Get(ctx context.Context, id string) (Record, error) {
	rec, err := scanRecord(s.get.QueryRowContext(ctx, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, fmt.Errorf("task record %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("task record %s: %w", id, err)
	}
	return rec, nil
}

func (s *sqliteStore) Update(ctx context.Context, rec Record) (Record, error) {
	rec = rec.DeepCopy()
	expected := rec.Version
	rec.Version = expected + 1
	rec.UpdatedAt = s.clock.Now()
	rec.CreatedAt = time.Time{} // kept as stored; the caller's is ignored
	args, err := recordArgs(rec)
	if err != nil {
		return Record{}, fmt.Errorf("task record %s update: %w", rec.ID, err)
	}
	// args follow sqliteColumns; id (0) and created_at (17) are not written,
	// and the WHERE clause takes the ID, the expected version, the nonce and
	// the fence (see sqliteWriteSQL.update).
	// progress (sqliteWriteSQL.progress) leaves out namespace (1), name (2),
	// executor (3), terminal (12) and cluster (28) and requires them as they
	// are.
	progress := append(append(append(args[4:12:12], args[13:17]...), args[18:28]...),
		rec.ID, expected, rec.Nonce, args[1], args[2], args[3], args[28], args[12], rec.Epoch, rec.Epoch, rec.Executor)
	args = sqliteUpdateArgs(args, rec, expected)
	if s.fullUpdates {
		progress = nil
	}
	res := s.write(ctx, &sqliteWrite{rec: rec, expected: expected, args: args, progress: progress})
	if res.err != nil {
		return Record{}, fmt.Errorf("task record %s update: %w", rec.ID, res.err)
	}
	return res.rec, nil
}

// sqliteUpdateArgs returns sqliteWriteSQL.update's arguments from rec's columns
// (args, in sqliteColumns order): every column but id (0) and created_at
// (17), then the ID, the expected version, the nonce and the fence.
func sqliteUpdateArgs(args []any, rec Record, expected int64) []any {
	return append(append(args[1:17:17], args[18:]...), rec.ID, expected, rec.Nonce, rec.Epoch, rec.Epoch, rec.Executor)
}

func (s *sqliteStore) BeginTerm(ctx context.Context, instance string) (int64, error) {
	res := s.write(ctx, &sqliteWrite{run: func(ctx context.Context, tx *sql.Tx, st *sqliteWriteStmts) (sqliteResult, error) {
		var epoch int64
		if err := tx.StmtContext(ctx, st.beginTerm).QueryRowContext(ctx, instance, s.clock.Now().UnixNano()).Scan(&epoch); err != nil {
			return sqliteResult{}, err
		}
		return sqliteResult{epoch: epoch}, nil
	}})
	if res.err != nil {
		return 0, fmt.Errorf("term of %s: %w", instance, res.err)
	}
	return res.epoch, nil
}

func (s *sqliteStore) Epoch(ctx context.Context, instance string) (int64, error) {
	var epoch int64
	err := s.epoch.QueryRowContext(ctx, instance).Scan(&epoch)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("epoch of %s: %w", instance, err)
	}
	return epoch, nil
}

func (s *sqliteStore) List(ctx context.Context, opts ListOptions) ([]Record, error) {
	q := `SELECT ` + sqliteColumns + ` FROM tasks`
	var where []string
	var args []any
	if opts.Executor != "" {
		where, args = append(where, "executor = ?"), append(args, opts.Executor)
	}
	if opts.Cluster != "" {
		where, args = append(where, "cluster = ?"), append(args, opts.Cluster)
	}
	if opts.NonTerminal {
		where = append(where, "terminal = 0")
	}
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ") //nolint:gosec // the clauses are constants; values are bound parameters
	}
	q += " ORDER BY id"
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("task record list: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("task record list: %w", err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("task record list: %w", err)
	}
	return out, nil
}

// Close stops accepting writes, waits until the writer has committed the
// ones already queued and answered their callers, and closes the database;
// calls after Close fail. A second Close returns nil.
func (s *sqliteStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.queue != nil {
		close(s.queue)
	}
	s.mu.Unlock()
	if s.writerDone != nil {
		<-s.writerDone
	}
	if s.stmts != nil {
		s.stmts.close()
	}
	var errs []error
	for _, st := range []*sql.Stmt{s.get, s.epoch} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	for _, db := range []*sql.DB{s.r, s.w} {
		if db != nil {
			errs = append(errs, db.Close())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("task store close: %w", err)
	}
	return nil
}

// recordArgs returns rec's column values in sqliteColumns order.
func recordArgs(rec Record) ([]any, error) {
	var exitCode sql.NullInt32
	if rec.ExitCode != nil {
		exitCode = sql.NullInt32{Int32: *rec.ExitCode, Valid: true}
	}
	var labels sql.NullString
	if rec.Labels != nil {
		b, err := json.Marshal(rec.Labels) // keys sorted: equal maps, equal text
		if err != nil {
			return nil, fmt.Errorf("labels encoding: %w", err)
		}
		labels = sql.NullString{String: string(b), Valid: true}
	}
	var attempts sql.NullString
	if rec.Attempts != nil {
		b, err := json.Marshal(rec.Attempts)
		if err != nil {
			return nil, fmt.Errorf("attempts encoding: %w", err)
		}
		attempts = sql.NullString{String: string(b), Valid: true}
	}
	for _, t := range []time.Time{rec.CancelledAt, rec.NextAttemptAt, rec.CreatedAt, rec.UpdatedAt} {
		if !t.IsZero() && !inUnixNanoRange(t) {
			return nil, fmt.Errorf("time %v out of the storable range", t)
		}
	}
	return []any{
		rec.ID, rec.Namespace, rec.Name, rec.Executor, blobArg(rec.Task), rec.Attempt,
		rec.Phase, rec.Reason, rec.Message, exitCode, rec.Retryable, blobArg(rec.Result),
		rec.Terminal, timeArg(rec.CancelledAt), timeArg(rec.NextAttemptAt), rec.PodCreated,
		attempts, rec.CreatedAt.UnixNano(), rec.UpdatedAt.UnixNano(), rec.Version,
		labels, rec.Origin, rec.Nonce, rec.Epoch, rec.PodUID, rec.PodEpoch,
		rec.SubmittedBy.String(), rec.CancelledBy.String(), rec.Cluster,
	}, nil
}

var (
	minUnixNano = time.Unix(0, -1<<63)
	maxUnixNano = time.Unix(0, 1<<63-1)
)

func inUnixNanoRange(t time.Time) bool {
	return !t.Before(minUnixNano) && !t.After(maxUnixNano)
}

// blobArg keeps nil (NULL) distinct from empty (a zero-length blob).
func blobArg(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}

// timeArg stores the zero time as NULL and any other as Unix nanoseconds.
func timeArg(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixNano(), Valid: true}
}

type scanner interface{ Scan(dest ...any) error }

func scanRecord(row scanner) (Record, error) {
	var (
		rec                        Record
		task, result               nullBlob
		exitCode                   sql.NullInt32
		cancelledAt, nextAttemptAt sql.NullInt64
		attempts, labels           sql.NullString
		createdAt, updatedAt       int64
		submittedBy, cancelledBy   string
	)
	if err := row.Scan(&rec.ID, &rec.Namespace, &rec.Name, &rec.Executor, &task, &rec.Attempt,
		&rec.Phase, &rec.Reason, &rec.Message, &exitCode, &rec.Retryable, &result,
		&rec.Terminal, &cancelledAt, &nextAttemptAt, &rec.PodCreated,
		&attempts, &createdAt, &updatedAt, &rec.Version, &labels, &rec.Origin,
		&rec.Nonce, &rec.Epoch, &rec.PodUID, &rec.PodEpoch, &submittedBy, &cancelledBy, &rec.Cluster); err != nil {
		return Record{}, err
	}
	if err := parseActors(&rec, submittedBy, cancelledBy); err != nil {
		return Record{}, err
	}
	if labels.Valid {
		if err := json.Unmarshal([]byte(labels.String), &rec.Labels); err != nil {
			return Record{}, fmt.Errorf("task record %s labels decoding: %w", rec.ID, err)
		}
	}
	rec.Task, rec.Result = task.b, result.b
	if exitCode.Valid {
		rec.ExitCode = &exitCode.Int32
	}
	if attempts.Valid {
		if err := json.Unmarshal([]byte(attempts.String), &rec.Attempts); err != nil {
			return Record{}, fmt.Errorf("task record %s attempts decoding: %w", rec.ID, err)
		}
	}
	rec.CancelledAt = timeFromNull(cancelledAt)
	rec.NextAttemptAt = timeFromNull(nextAttemptAt)
	rec.CreatedAt = time.Unix(0, createdAt).UTC()
	rec.UpdatedAt = time.Unix(0, updatedAt).UTC()
	return rec, nil
}

func timeFromNull(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return time.Unix(0, n.Int64).UTC()
}

// nullBlob scans a BLOB column, NULL into nil and a zero-length blob into
// an empty, non-nil slice.
type nullBlob struct{ b []byte }

func (n *nullBlob) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		n.b = nil
	case []byte:
		n.b = append([]byte{}, v...)
	case string:
		n.b = append([]byte{}, v...)
	default:
		return fmt.Errorf("blob column: unexpected %T", src)
	}
	return nil
}
