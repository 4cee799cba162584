package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	_ Pager     = (*postgresStore)(nil)
	_ Logs      = (*postgresStore)(nil)
	_ Retention = (*postgresStore)(nil)
)

// Page serves one page from one statement (one snapshot), read in order from
// an index (see postgresPageSQL).
func (s *postgresStore) Page(ctx context.Context, opts PageOptions) (_ Page, err error) {
	q, err := opts.query()
	if err != nil {
		return Page{}, fmt.Errorf("task record page: %w", unavailable(err))
	}
	if q.none {
		return Page{}, nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	defer func() { err = timedOut(ctx, err) }()
	c, err := s.conn(ctx)
	if err != nil {
		return Page{}, fmt.Errorf("task record page: %w", unavailable(err))
	}
	defer c.Release()
	query, args := postgresPageSQL(q)
	// An unnamed statement, planned for these arguments every time (a
	// custom plan): a generic plan, which a cached prepared statement
	// switches to, would not know how selective the filters are.
	rows, err := c.Query(ctx, query, append([]any{pgx.QueryExecModeExec}, args...)...)
	if err != nil {
		return Page{}, fmt.Errorf("task record page: %w", unavailable(err))
	}
	defer rows.Close()
	recs := make([]Record, 0, q.limit+1)
	for rows.Next() {
		rec, err := scanPostgresRecord(rows)
		if err != nil {
			return Page{}, fmt.Errorf("task record page: %w", unavailable(err))
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return Page{}, fmt.Errorf("task record page: %w", unavailable(err))
	}
	return q.page(recs), nil
}

// postgresColumnsOf returns postgresColumns qualified by alias.
func postgresColumnsOf(alias string) string {
	cols := strings.Split(postgresColumns, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

var postgresColumnsOfT, postgresColumnsOfP = postgresColumnsOf("t"), postgresColumnsOf("p")

// postgresPageSQL returns the statement that reads q's page (limit+1 rows,
// the extra one only says that more follow) and its arguments.
//
// PostgreSQL has no index hints; the statement is shaped so that the index
// meant for its filters serves it as an ordered range, it is planned for its
// arguments every time (Page runs it as an unnamed statement), and
// TestPostgresPagePlans checks with EXPLAIN, on a table with statistics,
// that the planner reads it so: every page
// index ends in the page order (created_at, id), so the page is a range of
// that index read backwards from the continue position, with no sort and no
// count, and the reading stops after limit+1 matches; the other filters are
// checked on the rows the range yields. The shapes, by the first filter that
// applies:
//
//   - namespace and phase: tasks_by_namespace_phase;
//   - a label: the range of task_labels_by_value for the first label by key,
//     ordered by its own copy of created_at, joined to the task by ID;
//     further labels (and a label beside namespace and phase) are checked on
//     each row by a lookup of task_labels' primary key;
//   - name prefix: the range [prefix, prefixEnd) of tasks_by_name (not
//     LIKE), whose keys are then sorted (the one filter whose cost grows
//     with its matches, not with the page): only the IDs are selected and
//     sorted, from the index alone when no other filter needs the row, and
//     the page's rows are read by ID afterwards;
//   - otherwise one range of tasks with the filters as conditions.
//
// CreatedAfter and CreatedBefore bound the range of whichever index is read.
// Within a shape the planner chooses by the statistics of the values asked
// for: the index of a selective filter (tasks_by_reason, tasks_by_namespace,
// tasks_by_cluster_created, tasks_by_phase, tasks_by_terminal_created), or
// for a common value the ordered range of tasks_by_created, checking the
// filter on each row, which finds a page's rows after a few times as many;
// and when the filters together match few rows, it may read them from two
// indexes and sort them (never more than the matches of those ranges).
//
// Several namespaces (PageOptions.Namespaces) are one such statement per
// namespace, each limited to limit+1 rows, merged in page order (UNION ALL,
// a Merge Append): no record of another namespace is read, and the cost is
// that of one page per namespace. Beyond maxNamespaceBranches namespaces,
// they are one condition (= ANY) on the range of the other filters instead.
func postgresPageSQL(q pageQuery) (string, []any) {
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if len(q.Namespaces) < 2 || len(q.Namespaces) > maxNamespaceBranches {
		return postgresPageRangeSQL(q, arg), args
	}
	parts := make([]string, 0, len(q.Namespaces))
	for _, ns := range q.Namespaces {
		b := q
		b.Namespace, b.Namespaces = ns, nil
		parts = append(parts, "("+postgresPageRangeSQL(b, arg)+")")
	}
	return "SELECT * FROM (" + strings.Join(parts, " UNION ALL ") + ") AS u ORDER BY created_at DESC, id DESC LIMIT " + arg(int64(q.limit+1)), args
}

// postgresPageRangeSQL is postgresPageSQL for at most one namespace, or for
// namespaces given as one condition; arg adds an argument and returns its
// placeholder.
func postgresPageRangeSQL(q pageQuery, arg func(v any) string) string {
	var where []string
	// created and id are the page-order columns of the range read.
	created, id := "t.created_at", "t.id"
	labelKeys := q.sortedLabelKeys()
	from := "tasks AS t"
	deferred := false
	switch {
	case q.Namespace != "" && q.Phase != "":
	case len(labelKeys) > 0:
		from = "task_labels AS l JOIN tasks AS t ON t.id = l.task_id"
		created, id = "l.created_at", "l.task_id"
		where = append(where, "l.key = "+arg(bytesOf(labelKeys[0])), "l.value = "+arg(bytesOf(q.Labels[labelKeys[0]])))
		labelKeys = labelKeys[1:]
	case q.Reason != "":
	case q.NamePrefix != "":
		deferred = true
	}
	if q.Namespace != "" {
		where = append(where, "t.namespace = "+arg(bytesOf(q.Namespace)))
	}
	if len(q.Namespaces) > 0 {
		nss := make([][]byte, len(q.Namespaces))
		for i, ns := range q.Namespaces {
			nss[i] = bytesOf(ns)
		}
		where = append(where, "t.namespace = ANY("+arg(nss)+")")
	}
	if q.Cluster != "" {
		where = append(where, "t.cluster = "+arg(bytesOf(q.Cluster)))
	}
	if q.Phase != "" {
		where = append(where, "t.phase = "+arg(bytesOf(q.Phase)))
	}
	if q.Reason != "" {
		where = append(where, "t.reason = "+arg(bytesOf(q.Reason)))
	}
	if q.NamePrefix != "" {
		where = append(where, "t.name >= "+arg(bytesOf(q.NamePrefix)))
		if end, ok := prefixEnd(q.NamePrefix); ok {
			where = append(where, "t.name < "+arg(bytesOf(end)))
		}
	}
	if q.Terminal != nil {
		where = append(where, "t.terminal = "+arg(*q.Terminal))
	}
	for i, k := range labelKeys {
		// OFFSET 0 keeps the EXISTS a check of each row the range yields (a
		// primary-key lookup), rather than a join the planner might drive
		// from the label's index, all of whose matches it would then sort.
		l := fmt.Sprintf("l%d", i+1)
		where = append(where, fmt.Sprintf("EXISTS (SELECT 1 FROM task_labels AS %[1]s WHERE %[1]s.task_id = t.id AND %[1]s.key = %[2]s AND %[1]s.value = %[3]s OFFSET 0)",
			l, arg(bytesOf(k)), arg(bytesOf(q.Labels[k]))))
	}
	if q.createdFrom != nil {
		where = append(where, created+" >= "+arg(*q.createdFrom))
	}
	switch upper := q.after; {
	case upper != nil:
		// One upper bound, the tighter of the continue position and
		// CreatedBefore (the key (createdTo, "") bounds created_at <
		// createdTo alone), so the index range starts at one place.
		if q.createdTo != nil && (*q.createdTo < upper.CreatedAt || *q.createdTo == upper.CreatedAt && upper.ID > "") {
			upper = &pageKey{CreatedAt: *q.createdTo}
		}
		where = append(where, "("+created+", "+id+") < ("+arg(upper.CreatedAt)+", "+arg(upper.ID)+")")
	case q.createdTo != nil:
		where = append(where, created+" < "+arg(*q.createdTo))
	}
	cols := postgresColumnsOfT
	if deferred {
		cols = "t.id"
	}
	query := "SELECT " + cols + " FROM " + from
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY " + created + " DESC, " + id + " DESC LIMIT " + arg(int64(q.limit+1))
	if deferred {
		query = "SELECT " + postgresColumnsOfP + " FROM (" + query + ") AS k JOIN tasks AS p ON p.id = k.id ORDER BY p.created_at DESC, p.id DESC"
	}
	return query
}

// postgresLogSQL are the log archive's statements.
var postgresLogSQL = struct {
	nonce, state, create, lastByte, chunk, save, read, keys string
}{
	// The record's nonce, its row locked against deletion (not against
	// updates) until the append commits.
	nonce: `SELECT nonce FROM tasks WHERE id = $1 FOR KEY SHARE`,
	// The log's state, locked until the append commits.
	state: `SELECT size, complete, truncated, cursor FROM logs
		WHERE task_id = $1 AND attempt = $2 AND container = $3 FOR UPDATE`,
	// A new log, or the one a concurrent first append just created, locked
	// as state locks it; a task that has no record is a foreign key
	// violation.
	create: `INSERT INTO logs (task_id, attempt, container, size, complete, truncated, cursor)
		VALUES ($1, $2, $3, 0, false, false, NULL)
		ON CONFLICT (task_id, attempt, container) DO UPDATE SET size = logs.size
		RETURNING size, complete, truncated, cursor`,
	lastByte: `SELECT substring(data FROM length(data)) FROM log_chunks
		WHERE task_id = $1 AND attempt = $2 AND container = $3 ORDER BY "offset" DESC LIMIT 1`,
	chunk: `INSERT INTO log_chunks (task_id, attempt, container, "offset", data) VALUES ($1, $2, $3, $4, $5)`,
	save: `UPDATE logs SET size = $4, complete = $5, truncated = $6, cursor = $7
		WHERE task_id = $1 AND attempt = $2 AND container = $3`,
	// The state and the chunks that overlap [$4, min($4+$5, size)), in one
	// statement (one snapshot): a range of log_chunks' primary key, from
	// the last chunk that starts at or before the offset. An offset outside
	// 0..size reads the state alone.
	read: `SELECT l.size, l.complete, l.truncated, l.cursor, c."offset", c.data
		FROM logs AS l
		LEFT JOIN LATERAL (
			SELECT ch."offset", ch.data FROM log_chunks AS ch
			WHERE ch.task_id = l.task_id AND ch.attempt = l.attempt AND ch.container = l.container
				AND $4 >= 0 AND $4 < l.size AND ch."offset" < least($4 + $5, l.size)
				AND ch."offset" >= coalesce((
					SELECT max(m."offset") FROM log_chunks AS m
					WHERE m.task_id = l.task_id AND m.attempt = l.attempt AND m.container = l.container
						AND m."offset" <= $4), 0)
			ORDER BY ch."offset"
		) AS c ON true
		WHERE l.task_id = $1 AND l.attempt = $2 AND l.container = $3
		ORDER BY c."offset"`,
	keys: `SELECT attempt, container FROM logs WHERE task_id = $1 ORDER BY attempt, container`,
}

// postgresFKViolation is SQLSTATE foreign_key_violation.
const postgresFKViolation = "23503"

func (s *postgresStore) AppendLog(ctx context.Context, key LogKey, a LogAppend) (LogInfo, error) {
	var info LogInfo
	err := s.write(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		if !storableID(key.TaskID) {
			return ErrNotFound
		}
		var err error
		info, err = s.appendLog(ctx, c, key, a)
		return err
	})
	if err != nil {
		return info, fmt.Errorf("log %s append at %d: %w", key, a.Offset, err)
	}
	return info, nil
}

// appendLog is AppendLog's transaction: lock (or create) the log's state,
// check the offset, clip the data at the cap, then insert the chunk and save
// the state; a refused append rolls back, so it changes nothing. It returns
// the log's info, also with ErrLogOffset and ErrLogComplete. With a nonce,
// the record's row is read first and share-locked until the commit, so
// retention cannot delete it (and its ID be used again) in between.
func (s *postgresStore) appendLog(ctx context.Context, c *pgxpool.Conn, key LogKey, a LogAppend) (LogInfo, error) {
	offset, data, cursor, complete := a.Offset, a.Data, a.Cursor, a.Complete
	tx, err := c.Begin(ctx)
	if err != nil {
		return LogInfo{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if a.Nonce != "" {
		var nonce []byte
		switch err := tx.QueryRow(ctx, postgresLogSQL.nonce, key.TaskID).Scan(&nonce); {
		case errors.Is(err, pgx.ErrNoRows):
			return LogInfo{}, ErrNotFound
		case err != nil:
			return LogInfo{}, err
		case !logOf(string(nonce), a.Nonce):
			return LogInfo{}, fmt.Errorf("the record is another one (nonce %q, the log's %q): %w", nonce, a.Nonce, ErrNotFound)
		}
	}
	k := []any{key.TaskID, int32(key.Attempt), bytesOf(key.Container)} //nolint:gosec // attempts are few
	var info LogInfo
	scan := func(row pgx.Row) error {
		return row.Scan(&info.Size, &info.Complete, &info.Truncated, &info.Cursor)
	}
	if err := scan(tx.QueryRow(ctx, postgresLogSQL.state, k...)); errors.Is(err, pgx.ErrNoRows) {
		if err := scan(tx.QueryRow(ctx, postgresLogSQL.create, k...)); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == postgresFKViolation {
				return LogInfo{}, ErrNotFound
			}
			return LogInfo{}, err
		}
	} else if err != nil {
		return LogInfo{}, err
	}
	if offset != info.Size {
		return info, fmt.Errorf("size %d: %w", info.Size, ErrLogOffset)
	}
	if info.Complete && len(data) > 0 {
		return info, ErrLogComplete
	}
	kept, truncated, err := clipLog(info.Size, info.Truncated, s.maxLogSize, data, func() (byte, error) {
		var last []byte
		if err := tx.QueryRow(ctx, postgresLogSQL.lastByte, k...).Scan(&last); err != nil {
			return 0, fmt.Errorf("last archived byte: %w", err)
		}
		if len(last) != 1 {
			return 0, fmt.Errorf("last archived byte: %d bytes", len(last))
		}
		return last[0], nil
	})
	if err != nil {
		return LogInfo{}, err
	}
	next := LogInfo{
		Size:      info.Size + int64(len(kept)),
		Complete:  info.Complete || complete,
		Truncated: truncated,
		Cursor:    bytes.Clone(cursor), // nil stays nil (NULL), empty stays empty
	}
	batch := &pgx.Batch{}
	if len(kept) > 0 {
		batch.Queue(postgresLogSQL.chunk, append(k, info.Size, kept)...)
	}
	batch.Queue(postgresLogSQL.save, append(k, next.Size, next.Complete, next.Truncated, next.Cursor)...)
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return LogInfo{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return LogInfo{}, fmt.Errorf("commit: %w", err)
	}
	return next, nil
}

// ReadLog reads the log's state and the chunks that overlap the range in one
// statement, so the bytes and the info agree.
func (s *postgresStore) ReadLog(ctx context.Context, key LogKey, offset int64, limit int) ([]byte, LogInfo, error) {
	data, info, err := s.readLog(ctx, key, offset, limit)
	if err != nil {
		return nil, info, fmt.Errorf("log %s read at %d: %w", key, offset, unavailable(err))
	}
	return data, info, nil
}

func (s *postgresStore) readLog(ctx context.Context, key LogKey, offset int64, limit int) (_ []byte, _ LogInfo, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	defer func() { err = timedOut(ctx, err) }()
	c, err := s.conn(ctx)
	if err != nil {
		return nil, LogInfo{}, err
	}
	defer c.Release()
	if !storableID(key.TaskID) {
		return nil, LogInfo{}, ErrNotFound
	}
	n := int64(max(limit, 0))
	if offset >= 0 {
		n = min(n, math.MaxInt64-offset) // offset+n stays an int64
	}
	rows, err := c.Query(ctx, postgresLogSQL.read, key.TaskID, int32(key.Attempt), bytesOf(key.Container), offset, n) //nolint:gosec // attempts are few
	if err != nil {
		return nil, LogInfo{}, err
	}
	defer rows.Close()
	var (
		info  LogInfo
		out   []byte
		found bool
		next  = int64(-1)
		end   int64
	)
	for rows.Next() {
		var (
			start *int64
			chunk []byte
		)
		if err := rows.Scan(&info.Size, &info.Complete, &info.Truncated, &info.Cursor, &start, &chunk); err != nil {
			return nil, LogInfo{}, err
		}
		if !found {
			found = true
			if offset < 0 || offset > info.Size {
				return nil, info, fmt.Errorf("size %d: %w", info.Size, ErrLogOffset)
			}
			end = offset + min(n, info.Size-offset)
			out = make([]byte, 0, end-offset)
		}
		if start == nil { // no chunk in the range
			continue
		}
		if next >= 0 && *start != next || next < 0 && *start > offset {
			return nil, info, fmt.Errorf("archive corrupt: chunk at %d, expected %d", *start, max(next, offset))
		}
		next = *start + int64(len(chunk))
		lo, hi := max(offset-*start, 0), min(end-*start, int64(len(chunk)))
		if lo < hi {
			out = append(out, chunk[lo:hi]...)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, LogInfo{}, err
	}
	if !found {
		return nil, LogInfo{}, ErrNotFound
	}
	if int64(len(out)) != end-offset {
		return nil, info, fmt.Errorf("archive corrupt: %d bytes from %d, expected %d", len(out), offset, end-offset)
	}
	return out, info, nil
}

func (s *postgresStore) LogKeys(ctx context.Context, taskID string) (_ []LogKey, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	defer func() { err = timedOut(ctx, err) }()
	c, err := s.conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("logs of task %s: %w", taskID, unavailable(err))
	}
	defer c.Release()
	if !storableID(taskID) {
		return nil, nil
	}
	rows, err := c.Query(ctx, postgresLogSQL.keys, taskID)
	if err != nil {
		return nil, fmt.Errorf("logs of task %s: %w", taskID, unavailable(err))
	}
	defer rows.Close()
	var keys []LogKey
	for rows.Next() {
		var (
			attempt   int32
			container []byte
		)
		if err := rows.Scan(&attempt, &container); err != nil {
			return nil, fmt.Errorf("logs of task %s: %w", taskID, unavailable(err))
		}
		keys = append(keys, LogKey{TaskID: taskID, Attempt: int(attempt), Container: string(container)})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("logs of task %s: %w", taskID, unavailable(err))
	}
	return keys, nil
}

// postgresRetentionLogBytes bounds the log bytes one DeleteFinishedBefore
// deletes (at least one task's, however large), so one call's transaction
// stays short.
const postgresRetentionLogBytes = 64 << 20

// postgresRetentionSQL deletes, in one statement, up to $2 terminal tasks
// last updated before $1, oldest first, from the partial index of terminal
// tasks, and stops at the first whose logs would take the deleted log bytes
// past $3 (the first task always goes). Rows another transaction holds are
// skipped (another replica deleting them, or a write in progress), not
// waited for. Foreign keys delete the labels, logs and chunks.
const postgresRetentionSQL = `WITH c AS (
		SELECT id, updated_at FROM tasks
		WHERE terminal AND updated_at < $1
		ORDER BY updated_at, id LIMIT $2
		FOR UPDATE SKIP LOCKED
	), sized AS (
		SELECT c.id, sum(coalesce(s.size, 0)) OVER (ORDER BY c.updated_at, c.id) - coalesce(s.size, 0) AS before
		FROM c LEFT JOIN LATERAL (SELECT sum(size) AS size FROM logs WHERE logs.task_id = c.id) AS s ON true
	), d AS (
		DELETE FROM tasks USING sized WHERE tasks.id = sized.id AND sized.before < $3
		RETURNING 1
	)
	SELECT count(*) FROM d`

func (s *postgresStore) DeleteFinishedBefore(ctx context.Context, t time.Time, batch int) (int, error) {
	if batch <= 0 {
		return 0, fmt.Errorf("task retention: batch %d is not positive", batch)
	}
	budget := s.retentionLogBytes
	if budget <= 0 {
		budget = postgresRetentionLogBytes
	}
	var n int64
	err := s.write(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		return c.QueryRow(ctx, postgresRetentionSQL, clampUnixNano(t), int64(batch), budget).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("task retention: %w", err)
	}
	return int(n), nil
}
