package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// BenchmarkSQLiteOpenLoop measures the latency of a Create in the SQLite
// store when creates arrive at a fixed rate (an open loop, each on its own
// goroutine, as kubetask serve's submissions at a given rate), each task then
// written three more times 20 ms apart (pod created, running, terminal: the
// executor's writes, which share the group commits). The baseline, in the
// same run and store, is b.N lone creates one after the other: a commit's
// own cost (synchronous=FULL: an fsync). One op is one task;
// KUBETASK_BENCH_STORE_RATE sets the rate (default 150 creates/s).
//
//	go test ./pkg/store -run '^$' -bench BenchmarkSQLiteOpenLoop -benchtime 1500x
func BenchmarkSQLiteOpenLoop(b *testing.B) {
	rate := 150.0
	if r, err := strconv.ParseFloat(os.Getenv("KUBETASK_BENCH_STORE_RATE"), 64); err == nil && r > 0 {
		rate = r
	}
	ctx := context.Background()
	s, err := store.OpenSQLite(ctx, filepath.Join(b.TempDir(), "tasks.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	n := b.N
	lone := make([]time.Duration, n)
	for i := range n {
		t0 := time.Now()
		if _, _, err := s.Create(ctx, storetest.Sample(fmt.Sprintf("lone-%08d", i))); err != nil {
			b.Fatal(err)
		}
		lone[i] = time.Since(t0)
	}
	lat := make([]time.Duration, n)
	errs := make(chan error, n)
	commitsBefore := store.SQLiteCommits(s)
	period := time.Duration(float64(time.Second) / rate)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * period)
		time.Sleep(time.Until(at)) // the schedule
		wg.Go(func() {
			rec, _, err := s.Create(ctx, storetest.Sample(fmt.Sprintf("task-%08d", i)))
			lat[i] = time.Since(at)
			if err != nil {
				errs <- err
				return
			}
			for _, phase := range []string{"Pending", "Running", "Succeeded"} {
				time.Sleep(20 * time.Millisecond) // the executor's next write of the task
				rec.Phase = phase
				if rec, err = s.Update(ctx, rec); err != nil {
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
	q := func(xs []time.Duration, q float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return float64(s[min(int(q*float64(len(s))), len(s)-1)]) / float64(time.Millisecond)
	}
	b.ReportMetric(rate, "offered/s")
	b.ReportMetric(q(lat, 0.5), "create-p50-ms")
	b.ReportMetric(q(lat, 0.99), "create-p99-ms")
	b.ReportMetric(q(lone, 0.5), "lone-p50-ms")
	b.ReportMetric(q(lone, 0.99), "lone-p99-ms")
	b.ReportMetric(float64(4*n)/float64(store.SQLiteCommits(s)-commitsBefore), "writes/commit")
	fmt.Printf("SQLite store, %d creates offered at %g/s, each written 3 more times 20 ms apart: create p50 %.1f ms p99 %.1f ms; lone creates p50 %.1f ms p99 %.1f ms; load average %s\n",
		n, rate, q(lat, 0.5), q(lat, 0.99), q(lone, 0.5), q(lone, 0.99), loadAvg())
}

// loadAvg is the machine's 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// BenchmarkSQLiteGet measures Get, the read the executor makes at every sync
// of a task, from 1 and 8 goroutines over a store of 1,000 records. One op is
// one Get of a random one of them.
//
//	go test ./pkg/store -run '^$' -bench BenchmarkSQLiteGet -count 6
func BenchmarkSQLiteGet(b *testing.B) {
	ctx := context.Background()
	s, err := store.OpenSQLite(ctx, filepath.Join(b.TempDir(), "tasks.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const records = 1000
	for i := range records {
		if _, _, err := s.Create(ctx, storetest.Sample(fmt.Sprintf("task-%08d", i))); err != nil {
			b.Fatal(err)
		}
	}
	for _, readers := range []int{1, 8} {
		b.Run(fmt.Sprintf("readers=%d", readers), func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(readers)
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := fmt.Sprintf("task-%08d", n.Add(7919)%records)
					if _, err := s.Get(ctx, id); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkSQLiteProgressUpdates measures the executor's kind of Update (a
// task's phase and reason change; its namespace, name, executor and
// terminal flag stay) in a store of 20,000 records, from 8 writers, each
// task updated in turn: every column SET (the baseline, as before the
// progress statement) against the progress statement, in the same run,
// with the ratio.
//
//	go test ./pkg/store -run '^$' -bench BenchmarkSQLiteProgressUpdates -benchtime 20000x -count 5
func BenchmarkSQLiteProgressUpdates(b *testing.B) {
	var baseline float64
	for _, v := range []struct {
		name string
		open func(context.Context, string) (store.Store, error)
	}{{"full", store.OpenSQLiteFullUpdates}, {"progress", store.OpenSQLite}} {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			s, err := v.open(ctx, filepath.Join(b.TempDir(), "tasks.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			const tasks, writers = 20_000, 8
			gen := func(i int) store.Record {
				r := storetest.Sample(fmt.Sprintf("task-%06d", i))
				r.Namespace, r.Phase, r.Terminal = "bench", "Pending", false
				r.CreatedAt = time.Unix(int64(i), 0)
				r.UpdatedAt, r.Version = r.CreatedAt, 1
				return r
			}
			if err := store.SQLiteBulkLoad(ctx, s, tasks, gen); err != nil {
				b.Fatal(err)
			}
			versions := make([]atomic.Int64, tasks) // each task's stored version
			for i := range versions {
				versions[i].Store(1)
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			b.ResetTimer()
			for range writers {
				wg.Go(func() {
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						// A task comes round again 20,000 updates later,
						// long after its last update returned.
						k := int(i % tasks)
						rec := gen(k)
						rec.Version = versions[k].Load()
						rec.Phase = []string{"Running", "Pending"}[i/tasks%2]
						out, err := s.Update(ctx, rec)
						if err != nil {
							errs <- err
							return
						}
						versions[k].Store(out.Version)
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
			b.ReportMetric(rate, "updates/s")
			if v.name == "full" {
				baseline = rate
			} else if baseline > 0 {
				b.ReportMetric(rate/baseline, "x-full")
			}
		})
	}
}
