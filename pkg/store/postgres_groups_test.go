package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/kubetask/kubetask/pkg/store"
)

// TestPostgresGroups: heartbeats make members, Leave and age forget them,
// and unfinished records are counted by executor instance.
func TestPostgresGroups(t *testing.T) {
	ctx := context.Background()
	s := openPostgres(t, store.Options{})
	defer s.Close()
	g := s.(store.Groups)
	for _, m := range []struct{ member, ns string }{{"r0", "a"}, {"r1", "a"}, {"r0", "b"}} {
		if err := g.Heartbeat(ctx, "g", m.member, m.ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Heartbeat(ctx, "other", "r9", "z"); err != nil {
		t.Fatal(err)
	}
	got, err := g.Members(ctx, "g", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Identity != "r0" || got[0].LeaseNamespace != "b" || got[1].Identity != "r1" || got[1].LeaseNamespace != "a" {
		t.Fatalf("members %+v, want r0 in b (its last heartbeat) and r1 in a", got)
	}
	if got[0].Age < 0 || got[0].Age > 10*time.Second {
		t.Fatalf("age %s", got[0].Age)
	}
	if err := g.Leave(ctx, "g", "r0"); err != nil {
		t.Fatal(err)
	}
	if got, err = g.Members(ctx, "g", time.Minute); err != nil || len(got) != 1 || got[0].Identity != "r1" {
		t.Fatalf("members after r0 left: %+v, %v", got, err)
	}
	// r1's heartbeat was a round trip ago: more than a microsecond by the
	// server's clock.
	if got, err = g.Members(ctx, "g", time.Microsecond); err != nil || len(got) != 0 {
		t.Fatalf("members heard of in the last microsecond: %+v, %v", got, err)
	}

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
