package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Member is a process of a replica group as the store last heard of it.
type Member struct {
	// Identity names the process in its group; LeaseNamespace is where it
	// holds its Leases.
	Identity, LeaseNamespace string
	// Shards is the shard count the process runs with (--shards); 0 when
	// a kubetask that did not record it (schema version 4 and before)
	// registered it: unknown.
	Shards int
	// Joined is the member's place in its group's join order (Join): of
	// two members, the one that joined first has the smaller Joined; 0
	// when a kubetask that did not record it registered the member.
	Joined int64
	// Age is how long ago it last said it runs, by the store's clock.
	Age time.Duration
}

// Groups is implemented by stores that the replicas of a group share
// (PostgreSQL): what every replica must agree on and cannot see in the
// Leases of its own namespace.
type Groups interface {
	// Join records that m (its Identity, LeaseNamespace and Shards; Joined
	// and Age are ignored) runs now as a member of group, and returns the
	// members of group heard of within the last within, m among them, as
	// they are once m is recorded. Joins of a group are serial: of two
	// Joins at once, the one that answers second has the other's member in
	// its answer, with the smaller Joined. m keeps its place in the join
	// order while it was heard of within the last within with the same
	// Shards; otherwise (new, gone quiet, or another count) it joins anew,
	// after every member present.
	Join(ctx context.Context, group string, m Member, within time.Duration) ([]Member, error)
	// Heartbeat records that m of group runs now, as Join does but without
	// the answer, and keeping m's place in the join order however long it
	// was quiet, as long as its Shards are the same: a member that joined
	// keeps the place it joined at.
	Heartbeat(ctx context.Context, group string, m Member) error
	// Leave forgets member of group.
	Leave(ctx context.Context, group, member string) error
	// Members returns the members of group heard of within the last
	// within, ordered by Identity.
	Members(ctx context.Context, group string, within time.Duration) ([]Member, error)
	// UnfinishedByExecutor counts the unfinished records of each executor
	// instance.
	UnfinishedByExecutor(ctx context.Context) (map[string]int, error)
}

var _ Groups = (*postgresStore)(nil)

// postgresMembersLock is the first key of the transaction-level advisory
// lock (pg_advisory_xact_lock(int, int)) that serialises the writes of a
// group's members, the second being a hash of the group: "ktmb". The
// two-key locks are apart from the one-key lock of the migrations.
const postgresMembersLock int32 = 0x6b746d62

// postgresMembersSQL are the statements of Groups.
var postgresMembersSQL = struct{ register, members string }{
	// $5 > 0: keep the place only if heard of within $5 seconds (Join);
	// else however long ago (Heartbeat). A new place is the group's
	// largest plus one, under the group's lock.
	register: `INSERT INTO kubetask_members AS m (grp, member, lease_namespace, shards, joined, seen_at)
		VALUES ($1, $2, $3, $4, (SELECT coalesce(max(joined), 0) + 1 FROM kubetask_members WHERE grp = $1), clock_timestamp())
		ON CONFLICT (grp, member) DO UPDATE SET lease_namespace = excluded.lease_namespace, shards = excluded.shards,
			seen_at = excluded.seen_at,
			joined = CASE WHEN m.shards = excluded.shards AND m.joined > 0
				AND ($5::float8 <= 0 OR m.seen_at > clock_timestamp() - make_interval(secs => $5::float8))
				THEN m.joined ELSE excluded.joined END`,
	members: `SELECT member, lease_namespace, shards, joined, extract(epoch FROM clock_timestamp() - seen_at)
		FROM kubetask_members WHERE grp = $1 AND (seen_at > clock_timestamp() - make_interval(secs => $2) OR member = $3)
		ORDER BY member`,
}

func (s *postgresStore) Join(ctx context.Context, group string, m Member, within time.Duration) ([]Member, error) {
	var out []Member
	err := s.write(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if err := registerMember(ctx, tx, group, m, within.Seconds()); err != nil {
				return err
			}
			var err error
			out, err = queryMembers(ctx, tx, group, within, m.Identity)
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("%s joining group %s: %w", m.Identity, group, err)
	}
	return out, nil
}

func (s *postgresStore) Heartbeat(ctx context.Context, group string, m Member) error {
	err := s.write(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error { return registerMember(ctx, tx, group, m, 0) })
	})
	if err != nil {
		return fmt.Errorf("heartbeat of %s in group %s: %w", m.Identity, group, err)
	}
	return nil
}

// registerMember writes m's row under the group's lock (keeping its place
// if heard of within the last within seconds, or ever when within is 0).
func registerMember(ctx context.Context, tx pgx.Tx, group string, m Member, within float64) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, postgresMembersLock, group); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, postgresMembersSQL.register, group, m.Identity, m.LeaseNamespace, m.Shards, within)
	return err
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
	out, err := queryMembers(ctx, c, group, within, "")
	if err != nil {
		return nil, fmt.Errorf("members of group %s: %w", group, unavailable(err))
	}
	return out, nil
}

// queryMembers reads the members of group heard of within the last within,
// and self (which Join just heard of, however small within is).
func queryMembers(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, group string, within time.Duration, self string,
) ([]Member, error) {
	rows, err := q.Query(ctx, postgresMembersSQL.members, group, within.Seconds(), self)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Member
	for rows.Next() {
		var m Member
		var age float64
		if err := rows.Scan(&m.Identity, &m.LeaseNamespace, &m.Shards, &m.Joined, &age); err != nil {
			return nil, err
		}
		m.Age = time.Duration(age * float64(time.Second))
		out = append(out, m)
	}
	return out, rows.Err()
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
