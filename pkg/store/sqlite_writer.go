package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// sqliteMaxGroup caps the writes in one transaction, so a long queue is
// committed in several syncs rather than making its first callers wait for
// all of it.
const sqliteMaxGroup = 128

// sqliteWrite is one write call (Create, Update, AppendLog,
// DeleteFinishedBefore, BeginTerm, PutCluster, Move) on its way through the
// writer.
type sqliteWrite struct {
	// run, when set, applies the write (all but Create and Update);
	// otherwise it is a Create (create set) or an Update of rec.
	run    func(ctx context.Context, tx *sql.Tx, st *sqliteWriteStmts) (sqliteResult, error)
	create bool
	// rec is the record as it will be stored (Version and times set).
	rec Record
	// expected is the version an Update requires the stored record to have.
	expected int64
	// args are the statement's arguments: rec's columns for an insert, the
	// updated columns, ID and expected version for an update. progress are
	// an update's arguments of sqliteWriteSQL.progress (nil: update only).
	args, progress []any
	// state decides, once, whether the writer applies the write or its
	// caller gave up on it: writePending, then writeTaken or writeAbandoned.
	state atomic.Int32
	// done receives the outcome of a taken write; buffered, so the writer
	// never waits for a caller.
	done chan sqliteResult
}

const (
	writePending int32 = iota
	writeTaken
	writeAbandoned
)

// take claims w for a transaction; false means its caller abandoned it.
func (w *sqliteWrite) take() bool { return w.state.CompareAndSwap(writePending, writeTaken) }

// abandon withdraws w; false means the writer has already taken it.
func (w *sqliteWrite) abandon() bool { return w.state.CompareAndSwap(writePending, writeAbandoned) }

// sqliteResult is the outcome of one write.
type sqliteResult struct {
	rec     Record
	created bool
	// log is the log's info after an AppendLog (also with ErrLogOffset).
	log LogInfo
	// deleted is the number of tasks DeleteFinishedBefore deleted.
	deleted int
	// epoch is the epoch BeginTerm set.
	epoch int64
	// cluster is the row PutCluster wrote.
	cluster Cluster
	err     error
}

// write applies w and returns its outcome once it is committed, or the
// reason it was not applied (see OpenSQLite for the guarantees).
func (s *sqliteStore) write(ctx context.Context, w *sqliteWrite) sqliteResult {
	if err := ctx.Err(); err != nil {
		return sqliteResult{err: err}
	}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return sqliteResult{err: errClosed}
	}
	if s.oneTxPerWrite {
		defer s.mu.RUnlock()
		return s.writeAlone(ctx, w)
	}
	w.done = make(chan sqliteResult, 1)
	select {
	case s.queue <- w:
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return sqliteResult{err: ctx.Err()}
	}
	select {
	case res := <-w.done:
		return res
	case <-ctx.Done():
		if w.abandon() {
			return sqliteResult{err: ctx.Err()}
		}
		// Already in a transaction: its outcome is this call's, so the
		// caller never has to guess whether the write was applied.
		return <-w.done
	}
}

// writeLoop is the writer goroutine. Whenever it is free it takes every
// write queued by then, up to sqliteMaxGroup, and commits them in one
// transaction: natural batching, so a lone write is committed at once and
// writes that arrive during a commit share the next one. It returns when
// Close has closed the queue and every queued write is answered.
func (s *sqliteStore) writeLoop() {
	defer close(s.writerDone)
	group := make([]*sqliteWrite, 0, sqliteMaxGroup)
	for w := range s.queue {
		group = append(group, w)
	fill:
		for len(group) < sqliteMaxGroup {
			select {
			case w, ok := <-s.queue:
				if !ok {
					break fill
				}
				group = append(group, w)
			default:
				break fill
			}
		}
		s.commitGroup(group)
		clear(group)
		group = group[:0]
	}
}

