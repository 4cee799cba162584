package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

// TestPostgresGroups runs the conformance suite of store.Groups against
// the PostgreSQL store, each case on a database of its own.
func TestPostgresGroups(t *testing.T) {
	t.Parallel()
	storetest.RunGroups(t, func(t *testing.T) store.Groups {
		s := openPostgres(t, store.Options{})
		t.Cleanup(func() { s.Close() })
		return s.(store.Groups)
	})
}

// TestPostgresUnfinishedByExecutor: unfinished records are counted by
// executor instance.
func TestPostgresUnfinishedByExecutor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openPostgres(t, store.Options{})
	defer s.Close()
	g := s.(store.Groups)
	for i, r := range []store.Record{
		{ID: "t1", Executor: "g-shard-0"},
		{ID: "t2", Executor: "g-shard-0"},
		{ID: "t3", Executor: "g-shard-5"},
		{ID: "t4", Executor: "g-shard-5", Phase: "Succeeded", Terminal: true},
	} {
		r.Namespace, r.Name, r.Task = "ns", r.ID, []byte("{}")
		if _, _, err := s.Create(ctx, r); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	counts, err := g.UnfinishedByExecutor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) != 2 || counts["g-shard-0"] != 2 || counts["g-shard-5"] != 1 {
		t.Fatalf("unfinished by executor %v, want g-shard-0: 2, g-shard-5: 1", counts)
	}
}

// TestPostgresMembersOfAnOlderBinary: rows of kubetask_members written by a
// binary of schema version 4, before the migration and after it (its
// statements name neither shards nor joined), read as members of unknown
// count (Shards and Joined 0), and a Join of this binary places itself
// after them.
func TestPostgresMembersOfAnOlderBinary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	old, err := store.OpenPostgresMigrations(ctx, url, 4)
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
	c := rawPostgres(t, url)
	// Schema version 4's heartbeat, verbatim.
	heartbeat := func(member string) {
		t.Helper()
		if _, err := c.Exec(ctx, `INSERT INTO kubetask_members (grp, member, lease_namespace, seen_at) VALUES ($1, $2, $3, clock_timestamp())
			ON CONFLICT (grp, member) DO UPDATE SET lease_namespace = excluded.lease_namespace, seen_at = excluded.seen_at`, "g", member, "ns"); err != nil {
			t.Fatal(err)
		}
	}
	heartbeat("before")
	s := openPostgresURL(t, url)
	heartbeat("after")
	heartbeat("before")
	g := s.(store.Groups)
	got, err := g.Join(ctx, "g", store.Member{Identity: "new", LeaseNamespace: "ns", Shards: 12}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Member{
		{Identity: "after", LeaseNamespace: "ns"},
		{Identity: "before", LeaseNamespace: "ns"},
		{Identity: "new", LeaseNamespace: "ns", Shards: 12, Joined: 1},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(store.Member{}, "Age")); diff != "" {
		t.Errorf("members (-want +got):\n%s", diff)
	}
}
