package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// OpenSQLiteOneTxPerWrite opens a SQLite store on the write path before group
// commit (one transaction and one sync per write), the benchmark's baseline.
func OpenSQLiteOneTxPerWrite(ctx context.Context, path string) (Store, error) {
	return openSQLiteStore(ctx, path, sqliteOptions{oneTxPerWrite: true})
}

// OpenSQLiteFullUpdates opens a SQLite store whose every Update sets every
// column (no progress statement), the benchmark's baseline.
func OpenSQLiteFullUpdates(ctx context.Context, path string) (Store, error) {
	return openSQLiteStore(ctx, path, sqliteOptions{fullUpdates: true})
}

// SQLiteCommits returns how many group transactions s has committed; 0 for
// a store other than SQLite.
func SQLiteCommits(s Store) int64 {
	if s, ok := s.(*sqliteStore); ok {
		return s.commits.Load()
	}
	return 0
}

// OpenSQLiteBeforeCommit opens a SQLite store whose writer calls
// beforeCommit with the number of writes applied in each group just before
// committing it.
func OpenSQLiteBeforeCommit(ctx context.Context, path string, beforeCommit func(applied int)) (Store, error) {
	return openSQLiteStore(ctx, path, sqliteOptions{beforeCommit: beforeCommit})
}

// SQLiteQueued returns how many writes wait in s's queue for the writer.
func SQLiteQueued(s Store) int {
	return len(s.(*sqliteStore).queue)
}

// SQLitePlan returns the details of EXPLAIN QUERY PLAN of query on s's
// reader connections.
func SQLitePlan(s Store, query string, args ...any) ([]string, error) {
	rows, err := s.(*sqliteStore).r.Query("EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			return nil, err
		}
		out = append(out, detail)
	}
	return out, rows.Err()
}

// SQLitePageSQL returns the statement and arguments of the page opts
// selects.
func SQLitePageSQL(opts PageOptions) (string, []any, error) {
	q, err := opts.query()
	if err != nil {
		return "", nil, err
	}
	query, args := sqlitePageSQL(q)
	return query, args, nil
}

// SQLiteStatements are the store's other statements whose plans the tests
// check, by name.
var SQLiteStatements = map[string]string{
	"get":                  sqliteWriteSQL.selectByID,
	"log state":            sqliteWriteSQL.logState,
	"log last byte":        sqliteWriteSQL.logLastByte,
	"log chunks":           sqliteReadSQL.logChunks,
	"log keys":             sqliteReadSQL.logKeys,
	"retention candidates": sqliteWriteSQL.finished,
	"retention delete":     sqliteWriteSQL.deleteTask,
	"move state":           sqliteWriteSQL.moveState,
	"update":               sqliteWriteSQL.update,
	"update: progress":     sqliteWriteSQL.progress,
	"update: refused":      sqliteWriteSQL.version,
	"move":                 sqliteWriteSQL.move,
	// The statements of the triggers, which EXPLAIN QUERY PLAN of the
	// statements that fire them does not show.
	"trigger: labels of a task": `DELETE FROM task_labels WHERE task_id = ?`,
	"trigger: chunks of a task": `DELETE FROM log_chunks WHERE task_id = ?`,
	"trigger: logs of a task":   `DELETE FROM logs WHERE task_id = ?`,
}

// OpenSQLiteRetentionBudget opens a SQLite store whose DeleteFinishedBefore
// stops once the deleted logs reach budget bytes.
func OpenSQLiteRetentionBudget(ctx context.Context, path string, budget int64) (Store, error) {
	return openSQLiteStore(ctx, path, sqliteOptions{retentionLogBytes: budget})
}

// ContinueToken returns the token of a page with opts' filters that ends
// with last.
func ContinueToken(opts PageOptions, last Record) (string, error) {
	q, err := opts.query()
	if err != nil {
		return "", err
	}
	return q.token(last), nil
}

// SQLiteBulkLoad stores n records made by gen as they are (times and
// version included, Create's rules not applied), through s's writer in
// transactions of up to 50,000 records: a benchmark's fixture.
func SQLiteBulkLoad(ctx context.Context, s Store, n int, gen func(i int) Record) error {
	const perTx = 50_000
	for start := 0; start < n; start += perTx {
		end := min(start+perTx, n)
		res := s.(*sqliteStore).write(ctx, &sqliteWrite{run: func(ctx context.Context, tx *sql.Tx, st *sqliteWriteStmts) (sqliteResult, error) {
			// A large page cache while loading: the indexes are written at
			// many places at once (one per namespace, name, label value).
			if _, err := tx.ExecContext(ctx, `PRAGMA cache_size = -262144`); err != nil {
				return sqliteResult{}, err
			}
			defer tx.ExecContext(ctx, `PRAGMA cache_size = -2000`)
			insert := tx.StmtContext(ctx, st.insert)
			for i := start; i < end; i++ {
				args, err := recordArgs(gen(i))
				if err != nil {
					return sqliteResult{}, err
				}
				if _, err := insert.ExecContext(ctx, args...); err != nil {
					return sqliteResult{}, err
				}
			}
			return sqliteResult{}, nil
		}})
		if res.err != nil {
			return res.err
		}
	}
	return nil
}

// SQLiteSchemaVersion is the SQLite schema version of this binary.
var SQLiteSchemaVersion = len(sqliteMigrations)

// SQLiteMigrateTo creates the database at path, or migrates it, to the
// first n migrations, as a binary of schema version n would when it opens
// it, and closes it.
func SQLiteMigrateTo(ctx context.Context, path string, n int) error {
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return err
	}
	defer db.Close()
	return migrateSQLite(ctx, db, sqliteMigrations[:n:n])
}

// SQLiteInsertAtSchema writes rec into db as it is (times and version
// included) as a binary of schema version 4 did: without the cluster
// column (which rec's Cluster must then leave empty).
func SQLiteInsertAtSchema(ctx context.Context, db *sql.DB, rec Record, version int) error {
	if version != 4 {
		return fmt.Errorf("schema version %d: only 4 is known here", version)
	}
	args, err := recordArgs(rec)
	if err != nil {
		return err
	}
	const n = 28 // up to cancelled_by
	cols := strings.Split(sqliteColumns, ",")[:n]
	_, err = db.ExecContext(ctx, "INSERT INTO tasks ("+strings.Join(cols, ",")+") VALUES (?"+strings.Repeat(", ?", n-1)+")", args[:n]...)
	return err
}