// commitGroup applies group's writes in queue order in one transaction and
// commits it. Each taken write gets its own statement's outcome once the
// commit succeeded, or the transaction's error (and is not applied) if the
// transaction failed; an abandoned write is skipped.
func (s *sqliteStore) commitGroup(group []*sqliteWrite) {
	// Not a caller's context: one caller giving up must not fail the others.
	ctx := context.Background()
	results := make([]sqliteResult, len(group))
	taken := make([]bool, len(group))
	fail := func(err error) {
		for i, w := range group {
			if taken[i] || w.take() {
				w.done <- sqliteResult{err: err}
			}
		}
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		fail(fmt.Errorf("transaction begin: %w", err))
		return
	}
	defer tx.Rollback()
	applied := 0
	for i, w := range group {
		if !w.take() {
			continue
		}
		taken[i] = true
		if results[i], err = s.stmts.apply(ctx, tx, w); err != nil {
			fail(fmt.Errorf("group of %d writes: %w", len(group), err))
			return
		}
		applied++
	}
	if s.beforeCommit != nil {
		s.beforeCommit(applied)
	}
	if err := tx.Commit(); err != nil {
		fail(fmt.Errorf("group of %d writes commit: %w", len(group), err))
		return
	}
	s.commits.Add(1)
	for i, w := range group {
		if taken[i] {
			w.done <- results[i]
		}
	}
}

// writeAlone is the write path before group commit, kept as the benchmark's
// baseline (sqliteOptions.oneTxPerWrite): w in a transaction of its own,
// begun and committed in the caller's goroutine.
func (s *sqliteStore) writeAlone(ctx context.Context, w *sqliteWrite) sqliteResult {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return sqliteResult{err: fmt.Errorf("transaction begin: %w", err)}
	}
	defer tx.Rollback()
	res, err := s.stmts.apply(ctx, tx, w)
	if err != nil {
		return sqliteResult{err: err}
	}
	if res.err != nil {
		return res
	}
	if err := tx.Commit(); err != nil {
		return sqliteResult{err: fmt.Errorf("commit: %w", err)}
	}
	return res
}

// apply runs w's statements in tx. The result holds w's own outcome,
// including ErrConflict and ErrNotFound, which leave tx as it was; a
// non-nil error is a failed write statement, after which tx must be rolled
// back.
func (st *sqliteWriteStmts) apply(ctx context.Context, tx *sql.Tx, w *sqliteWrite) (sqliteResult, error) {
	switch {
	case w.run != nil:
		return w.run(ctx, tx, st)
	case w.create:
		return st.applyCreate(ctx, tx, w)
	default:
		return st.applyUpdate(ctx, tx, w)
	}
}

