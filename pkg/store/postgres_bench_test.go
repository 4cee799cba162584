package store_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/store"
)

// BenchmarkPostgresWrites measures PostgreSQL store writes per second with
// 1, 8 and 64 concurrent writers, on a server of its own with fsync on
// (synchronous_commit on, the data on disk under os.TempDir): every write is
// a durable commit. With 64 writers it also varies the pool size (4, the
// default 16, 64), which bounds the transactions in flight whose commits
// PostgreSQL flushes together. One op is one write: a Create of a new
// record, or an Update of the writer's own record (no conflicts); each line
// also reports the WAL fsyncs per write (pg_stat_wal), which show how many
// commits share one flush.
//
//	go test ./pkg/store -run '^$' -bench BenchmarkPostgresWrites -benchtime 3s
//
// With KUBETASK_TEST_POSTGRES_URL set, it runs on that server instead (its
// settings decide the durability).
func BenchmarkPostgresWrites(b *testing.B) {
	ctx := context.Background()
	srv := benchServer(b)
	for _, op := range []string{"create", "update"} {
		for _, tc := range []struct{ writers, conns int }{{1, 0}, {8, 0}, {64, 4}, {64, 0}, {64, 64}} {
			name := fmt.Sprintf("%s/writers=%d/conns=default", op, tc.writers)
			if tc.conns > 0 {
				name = fmt.Sprintf("%s/writers=%d/conns=%d", op, tc.writers, tc.conns)
			}
			b.Run(name, func(b *testing.B) {
				dbURL := srv.Database(b)
				if tc.conns > 0 {
					u, err := url.Parse(dbURL)
					if err != nil {
						b.Fatal(err)
					}
					q := u.Query()
					q.Set("pool_max_conns", fmt.Sprint(tc.conns))
					u.RawQuery = q.Encode()
					dbURL = u.String()
				}
				s, err := store.OpenPostgres(ctx, dbURL, store.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				syncs := walSyncs(b, srv)
				benchmarkWrites(b, s, op, tc.writers)
				if n := walSyncs(b, srv) - syncs; n > 0 {
					b.ReportMetric(float64(n)/float64(b.N), "fsyncs/write")
				}
			})
		}
	}
}

var bench struct {
	once sync.Once
	srv  *pgtest.Server
	err  error
}

// benchServer returns the benchmarks' server: one with fsync on, started
// once (the test binary's TestMain stops it), or the one
// KUBETASK_TEST_POSTGRES_URL names.
func benchServer(b *testing.B) *pgtest.Server {
	b.Helper()
	if os.Getenv(pgtest.URLEnv) != "" || os.Getenv(pgtest.SkipEnv) == "1" {
		return pgtest.Shared(b)
	}
	bench.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		bench.srv, bench.err = pgtest.Start(ctx, pgtest.Options{Fsync: true})
		if bench.err == nil {
			stopBenchServer = func() { _ = bench.srv.Stop() }
		}
	})
	if bench.err != nil {
		b.Fatal(bench.err)
	}
	return bench.srv
}

// stopBenchServer stops the benchmarks' server; TestMain calls it.
var stopBenchServer = func() {}

// walSyncs returns the server's WAL fsyncs so far (pg_stat_wal, PostgreSQL
// 14 and later; 0 before), after waiting for the backends to report theirs
// (at most once a second). Call it outside the timed part.
func walSyncs(b *testing.B, srv *pgtest.Server) int64 {
	b.Helper()
	time.Sleep(1100 * time.Millisecond)
	c, err := pgx.Connect(context.Background(), srv.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	var n int64
	if err := c.QueryRow(context.Background(), `SELECT wal_sync FROM pg_stat_wal`).Scan(&n); err != nil {
		return 0
	}
	return n
}
