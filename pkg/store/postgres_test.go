package store_test

import (
	"context"
	"testing"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

// openPostgres opens a store on a new database of the shared test server.
func openPostgres(t *testing.T, opts store.Options) store.Store {
	t.Helper()
	s, err := store.OpenPostgres(context.Background(), pgtest.Database(t), opts)
	if err != nil {
		t.Fatalf("OpenPostgres: %v", err)
	}
	return s
}

// TestPostgres runs the conformance suite against the PostgreSQL store, each
// case on a database of its own.
func TestPostgres(t *testing.T) {
	storetest.RunWithOptions(t, openPostgres)
}
