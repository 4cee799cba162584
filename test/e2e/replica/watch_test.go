package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
)

// TestWatchOnAnyReplica: a watch on one replica reports the outcome of
// tasks that another replica runs (the replicas share their events).
func TestWatchOnAnyReplica(t *testing.T) {
	const shards = 4
	env := clustertest.New(t)
	g := newGroup(t, env, pgtest.Database(t), shards, 6*time.Second)
	r0, _ := g.start("r0"), g.start("r1")
	_, holders := g.waitBalanced(time.Minute, "r0", "r1")

	var (
		mu       sync.Mutex
		terminal = map[string]bool{}
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wctx, stopWatch := context.WithCancel(ctx)
	watching := make(chan struct{})
	var once sync.Once
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r0.client.Watch(wctx, client.WatchOptions{Namespace: env.Namespace, Bookmarks: true}, func(ev api.Event) error {
			once.Do(func() { close(watching) })
			if ev.Terminal {
				mu.Lock()
				terminal[ev.TaskID] = true
				mu.Unlock()
			}
			return nil
		})
	}()
	defer func() { stopWatch(); <-done }()
	select {
	case <-watching:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not start (no bookmark)")
	}

	// Tasks of r1's shards, submitted to r0 and watched on r0.
	var ids []string
	for i := 0; len(ids) < 6; i++ {
		id := fmt.Sprintf("w-%03d", i)
		if holders[replica.ShardOf(id, shards)] != "r1" {
			continue
		}
		ids = append(ids, id)
		if _, _, err := r0.client.Submit(ctx, env.Namespace, simTaskDoc(t, "w", 500*time.Millisecond), client.SubmitOptions{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	clustertest.Eventually(t, time.Minute, "r0's watch reports the outcomes of r1's tasks", func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		var missing []string
		for _, id := range ids {
			if !terminal[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return errors.New(fmt.Sprint("no outcome for ", missing))
		}
		return nil
	})
}
