package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// sqliteClusterSQL are the statements of the clusters' rows (schema
// version 5). They run seldom, so they are not prepared.
var sqliteClusterSQL = struct{ insert, update, version, get, list string }{
	insert: `INSERT INTO clusters (name, state, since, reason, message, labels, mode, version, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?) ON CONFLICT (name) DO NOTHING`,
	// The version check is part of the statement, as Update's.
	update: `UPDATE clusters SET state = ?, since = ?, reason = ?, message = ?, labels = ?, mode = ?,
		version = version + 1, updated_at = ?
		WHERE name = ? AND version = ?`,
	version: `SELECT version FROM clusters WHERE name = ?`,
	get:     `SELECT ` + sqliteClusterColumns + ` FROM clusters WHERE name = ?`,
	list:    `SELECT ` + sqliteClusterColumns + ` FROM clusters ORDER BY name`,
}

// sqliteClusterColumns are a cluster row's columns, in scanSQLiteCluster's
// order.
const sqliteClusterColumns = `name, state, since, reason, message, labels, mode, version, updated_at`

// PutCluster is a write of the group-commit writer, with Update's
// guarantees; its compare-and-swap is part of its statement.
func (s *sqliteStore) PutCluster(ctx context.Context, c Cluster) (Cluster, error) {
	c, err := c.storable(s.clock.Now())
	if err != nil {
		return Cluster{}, err
	}
	labels, err := labelsJSON(c.Labels)
	if err != nil {
		return Cluster{}, fmt.Errorf("cluster %s write: %w", c.Name, err)
	}
	res := s.write(ctx, &sqliteWrite{run: func(ctx context.Context, tx *sql.Tx, _ *sqliteWriteStmts) (sqliteResult, error) {
		var (
			res sql.Result
			err error
		)
		if c.Version == 0 {
			res, err = tx.ExecContext(ctx, sqliteClusterSQL.insert,
				c.Name, string(c.State), c.Since.UnixNano(), c.Reason, c.Message, labels, string(c.Mode), c.UpdatedAt.UnixNano())
		} else {
			res, err = tx.ExecContext(ctx, sqliteClusterSQL.update,
				string(c.State), c.Since.UnixNano(), c.Reason, c.Message, labels, string(c.Mode), c.UpdatedAt.UnixNano(), c.Name, c.Version)
		}
		if err != nil {
			return sqliteResult{}, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return sqliteResult{}, err
		}
		if n == 1 {
			out := c
			out.Version++
			return sqliteResult{cluster: out}, nil
		}
		// Nothing written: say why. A failed read changes nothing, so it
		// fails this write only.
		var stored int64
		switch err := tx.QueryRowContext(ctx, sqliteClusterSQL.version, c.Name).Scan(&stored); {
		case errors.Is(err, sql.ErrNoRows):
			return sqliteResult{err: clusterWriteRefused(c, 0, false)}, nil
		case err != nil:
			return sqliteResult{err: err}, nil
		}
		return sqliteResult{err: clusterWriteRefused(c, stored, true)}, nil
	}})
	if res.err != nil {
		return Cluster{}, fmt.Errorf("cluster %s write: %w", c.Name, res.err)
	}
	return res.cluster, nil
}

func (s *sqliteStore) GetCluster(ctx context.Context, name string) (Cluster, error) {
	c, err := scanSQLiteCluster(s.r.QueryRowContext(ctx, sqliteClusterSQL.get, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Cluster{}, fmt.Errorf("cluster %s: %w", name, errNoCluster)
	}
	if err != nil {
		return Cluster{}, fmt.Errorf("cluster %s: %w", name, err)
	}
	return c, nil
}

func (s *sqliteStore) ListClusters(ctx context.Context) ([]Cluster, error) {
	rows, err := s.r.QueryContext(ctx, sqliteClusterSQL.list)
	if err != nil {
		return nil, fmt.Errorf("cluster list: %w", err)
	}
	defer rows.Close()
	var out []Cluster
	for rows.Next() {
		c, err := scanSQLiteCluster(rows)
		if err != nil {
			return nil, fmt.Errorf("cluster list: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cluster list: %w", err)
	}
	return out, nil
}

// Move is a write of the group-commit writer, with Update's guarantees: the
// version and the nonce, the claim (no pod, not finished) and the fence are
// conditions of its one UPDATE statement (sqliteWriteSQL.move), and the
// record read after it matched nothing, in the same transaction, tells
// which failed.
func (s *sqliteStore) Move(ctx context.Context, rec Record, executor, cluster string) (Record, error) {
	rec, err := moving(rec, executor, cluster)
	if err != nil {
		return Record{}, err
	}
	expected := rec.Version
	rec.Version = expected + 1
	rec.UpdatedAt = s.clock.Now()
	rec.CreatedAt = time.Time{} // kept as stored; the caller's is ignored
	args, err := recordArgs(rec)
	if err != nil {
		return Record{}, fmt.Errorf("task record %s move: %w", rec.ID, err)
	}
	args = sqliteUpdateArgs(args, rec, expected)
	res := s.write(ctx, &sqliteWrite{run: func(ctx context.Context, tx *sql.Tx, st *sqliteWriteStmts) (sqliteResult, error) {
		var createdAt int64
		err := tx.StmtContext(ctx, st.move).QueryRowContext(ctx, args...).Scan(&createdAt)
		if errors.Is(err, sql.ErrNoRows) {
			var (
				stored               int64
				storedNonce          string
				podCreated, terminal bool
			)
			switch err := tx.StmtContext(ctx, st.moveState).QueryRowContext(ctx, rec.ID).Scan(&stored, &storedNonce, &podCreated, &terminal); {
			case errors.Is(err, sql.ErrNoRows):
				return sqliteResult{err: ErrNotFound}, nil
			case err != nil:
				return sqliteResult{err: err}, nil
			}
			return sqliteResult{err: moveRefused(rec, expected, stored, storedNonce, terminal, podCreated)}, nil
		}
		if err != nil {
			return sqliteResult{}, err
		}
		out := rec
		out.CreatedAt = time.Unix(0, createdAt).UTC()
		return sqliteResult{rec: out}, nil
	}})
	if res.err != nil {
		return Record{}, fmt.Errorf("task record %s move to %s (cluster %q): %w", rec.ID, executor, cluster, res.err)
	}
	return res.rec, nil
}

// labelsJSON is labels as a column value: JSON with sorted keys, NULL for
// nil.
func labelsJSON(labels map[string]string) (sql.NullString, error) {
	if labels == nil {
		return sql.NullString{}, nil
	}
	b, err := json.Marshal(labels)
	if err != nil {
		return sql.NullString{}, fmt.Errorf("labels encoding: %w", err)
	}
	return sql.NullString{String: string(b), Valid: true}, nil
}

func scanSQLiteCluster(row scanner) (Cluster, error) {
	var (
		c                Cluster
		state, mode      string
		since, updatedAt int64
		labels           sql.NullString
	)
	if err := row.Scan(&c.Name, &state, &since, &c.Reason, &c.Message, &labels, &mode, &c.Version, &updatedAt); err != nil {
		return Cluster{}, err
	}
	c.State, c.Mode = ClusterState(state), ClusterMode(mode)
	c.Since, c.UpdatedAt = time.Unix(0, since).UTC(), time.Unix(0, updatedAt).UTC()
	if labels.Valid {
		if err := json.Unmarshal([]byte(labels.String), &c.Labels); err != nil {
			return Cluster{}, fmt.Errorf("cluster %s labels decoding: %w", c.Name, err)
		}
	}
	return c, nil
}
