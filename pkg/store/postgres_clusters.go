package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// postgresClusterSQL are the statements of the clusters' rows (migration
// 6). The compare-and-swap is part of the INSERT (ON CONFLICT DO NOTHING)
// and of the UPDATE (the version in its WHERE clause), so of concurrent
// writes from one version, in one process or several, exactly one matches.
var postgresClusterSQL = struct{ insert, update, version, get, list string }{
	insert: `INSERT INTO kubetask_clusters (name, state, since, reason, message, labels, mode, version, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8) ON CONFLICT (name) DO NOTHING RETURNING version`,
	update: `UPDATE kubetask_clusters SET state = $2, since = $3, reason = $4, message = $5, labels = $6, mode = $7,
		version = version + 1, updated_at = $8
		WHERE name = $1 AND version = $9 RETURNING version`,
	version: `SELECT version FROM kubetask_clusters WHERE name = $1`,
	get:     `SELECT ` + postgresClusterColumns + ` FROM kubetask_clusters WHERE name = $1`,
	list:    `SELECT ` + postgresClusterColumns + ` FROM kubetask_clusters ORDER BY name`,
}

// postgresClusterColumns are a cluster row's columns, in
// scanPostgresCluster's order.
const postgresClusterColumns = `name, state, since, reason, message, labels, mode, version, updated_at`

func (s *postgresStore) PutCluster(ctx context.Context, c Cluster) (Cluster, error) {
	c, err := c.storable(time.Unix(0, s.clock.Now().UnixNano()).UTC())
	if err != nil {
		return Cluster{}, err
	}
	var labels []byte // nil: NULL
	if c.Labels != nil {
		if labels, err = json.Marshal(c.Labels); err != nil {
			return Cluster{}, fmt.Errorf("cluster %s write: labels encoding: %w", c.Name, err)
		}
	}
	cols := []any{c.Name, string(c.State), c.Since.UnixNano(), bytesOf(c.Reason), bytesOf(c.Message), labels, string(c.Mode), c.UpdatedAt.UnixNano()}
	err = s.write(ctx, func(ctx context.Context, conn *pgxpool.Conn) error {
		var version int64
		var err error
		if c.Version == 0 {
			err = conn.QueryRow(ctx, postgresClusterSQL.insert, cols...).Scan(&version)
		} else {
			err = conn.QueryRow(ctx, postgresClusterSQL.update, append(cols, c.Version)...).Scan(&version)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		// Nothing written: say why. The row was there (a create) or its
		// version was another (an update), or there was none; a version
		// only grows, so the one read now tells which.
		var stored int64
		switch err := conn.QueryRow(ctx, postgresClusterSQL.version, c.Name).Scan(&stored); {
		case errors.Is(err, pgx.ErrNoRows):
			return clusterWriteRefused(c, 0, false)
		case err != nil:
			return err
		}
		return clusterWriteRefused(c, stored, true)
	})
	if err != nil {
		return Cluster{}, fmt.Errorf("cluster %s write: %w", c.Name, err)
	}
	c.Version++
	return c, nil
}

func (s *postgresStore) GetCluster(ctx context.Context, name string) (_ Cluster, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	defer func() { err = timedOut(ctx, err) }()
	if ValidateClusterName(name) != nil { // no row has it; text may not even hold it
		return Cluster{}, fmt.Errorf("cluster %q: %w", name, errNoCluster)
	}
	c, err := s.conn(ctx)
	if err != nil {
		return Cluster{}, fmt.Errorf("cluster %s: %w", name, err)
	}
	defer c.Release()
	out, err := scanPostgresCluster(c.QueryRow(ctx, postgresClusterSQL.get, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return Cluster{}, fmt.Errorf("cluster %s: %w", name, errNoCluster)
	}
	if err != nil {
		return Cluster{}, fmt.Errorf("cluster %s: %w", name, unavailable(err))
	}
	return out, nil
}

func (s *postgresStore) ListClusters(ctx context.Context) (_ []Cluster, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	defer func() { err = timedOut(ctx, err) }()
	c, err := s.conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster list: %w", err)
	}
	defer c.Release()
	rows, err := c.Query(ctx, postgresClusterSQL.list)
	if err != nil {
		return nil, fmt.Errorf("cluster list: %w", unavailable(err))
	}
	defer rows.Close()
	var out []Cluster
	for rows.Next() {
		cl, err := scanPostgresCluster(rows)
		if err != nil {
			return nil, fmt.Errorf("cluster list: %w", unavailable(err))
		}
		out = append(out, cl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cluster list: %w", unavailable(err))
	}
	return out, nil
}

// Move is one conditional UPDATE (postgresSQL.move): the version and the
// nonce, the claim (no pod, not finished) and the fence are conditions on
// the row it locks, re-checked on the row a concurrent write committed, so
// of concurrent moves and claims from one version exactly one is applied,
// across processes. When it matched nothing, the record read next tells why
// (moveRefused: a record at a given version with a given nonce never
// changes, so the reading is exact without a transaction around both).
func (s *postgresStore) Move(ctx context.Context, rec Record, executor, cluster string) (Record, error) {
	rec, err := moving(rec, executor, cluster)
	if err != nil {
		return Record{}, err
	}
	expected := rec.Version
	rec.Version = expected + 1
	rec.UpdatedAt = time.Unix(0, s.clock.Now().UnixNano()).UTC()
	args, err := postgresUpdateArgs(rec, expected)
	if err != nil {
		return Record{}, fmt.Errorf("task record %s move: %w", rec.ID, err)
	}
	err = s.write(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		if !storableID(rec.ID) {
			return ErrNotFound
		}
		var createdAt int64
		err := c.QueryRow(ctx, postgresSQL.move, args...).Scan(&createdAt)
		if errors.Is(err, pgx.ErrNoRows) {
			var (
				stored               int64
				storedNonce          []byte
				podCreated, terminal bool
			)
			switch err := c.QueryRow(ctx, postgresSQL.moveState, rec.ID).Scan(&stored, &storedNonce, &podCreated, &terminal); {
			case errors.Is(err, pgx.ErrNoRows):
				return ErrNotFound
			case err != nil:
				return err
			}
			return moveRefused(rec, expected, stored, string(storedNonce), terminal, podCreated)
		}
		if err != nil {
			return err
		}
		rec.CreatedAt = time.Unix(0, createdAt).UTC()
		return nil
	})
	if err != nil {
		return Record{}, fmt.Errorf("task record %s move to %s (cluster %q): %w", rec.ID, executor, cluster, err)
	}
	return rec, nil
}

func scanPostgresCluster(row pgx.Row) (Cluster, error) {
	var (
		c                Cluster
		state, mode      string
		reason, message  []byte
		labels           []byte
		since, updatedAt int64
	)
	if err := row.Scan(&c.Name, &state, &since, &reason, &message, &labels, &mode, &c.Version, &updatedAt); err != nil {
		return Cluster{}, err
	}
	c.State, c.Mode = ClusterState(state), ClusterMode(mode)
	c.Reason, c.Message = string(reason), string(message)
	c.Since, c.UpdatedAt = time.Unix(0, since).UTC(), time.Unix(0, updatedAt).UTC()
	if labels != nil {
		if err := json.Unmarshal(labels, &c.Labels); err != nil {
			return Cluster{}, fmt.Errorf("cluster %s labels decoding: %w", c.Name, err)
		}
	}
	return c, nil
}
