package store_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kubetask/kubetask/pkg/store"
)

// CountNamespace counts a namespace's unfinished and kept tasks, on the
// memory and SQLite stores (PostgreSQL's runs the same query shape).
func TestCountNamespace(t *testing.T) {
	ctx := context.Background()
	sq, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sq.Close() })
	for name, st := range map[string]store.Store{"memory": store.NewMemory(), "sqlite": sq} {
		for _, r := range []store.Record{
			{ID: "a1", Namespace: "team-a", Name: "x", Executor: "e", Task: []byte(`{}`)},
			{ID: "a2", Namespace: "team-a", Name: "x", Executor: "e", Task: []byte(`{}`), Terminal: true},
			{ID: "a3", Namespace: "team-a", Name: "x", Executor: "e", Task: []byte(`{}`)},
			{ID: "c1", Namespace: "team-c", Name: "x", Executor: "e", Task: []byte(`{}`)},
		} {
			if _, _, err := st.Create(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		c, err := st.(store.NamespaceCounter).CountNamespace(ctx, "team-a")
		if err != nil {
			t.Fatal(err)
		}
		if c != (store.NamespaceCount{Unfinished: 2, Total: 3}) {
			t.Errorf("%s: %+v, want 2 unfinished of 3", name, c)
		}
		if c, _ := st.(store.NamespaceCounter).CountNamespace(ctx, "nobody"); c != (store.NamespaceCount{}) {
			t.Errorf("%s: an empty namespace: %+v", name, c)
		}
	}
}