// sqliteWriteSQL are the write path's statements, prepared once on the
// writer connection (preparing a statement costs about as much as running it).
var sqliteWriteSQL = struct {
	insert, selectByID, update, progress, version                   string
	taskNonce, logState, logLastByte, logChunk, logUpsert, finished string
	deleteTask, beginTerm, move, moveState                          string
}{
	insert: `INSERT INTO tasks (` + sqliteColumns + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO NOTHING`,
	selectByID: `SELECT ` + sqliteColumns + ` FROM tasks WHERE id = ?`,
	// The version and nonce checks are part of the statement, so a conflict
	// writes nothing and leaves the rest of the transaction alone.
	update: sqliteUpdateSQL(""),
	// progress is update for the common case, tried first: the task's
	// namespace, name, executor, cluster and terminal flag stay as stored.
	// It leaves them out of the SET list, and so leaves alone the seven
	// indexes that hold only them and the immutable created_at and id
	// (SQLite rewrites an index's entry whenever one of its columns is SET,
	// equal or not): with the five of schema version 4, 7 WAL pages per
	// update instead of 12 (docs/benchmarks.md). Like update it requires the
	// stored version and the same use of the ID (sqliteUpdateSQL). No row
	// means one of them changed, a conflict, a fence or no record; update
	// then writes or tells which.
	progress: `UPDATE tasks SET
		task = ?, attempt = ?, phase = ?, reason = ?,
		message = ?, exit_code = ?, retryable = ?, result = ?, cancelled_at = ?,
		next_attempt_at = ?, pod_created = ?, attempts = ?, updated_at = ?, version = ?,
		labels = ?, origin = ?, nonce = ?, epoch = ?, pod_uid = ?, pod_epoch = ?,
		submitted_by = ?, cancelled_by = ?
		WHERE id = ? AND version = ? AND (nonce = '' OR nonce = ?)
		AND namespace = ? AND name = ? AND executor = ? AND cluster = ? AND terminal = ?
		AND (? = 0 OR ? = (SELECT epoch FROM executor_terms WHERE instance = ?))
		RETURNING created_at`,
	// move is update that also requires the stored record to be unfinished
	// and without a pod (Clusters.Move); moveState then tells why a move
	// matched nothing.
	move:      sqliteUpdateSQL(" AND pod_created = 0 AND terminal = 0"),
	moveState: `SELECT version, nonce, pod_created, terminal FROM tasks WHERE id = ?`,
	beginTerm: `INSERT INTO executor_terms (instance, epoch, started_at) VALUES (?, 1, ?)
		ON CONFLICT (instance) DO UPDATE SET epoch = epoch + 1, started_at = excluded.started_at
		RETURNING epoch`,
	version:   `SELECT version, nonce FROM tasks WHERE id = ?`,
	taskNonce: `SELECT nonce FROM tasks WHERE id = ?`,
	logState: `SELECT size, complete, truncated, cursor FROM logs
		WHERE task_id = ? AND attempt = ? AND container = ?`,
	logLastByte: `SELECT substr(data, -1) FROM log_chunks
		WHERE task_id = ? AND attempt = ? AND container = ? ORDER BY offset DESC LIMIT 1`,
	logChunk: `INSERT INTO log_chunks (task_id, attempt, container, offset, data) VALUES (?, ?, ?, ?, ?)`,
	logUpsert: `INSERT INTO logs (task_id, attempt, container, size, complete, truncated, cursor)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (task_id, attempt, container) DO UPDATE SET
		size = excluded.size, complete = excluded.complete, truncated = excluded.truncated,
		cursor = excluded.cursor`,
	// The oldest terminal tasks, from the partial index of terminal tasks,
	// with the size of their logs.
	finished: `SELECT id, (SELECT coalesce(sum(size), 0) FROM logs WHERE logs.task_id = tasks.id)
		FROM tasks INDEXED BY tasks_finished
		WHERE terminal = 1 AND updated_at < ? ORDER BY updated_at, id LIMIT ?`,
	// The tasks_delete trigger deletes the task's labels and logs with it.
	deleteTask: `DELETE FROM tasks WHERE id = ?`,
}

// sqliteUpdateSQL is the statement that writes every column of a record
// but id and created_at (args: sqliteUpdateArgs), if the stored version is the
// expected one, the stored record is the same use of the ID as the written
// one (sameUse: its nonce is the written one, or it has none), the fence
// lets the write through, and the further conditions cond hold. The ID
// stays the lookup by the primary key; the rest are checks of that row.
func sqliteUpdateSQL(cond string) string {
	return `UPDATE tasks SET
		namespace = ?, name = ?, executor = ?, task = ?, attempt = ?, phase = ?, reason = ?,
		message = ?, exit_code = ?, retryable = ?, result = ?, terminal = ?, cancelled_at = ?,
		next_attempt_at = ?, pod_created = ?, attempts = ?, updated_at = ?, version = ?,
		labels = ?, origin = ?, nonce = ?, epoch = ?, pod_uid = ?, pod_epoch = ?,
		submitted_by = ?, cancelled_by = ?, cluster = ?
		WHERE id = ? AND version = ? AND (nonce = '' OR nonce = ?)` + cond + `
		AND (? = 0 OR ? = (SELECT epoch FROM executor_terms WHERE instance = ?))
		RETURNING created_at`
}

// sqliteWriteStmts are sqliteWriteSQL prepared on the writer connection.
type sqliteWriteStmts struct {
	insert, selectByID, update, progress, version                   *sql.Stmt
	taskNonce, logState, logLastByte, logChunk, logUpsert, finished *sql.Stmt
	deleteTask, beginTerm, move, moveState                          *sql.Stmt
}

func (st *sqliteWriteStmts) all() []struct {
	stmt **sql.Stmt
	sql  string
} {
	q := &sqliteWriteSQL
	return []struct {
		stmt **sql.Stmt
		sql  string
	}{
		{&st.insert, q.insert}, {&st.selectByID, q.selectByID}, {&st.update, q.update},
		{&st.progress, q.progress}, {&st.version, q.version}, {&st.taskNonce, q.taskNonce}, {&st.logState, q.logState},
		{&st.logLastByte, q.logLastByte}, {&st.logChunk, q.logChunk}, {&st.logUpsert, q.logUpsert},
		{&st.finished, q.finished}, {&st.deleteTask, q.deleteTask}, {&st.beginTerm, q.beginTerm},
		{&st.move, q.move}, {&st.moveState, q.moveState},
	}
}

func prepareWriteStmts(ctx context.Context, db *sql.DB) (*sqliteWriteStmts, error) {
	st := &sqliteWriteStmts{}
	for _, p := range st.all() {
		var err error
		if *p.stmt, err = db.PrepareContext(ctx, p.sql); err != nil {
			st.close()
			return nil, fmt.Errorf("statement prepare: %w", err)
		}
	}
	return st, nil
}

func (st *sqliteWriteStmts) close() {
	for _, p := range st.all() {
		if *p.stmt != nil {
			_ = (*p.stmt).Close()
		}
	}
}

func (st *sqliteWriteStmts) applyCreate(ctx context.Context, tx *sql.Tx, w *sqliteWrite) (sqliteResult, error) {
	res, err := tx.StmtContext(ctx, st.insert).ExecContext(ctx, w.args...)
	if err != nil {
		return sqliteResult{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return sqliteResult{}, err
	}
	if n == 1 {
		return sqliteResult{rec: w.rec, created: true}, nil
	}
	// The ID exists, maybe from an earlier write of this transaction: return
	// the stored record, not ours. A failed read changes nothing, so it
	// fails this write only.
	rec, err := scanRecord(tx.StmtContext(ctx, st.selectByID).QueryRowContext(ctx, w.rec.ID))
	if err != nil {
		return sqliteResult{err: err}, nil
	}
	return sqliteResult{rec: rec}, nil
}

func (st *sqliteWriteStmts) applyUpdate(ctx context.Context, tx *sql.Tx, w *sqliteWrite) (sqliteResult, error) {
	var createdAt int64
	err := sql.ErrNoRows
	if w.progress != nil {
		err = tx.StmtContext(ctx, st.progress).QueryRowContext(ctx, w.progress...).Scan(&createdAt)
	}
	if errors.Is(err, sql.ErrNoRows) {
		err = tx.StmtContext(ctx, st.update).QueryRowContext(ctx, w.args...).Scan(&createdAt)
	}
	if errors.Is(err, sql.ErrNoRows) {
		var (
			stored      int64
			storedNonce string
		)
		switch err := tx.StmtContext(ctx, st.version).QueryRowContext(ctx, w.rec.ID).Scan(&stored, &storedNonce); {
		case errors.Is(err, sql.ErrNoRows):
			return sqliteResult{err: ErrNotFound}, nil
		case err != nil:
			return sqliteResult{err: err}, nil
		}
		return sqliteResult{err: updateRefused(w.rec, w.expected, stored, storedNonce)}, nil
	}
	if err != nil {
		return sqliteResult{}, err
	}
	rec := w.rec
	rec.CreatedAt = time.Unix(0, createdAt).UTC()
	return sqliteResult{rec: rec}, nil
}
