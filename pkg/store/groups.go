package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Member is a process of a replica group as the store last heard of it.
type Member struct {
	// Identity names the process in its group; LeaseNamespace is where it
	// holds its Leases.
	Identity, LeaseNamespace string
	// Age is how long ago it last said it runs, by the store's clock.
	Age time.Duration
}

// Groups is implemented by stores that the replicas of a group share
// (PostgreSQL): what every replica must agree on and cannot see in the
// Leases of its own namespace.
type Groups interface {
	// Heartbeat records that member of group runs now, holding its Leases
	// in leaseNamespace.
	Heartbeat(ctx context.Context, group, member, leaseNamespace string) error
	// Leave forgets member of group.
	Leave(ctx context.Context, group, member string) error
	// Members returns the members of group heard of within the last
	// within.
	Members(ctx context.Context, group string, within time.Duration) ([]Member, error)
	// UnfinishedByExecutor counts the unfinished records of each executor
	// instance.
	UnfinishedByExecutor(ctx context.Context) (map[string]int, error)
}

var _ Groups = (*postgresStore)(nil)

func (s *postgresStore) Heartbeat(ctx context.Context, group, member, leaseNamespace string) error {
	err := s.write(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		_, err := c.Exec(ctx, `INSERT INTO kubetask_members (grp, member, lease_namespace, seen_at) VALUES ($1, $2, $3, clock_timestamp())
			ON CONFLICT (grp, member) DO UPDATE SET lease_namespace = excluded.lease_namespace, seen_at = excluded.seen_at`, group, member, leaseNamespace)
		return err
	})
	if err != nil {
		return fmt.Errorf("heartbeat of %s in group %s: %w", member, group, err)
	}
	return nil
}

func (s *postgresStore) Leave(ctx context.Context, group, member string) error {
	err := s.write(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		_, err := c.Exec(ctx, `DELETE FROM kubetask_members WHERE grp = $1 AND member = $2`, group, member)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s leaving group %s: %w", member, group, err)
	}
	return nil
}

func (s *postgresStore) Members(ctx context.Context, group string, within time.Duration) ([]Member, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("members of group %s: %w", group, err)
	}
	defer c.Release()
	rows, err := c.Query(ctx, `SELECT member, lease_namespace, extract(epoch FROM clock_timestamp() - seen_at)
		FROM kubetask_members WHERE grp = $1 AND seen_at > clock_timestamp() - make_interval(secs => $2) ORDER BY member`,
		group, within.Seconds())
	if err != nil {
		return nil, fmt.Errorf("members of group %s: %w", group, unavailable(err))
	}
	defer rows.Close()
	var out []Member
	for rows.Next() {
		var m Member
		var age float64
		if err := rows.Scan(&m.Identity, &m.LeaseNamespace, &age); err != nil {
			return nil, fmt.Errorf("members of group %s: %w", group, err)
		}
		m.Age = time.Duration(age * float64(time.Second))
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("members of group %s: %w", group, unavailable(err))
	}
	return out, nil
}

func (s *postgresStore) UnfinishedByExecutor(ctx context.Context) (map[string]int, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("unfinished records: %w", err)
	}
	defer c.Release()
	rows, err := c.Query(ctx, `SELECT executor, count(*) FROM tasks WHERE NOT terminal GROUP BY executor`)
	if err != nil {
		return nil, fmt.Errorf("unfinished records: %w", unavailable(err))
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var exec []byte
		var n int
		if err := rows.Scan(&exec, &n); err != nil {
			return nil, fmt.Errorf("unfinished records: %w", err)
		}
		out[string(exec)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("unfinished records: %w", unavailable(err))
	}
	return out, nil
}
