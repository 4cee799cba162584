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

// OpenSQLiteBeforeCommit opens a SQLite store whose writer calls
// beforeCommit with the number of writes applied in each group just before
// committing it.
func OpenSQLiteBeforeCommit(ctx context.Context, path string, beforeCommit func(applied int)) (Store, error) {
	return openSQLiteStore(ctx, path, clock.RealClock{}, sqliteOptions{beforeCommit: beforeCommit})
}

// SQLiteQueued returns how many writes wait in s's queue for the writer.
func SQLiteQueued(s Store) int {
	return len(s.(*sqliteStore).queue)
}
