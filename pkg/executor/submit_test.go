package executor

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kubetask/kubetask/pkg/task"
)

// TestSubmitCreatedOnceAmongConcurrentCalls: of concurrent submissions of one
// ID exactly one is told it created the task, and only it announces the task
// (one Submitted event); the others get the record it stored.
func TestSubmitCreatedOnceAmongConcurrentCalls(t *testing.T) {
	var submitted atomic.Int32
	f := newFx(t, func(c *Config) {
		c.OnEvent = func(ev Event) {
			if ev.Type == EventSubmitted {
				submitted.Add(1)
			}
		}
	})
	const ids, callers = 20, 8
	for i := range ids {
		id := fmt.Sprintf("task-%d", i)
		var (
			wg      sync.WaitGroup
			created atomic.Int32
			start   = make(chan struct{})
		)
		for range callers {
			wg.Go(func() {
				<-start
				rec, ok, err := f.ex.SubmitCreated(f.ctx, id, newTask(func(t *task.Task) { t.Namespace = "ns" }))
				if err != nil || rec.ID != id || rec.Version != 1 {
					t.Errorf("SubmitCreated(%s): %+v, %v", id, rec, err)
				}
				if ok {
					created.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if n := created.Load(); n != 1 {
			t.Errorf("%s: %d of %d concurrent calls were told they created it, want 1", id, n, callers)
		}
	}
	if n := submitted.Load(); n != ids {
		t.Errorf("%d Submitted events for %d tasks", n, ids)
	}
}
