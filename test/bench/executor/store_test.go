package executor

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

// storeRun measures the SQLite store's outcome writes (Update of a task's
// record, as the executor records an attempt's outcome; WAL,
// synchronous=FULL, group commit) from writers goroutines for d: every
// caller returns only once its write is durable. It returns the rate in a
// row's tasks field per second (writes in elapsed).
func storeRun(tb testing.TB, writers int, d time.Duration) row {
	tb.Helper()
	ctx := context.Background()
	s, err := store.OpenSQLite(ctx, filepath.Join(tb.TempDir(), "tasks.db"))
	if err != nil {
		tb.Fatal(err)
	}
	defer s.Close()
	own := make([]store.Record, writers)
	for w := range own {
		if own[w], _, err = s.Create(ctx, storetest.Sample(fmt.Sprintf("writer-%03d", w))); err != nil {
			tb.Fatal(err)
		}
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	start := time.Now()
	end := start.Add(d)
	for w := range writers {
		wg.Go(func() {
			rec := own[w]
			for time.Now().Before(end) {
				rec.Message = fmt.Sprintf("write %d", n.Load())
				var err error
				if rec, err = s.Update(ctx, rec); err != nil {
					errs <- err
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	return row{name: fmt.Sprintf("SQLite outcome writes, %d writers", writers), tasks: int(n.Load()), elapsed: elapsed, store: true,
		note: "tasks/s column: durable writes/s (Update, WAL, synchronous=FULL, group commit)"}
}
