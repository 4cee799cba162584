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
//	go test ./internal/store -run '^$' -bench BenchmarkStores -benchtime 2000x
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
