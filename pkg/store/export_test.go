package store

import (
	"context"

	"k8s.io/utils/clock"
)

// OpenSQLiteOneTxPerWrite opens a SQLite store on the write path before group
// commit (one transaction and one sync per write), the benchmark's baseline.
func OpenSQLiteOneTxPerWrite(ctx context.Context, path string) (Store, error) {
	return openSQLiteStore(ctx, path, clock.RealClock{}, sqliteOptions{oneTxPerWrite: true})
}

// SQLiteCommits returns how many group transactions s has committed.
func SQLiteCommits(s Store) int64 {
	return s.(*sqliteStore).commits.Load()
}
