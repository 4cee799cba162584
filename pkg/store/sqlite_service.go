package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Page serves one page from one statement (one consistent snapshot), read
// in order from the index that sqlitePageSQL chooses.
func (s *sqliteStore) Page(ctx context.Context, opts PageOptions) (Page, error) {
	q, err := opts.query()
	if err != nil {
		return Page{}, fmt.Errorf("task record page: %w", err)
	}
	if q.none {
		return Page{}, nil
	}
	query, args := sqlitePageSQL(q)
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return Page{}, fmt.Errorf("task record page: %w", err)
	}
	defer rows.Close()
	recs := make([]Record, 0, q.limit+1)
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return Page{}, fmt.Errorf("task record page: %w", err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return Page{}, fmt.Errorf("task record page: %w", err)
	}
	return q.page(recs), nil
}

// sqliteColumnsOf returns sqliteColumns qualified by alias.
func sqliteColumnsOf(alias string) string {
	cols := strings.Split(sqliteColumns, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

var sqliteColumnsOfT, sqliteColumnsOfP = sqliteColumnsOf("t"), sqliteColumnsOf("p")

// sqlitePageSQL returns the statement that reads q's page (limit+1 rows, the
// extra one only says that more follow) and its arguments.
//
// The statement names the one index it reads (INDEXED BY), so its plan does
// not depend on the query planner's guesses: every page index ends in the
// page order (created_at, id), so the page is a range of that index read in
// order from the continue position, no sort and no count, and the reading
// stops after limit+1 matches; the other filters are checked on the rows
// the range yields. The index is the first that applies of:
//
//   - namespace and phase: tasks_by_namespace_phase;
//   - a label: task_labels_by_value on the first label by key (the task's
//     row is then read by ID; further labels are primary-key lookups);
//   - reason: tasks_by_reason;
//   - name prefix: tasks_by_name, the range [prefix, prefixEnd) (not LIKE);
//     this index is ordered by name first, so the range's keys are sorted:
//     the one filter whose cost grows with its matches, not with the page.
//     The sort takes only the keys (rowids) from the index, which covers
//     them when no other filter needs the row, and the page's rows are read
//     afterwards by rowid;
//   - namespace: tasks_by_namespace; cluster: tasks_by_cluster_created;
//     phase: tasks_by_phase;
//   - terminal: tasks_by_terminal_created;
//   - none: tasks_by_created (CreatedAfter and CreatedBefore bound the range
//     of whichever index is read).
//
// The worst case of an in-order range with further filters is a range with
// few matches: the reading then goes through the whole range of the chosen
// index (never the whole table, unless the filter is as wide).
//
// Several namespaces (PageOptions.Namespaces) are read as one such range
// per namespace, each limited to limit+1 rows, merged in page order: no
// record of another namespace is read, and the cost is that of one page per
// namespace. Beyond maxNamespaceBranches namespaces, they are one IN
// condition on the range of the other filters instead.
func sqlitePageSQL(q pageQuery) (string, []any) {
	if len(q.Namespaces) < 2 || len(q.Namespaces) > maxNamespaceBranches {
		return sqlitePageRangeSQL(q)
	}
	var (
		parts []string
		args  []any
	)
	for _, ns := range q.Namespaces {
		b := q
		b.Namespace, b.Namespaces = ns, nil
		query, a := sqlitePageRangeSQL(b)
		parts = append(parts, "SELECT * FROM ("+query+")")
		args = append(args, a...)
	}
	return "SELECT * FROM (" + strings.Join(parts, " UNION ALL ") + ") ORDER BY created_at DESC, id DESC LIMIT ?", append(args, q.limit+1)
}

// sqlitePageRangeSQL is sqlitePageSQL for at most one namespace, or for
// namespaces given as one condition.
func sqlitePageRangeSQL(q pageQuery) (string, []any) {
	var (
		where []string
		args  []any
	)
	add := func(cond string, a ...any) {
		where = append(where, cond)
		args = append(args, a...)
	}
	// created and id are the page-order columns of the index read.
	created, id := "t.created_at", "t.id"
	labelKeys := q.sortedLabelKeys()
	var from string
	deferred := false
	switch {
	case q.Namespace != "" && q.Phase != "":
		from = "tasks AS t INDEXED BY tasks_by_namespace_phase"
	case len(labelKeys) > 0:
		from = "task_labels AS l INDEXED BY task_labels_by_value CROSS JOIN tasks AS t ON t.id = l.task_id"
		created, id = "l.created_at", "l.task_id"
		add("l.key = ?", labelKeys[0])
		add("l.value = ?", q.Labels[labelKeys[0]])
		labelKeys = labelKeys[1:]
	case q.Reason != "":
		from = "tasks AS t INDEXED BY tasks_by_reason"
	case q.NamePrefix != "":
		from = "tasks AS t INDEXED BY tasks_by_name"
		deferred = true
	case q.Namespace != "":
		from = "tasks AS t INDEXED BY tasks_by_namespace"
	case q.Cluster != "":
		from = "tasks AS t INDEXED BY tasks_by_cluster_created"
	case q.Phase != "":
		from = "tasks AS t INDEXED BY tasks_by_phase"
	case q.Terminal != nil:
		from = "tasks AS t INDEXED BY tasks_by_terminal_created"
	default:
		from = "tasks AS t INDEXED BY tasks_by_created"
	}
	if q.Namespace != "" {
		add("t.namespace = ?", q.Namespace)
	}
	if len(q.Namespaces) > 0 {
		add("t.namespace IN (?"+strings.Repeat(", ?", len(q.Namespaces)-1)+")", anys(q.Namespaces)...)
	}
	if q.Cluster != "" {
		add("t.cluster = ?", q.Cluster)
	}
	if q.Phase != "" {
		add("t.phase = ?", q.Phase)
	}
	if q.Reason != "" {
		add("t.reason = ?", q.Reason)
	}
	if q.NamePrefix != "" {
		add("t.name >= ?", q.NamePrefix)
		if end, ok := prefixEnd(q.NamePrefix); ok {
			add("t.name < ?", end)
		}
	}
	if q.Terminal != nil {
		add("t.terminal = ?", *q.Terminal)
	}
	for i, k := range labelKeys {
		l := fmt.Sprintf("l%d", i+1)
		add(fmt.Sprintf("EXISTS (SELECT 1 FROM task_labels AS %[1]s WHERE %[1]s.task_id = t.id AND %[1]s.key = ? AND %[1]s.value = ?)", l),
			k, q.Labels[k])
	}
	if q.createdFrom != nil {
		add(created+" >= ?", *q.createdFrom)
	}
	switch upper := q.after; {
	case upper != nil:
		// One upper bound, the tighter of the continue position and
		// CreatedBefore (the key (createdTo, "") bounds created_at < createdTo
		// alone): SQLite bounds an index range by one upper term only, and
		// a second would be checked row by row from the top of the range.
		if q.createdTo != nil && (*q.createdTo < upper.CreatedAt || *q.createdTo == upper.CreatedAt && upper.ID > "") {
			upper = &pageKey{CreatedAt: *q.createdTo}
		}
		add("("+created+", "+id+") < (?, ?)", upper.CreatedAt, upper.ID)
	case q.createdTo != nil:
		add(created+" < ?", *q.createdTo)
	}
	cols := sqliteColumnsOfT
	if deferred {
		cols = "t.rowid"
	}
	query := "SELECT " + cols + " FROM " + from
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY " + created + " DESC, " + id + " DESC LIMIT ?"
	if deferred {
		query = "SELECT " + sqliteColumnsOfP + " FROM tasks AS p WHERE p.rowid IN (" + query + ") ORDER BY p.created_at DESC, p.id DESC"
	}
	return query, append(args, q.limit+1)
}

// anys returns ss as arguments of a statement.
func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func (s *sqliteStore) AppendLog(ctx context.Context, key LogKey, a LogAppend) (LogInfo, error) {
	res := s.write(ctx, &sqliteWrite{run: func(ctx context.Context, tx *sql.Tx, st *sqliteWriteStmts) (sqliteResult, error) {
		return st.appendLog(ctx, tx, s.maxLogSize, key, a)
	}})
	if res.err != nil {
		return res.log, fmt.Errorf("log %s append at %d: %w", key, a.Offset, res.err)
	}
	return res.log, nil
}

// appendLog is AppendLog's write in the writer's transaction. Like Update,
// an outcome of this write alone (ErrNotFound, ErrLogOffset, ErrLogComplete,
// a failed read) is in the result and changes nothing; an error is a failed
// write statement, after which tx must be rolled back.
func (st *sqliteWriteStmts) appendLog(ctx context.Context, tx *sql.Tx, maxSize int64, key LogKey, a LogAppend) (sqliteResult, error) {
	offset, data, cursor, complete := a.Offset, a.Data, a.Cursor, a.Complete
	var nonce string
	switch err := tx.StmtContext(ctx, st.taskNonce).QueryRowContext(ctx, key.TaskID).Scan(&nonce); {
	case errors.Is(err, sql.ErrNoRows):
		return sqliteResult{err: ErrNotFound}, nil
	case err != nil:
		return sqliteResult{err: err}, nil
	case !logOf(nonce, a.Nonce):
		return sqliteResult{err: fmt.Errorf("the record is another one (nonce %q, the log's %q): %w", nonce, a.Nonce, ErrNotFound)}, nil
	}
	k := []any{key.TaskID, key.Attempt, key.Container}
	var (
		info   LogInfo
		stored nullBlob
	)
	// No row: a new log, of size 0.
	err := tx.StmtContext(ctx, st.logState).QueryRowContext(ctx, k...).Scan(&info.Size, &info.Complete, &info.Truncated, &stored)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return sqliteResult{err: err}, nil
	}
	info.Cursor = stored.b
	if offset != info.Size {
		return sqliteResult{log: info, err: fmt.Errorf("size %d: %w", info.Size, ErrLogOffset)}, nil
	}
	if info.Complete && len(data) > 0 {
		return sqliteResult{log: info, err: ErrLogComplete}, nil
	}
	kept, truncated, err := clipLog(info.Size, info.Truncated, maxSize, data, func() (byte, error) {
		var last []byte
		if err := tx.StmtContext(ctx, st.logLastByte).QueryRowContext(ctx, k...).Scan(&last); err != nil {
			return 0, fmt.Errorf("last archived byte: %w", err)
		}
		if len(last) != 1 {
			return 0, fmt.Errorf("last archived byte: %d bytes", len(last))
		}
		return last[0], nil
	})
	if err != nil {
		return sqliteResult{err: err}, nil
	}
	if len(kept) > 0 {
		if _, err := tx.StmtContext(ctx, st.logChunk).ExecContext(ctx, append(k, info.Size, kept)...); err != nil {
			return sqliteResult{}, err
		}
	}
	info = LogInfo{
		Size:      info.Size + int64(len(kept)),
		Complete:  info.Complete || complete,
		Truncated: truncated,
		Cursor:    bytes.Clone(cursor), // nil stays nil (NULL), empty stays empty
	}
	if _, err := tx.StmtContext(ctx, st.logUpsert).ExecContext(ctx,
		append(k, info.Size, info.Complete, info.Truncated, blobArg(info.Cursor))...); err != nil {
		return sqliteResult{}, err
	}
	return sqliteResult{log: info}, nil
}

// sqliteReadSQL are the log archive's reads.
var sqliteReadSQL = struct{ logChunks, logKeys string }{
	// The chunks that overlap [offset, end): a range of the primary key,
	// from the last chunk that starts at or before offset (args: key, end,
	// key, offset).
	logChunks: `SELECT offset, data FROM log_chunks
		WHERE task_id = ? AND attempt = ? AND container = ? AND offset < ? AND offset >= coalesce(
			(SELECT max(offset) FROM log_chunks WHERE task_id = ? AND attempt = ? AND container = ? AND offset <= ?), 0)
		ORDER BY offset`,
	logKeys: `SELECT attempt, container FROM logs WHERE task_id = ? ORDER BY attempt, container`,
}

// ReadLog reads the log's state and the chunks that overlap the range in
// one read transaction, so the bytes and the info agree. The chunks are a
// range of log_chunks' primary key: from the last chunk that starts at or
// before offset to the last that starts before the end.
func (s *sqliteStore) ReadLog(ctx context.Context, key LogKey, offset int64, limit int) ([]byte, LogInfo, error) {
	data, info, err := s.readLog(ctx, key, offset, limit)
	if err != nil {
		return nil, info, fmt.Errorf("log %s read at %d: %w", key, offset, err)
	}
	return data, info, nil
}

func (s *sqliteStore) readLog(ctx context.Context, key LogKey, offset int64, limit int) ([]byte, LogInfo, error) {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, LogInfo{}, err
	}
	defer tx.Rollback()
	k := []any{key.TaskID, key.Attempt, key.Container}
	var (
		info   LogInfo
		cursor nullBlob
	)
	switch err := tx.QueryRowContext(ctx, sqliteWriteSQL.logState, k...).Scan(&info.Size, &info.Complete, &info.Truncated, &cursor); {
	case errors.Is(err, sql.ErrNoRows):
		return nil, LogInfo{}, ErrNotFound
	case err != nil:
		return nil, LogInfo{}, err
	}
	info.Cursor = cursor.b
	if offset < 0 || offset > info.Size {
		return nil, info, fmt.Errorf("size %d: %w", info.Size, ErrLogOffset)
	}
	end := offset + min(int64(max(limit, 0)), info.Size-offset)
	out := make([]byte, 0, end-offset)
	if end == offset {
		return out, info, nil
	}
	rows, err := tx.QueryContext(ctx, sqliteReadSQL.logChunks, append(append(k, end), append(k, offset)...)...)
	if err != nil {
		return nil, info, err
	}
	defer rows.Close()
	next := int64(-1)
	for rows.Next() {
		var (
			start int64
			chunk []byte
		)
		if err := rows.Scan(&start, &chunk); err != nil {
			return nil, info, err
		}
		if next >= 0 && start != next || next < 0 && start > offset {
			return nil, info, fmt.Errorf("archive corrupt: chunk at %d, expected %d", start, max(next, offset))
		}
		next = start + int64(len(chunk))
		lo, hi := max(offset-start, 0), min(end-start, int64(len(chunk)))
		if lo < hi {
			out = append(out, chunk[lo:hi]...)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, info, err
	}
	if int64(len(out)) != end-offset {
		return nil, info, fmt.Errorf("archive corrupt: %d bytes from %d, expected %d", len(out), offset, end-offset)
	}
	return out, info, nil
}

func (s *sqliteStore) LogKeys(ctx context.Context, taskID string) ([]LogKey, error) {
	rows, err := s.r.QueryContext(ctx, sqliteReadSQL.logKeys, taskID)
	if err != nil {
		return nil, fmt.Errorf("logs of task %s: %w", taskID, err)
	}
	defer rows.Close()
	var keys []LogKey
	for rows.Next() {
		k := LogKey{TaskID: taskID}
		if err := rows.Scan(&k.Attempt, &k.Container); err != nil {
			return nil, fmt.Errorf("logs of task %s: %w", taskID, err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("logs of task %s: %w", taskID, err)
	}
	return keys, nil
}

// sqliteRetentionLogBytes bounds the log bytes one DeleteFinishedBefore
// deletes (at least one task's, however large), so the writer is not held
// for long by a batch of tasks with large logs.
const sqliteRetentionLogBytes = 64 << 20

func (s *sqliteStore) DeleteFinishedBefore(ctx context.Context, t time.Time, batch int) (int, error) {
	if batch <= 0 {
		return 0, fmt.Errorf("task retention: batch %d is not positive", batch)
	}
	before := clampUnixNano(t)
	budget := s.retentionLogBytes
	if budget <= 0 {
		budget = sqliteRetentionLogBytes
	}
	res := s.write(ctx, &sqliteWrite{run: func(ctx context.Context, tx *sql.Tx, st *sqliteWriteStmts) (sqliteResult, error) {
		return st.deleteFinished(ctx, tx, before, batch, budget)
	}})
	if res.err != nil {
		return 0, fmt.Errorf("task retention: %w", res.err)
	}
	return res.deleted, nil
}

// deleteFinished is DeleteFinishedBefore's write in the writer's
// transaction: up to batch tasks, and no more once their logs reach budget
// bytes.
func (st *sqliteWriteStmts) deleteFinished(ctx context.Context, tx *sql.Tx, before int64, batch int, budget int64) (sqliteResult, error) {
	rows, err := tx.StmtContext(ctx, st.finished).QueryContext(ctx, before, batch)
	if err != nil {
		return sqliteResult{err: err}, nil
	}
	var (
		ids      []string
		logBytes int64
	)
	for logBytes < budget && rows.Next() {
		var (
			id   string
			size int64
		)
		if err := rows.Scan(&id, &size); err != nil {
			rows.Close()
			return sqliteResult{err: err}, nil
		}
		ids = append(ids, id)
		logBytes += size
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return sqliteResult{err: err}, nil
	}
	for _, id := range ids {
		if _, err := tx.StmtContext(ctx, st.deleteTask).ExecContext(ctx, id); err != nil {
			return sqliteResult{}, err
		}
	}
	return sqliteResult{deleted: len(ids)}, nil
}
