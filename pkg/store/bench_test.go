package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

// BenchmarkStores measures the write path of one task's life as the executor
// drives it: Create, then three Updates (pod created, running, terminal).
// One op is one task; tasks/s is the figure docs/benchmarks.md quotes.
//
//	go test ./pkg/store -run '^$' -bench BenchmarkStores -benchtime 2000x
func BenchmarkStores(b *testing.B) {
	stores := map[string]func(b *testing.B) store.Store{
		"memory": func(b *testing.B) store.Store { return store.NewMemory() },
		"sqlite": func(b *testing.B) store.Store {
			s, err := store.OpenSQLite(context.Background(), filepath.Join(b.TempDir(), "tasks.db"))
			if err != nil {
				b.Fatal(err)
			}
			return s
		},
	}
	for _, name := range []string{"memory", "sqlite"} {
		for _, writers := range []int{1, 4} {
			b.Run(fmt.Sprintf("%s/writers=%d", name, writers), func(b *testing.B) {
				s := stores[name](b)
				defer s.Close()
				benchmarkTaskWrites(b, s, writers)
			})
		}
	}
}

// benchmarkTaskWrites runs b.N task lifecycles spread over writers goroutines.
func benchmarkTaskWrites(b *testing.B, s store.Store, writers int) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	b.ReportAllocs()
	b.ResetTimer()
	for range writers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				rec, _, err := s.Create(ctx, storetest.Sample(fmt.Sprintf("task-%08d", i)))
				if err != nil {
					errs <- err
					return
				}
				for step := range 3 {
					rec.PodCreated = true
					rec.Phase = []string{"Pending", "Running", "Succeeded"}[step]
					rec.Terminal = step == 2
					if rec, err = s.Update(ctx, rec); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkSQLiteWrites measures SQLite writes per second at
// synchronous=FULL with 1, 8 and 64 concurrent writers, first on the
// one-transaction-per-write path (onetx, the baseline), then with group
// commit (group), whose line also reports x-onetx: its rate divided by the
// baseline's from the same run. One op is one write: a Create of a new
// record, or an Update of the writer's own record (so no write conflicts).
//
//	go test ./pkg/store -run '^$' -bench BenchmarkSQLiteWrites -benchtime 3s
func BenchmarkSQLiteWrites(b *testing.B) {
	for _, op := range []string{"create", "update"} {
		for _, writers := range []int{1, 8, 64} {
			var baseline float64
			b.Run(fmt.Sprintf("%s/writers=%d/onetx", op, writers), func(b *testing.B) {
				s, err := store.OpenSQLiteOneTxPerWrite(context.Background(), filepath.Join(b.TempDir(), "tasks.db"))
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				baseline = benchmarkWrites(b, s, op, writers)
			})
			b.Run(fmt.Sprintf("%s/writers=%d/group", op, writers), func(b *testing.B) {
				s, err := store.OpenSQLite(context.Background(), filepath.Join(b.TempDir(), "tasks.db"))
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				if rate := benchmarkWrites(b, s, op, writers); baseline > 0 {
					b.ReportMetric(rate/baseline, "x-onetx")
				}
			})
		}
	}
}

// benchmarkWrites runs b.N writes of kind op ("create" or "update") spread
// over writers goroutines and returns the writes per second. With group
// commit it also reports the average writes per committed transaction.
func benchmarkWrites(b *testing.B, s store.Store, op string, writers int) float64 {
	ctx := context.Background()
	own := make([]store.Record, writers)
	if op == "update" {
		for w := range own {
			rec, _, err := s.Create(ctx, storetest.Sample(fmt.Sprintf("writer-%03d", w)))
			if err != nil {
				b.Fatal(err)
			}
			own[w] = rec
		}
	}
	commitsBefore := store.SQLiteCommits(s)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	b.ReportAllocs()
	b.ResetTimer()
	for w := range writers {
		wg.Go(func() {
			rec := own[w]
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				var err error
				switch op {
				case "create":
					_, _, err = s.Create(ctx, storetest.Sample(fmt.Sprintf("task-%08d", i)))
				case "update":
					rec.Message = fmt.Sprintf("write %d", i)
					rec, err = s.Update(ctx, rec)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	rate := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(rate, "writes/s")
	if commits := store.SQLiteCommits(s) - commitsBefore; commits > 0 {
		b.ReportMetric(float64(b.N)/float64(commits), "writes/commit")
	}
	return rate
}
