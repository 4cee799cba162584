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

// TestWaitingForSlotOnAnyReplica: tasks waiting for their shard's part of
// their namespace's limit say so, naming the limit, alike in lists (the
// reason filter included), GET and watches on every replica: the one that
// runs them and another. Two are submitted to the replica that runs their
// shard (the submission records the wait), two to the other (the owner's
// first pass records it). Before, only GET on the owner said so; lists
// said Submitted.
func TestWaitingForSlotOnAnyReplica(t *testing.T) {
	const shards = 2
	env := clustertest.New(t)
	g := newGroup(t, env, pgtest.Database(t), shards, 6*time.Second)
	limit := []string{"--namespace-parallelism", env.Namespace + "=2"} // 1 per shard
	r0, r1 := g.start("r0", limit...), g.start("r1", limit...)
	_, holders := g.waitBalanced(time.Minute, "r0", "r1")

	var (
		mu      sync.Mutex
		waiting = map[string]string{} // task → message of its WaitingForSlot event on r0's watch
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wctx, stopWatch := context.WithCancel(ctx)
	watching := make(chan struct{})
	var once sync.Once
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r0.client.Watch(wctx, client.WatchOptions{Namespace: env.Namespace, Bookmarks: true}, func(ev api.Event) error {
			once.Do(func() { close(watching) })
			if ev.Reason == "WaitingForSlot" {
				mu.Lock()
				waiting[ev.TaskID] = ev.Message
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

	// Four tasks of r1's shard, one at a time so that the first takes the
	// shard's one slot; each runs a minute.
	var ids []string
	for i := 0; len(ids) < 4; i++ {
		id := fmt.Sprintf("s-%03d", i)
		if holders[replica.ShardOf(id, shards)] != "r1" {
			continue
		}
		to := r1
		if len(ids)%2 == 1 {
			to = r0
		}
		if _, _, err := to.client.Submit(ctx, env.Namespace, simTaskDoc(t, "s", time.Minute), client.SubmitOptions{ID: id}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		if len(ids) == 1 {
			clustertest.Eventually(t, time.Minute, "the first task takes the slot", func(ctx context.Context) error {
				tk, err := r0.client.Get(ctx, id)
				if err == nil && (tk.Reason == "Submitted" || tk.Reason == "WaitingForSlot") {
					err = fmt.Errorf("%s/%s", tk.Phase, tk.Reason)
				}
				return err
			})
		}
	}
	want := fmt.Sprintf("namespace %s at its limit of 1 in this task's shard (the namespace's limit divided among %d shards)", env.Namespace, shards)
	waiters := ids[1:]
	clustertest.Eventually(t, time.Minute, "every replica lists the three waiting tasks", func(ctx context.Context) error {
		for _, r := range []*replicaProc{r0, r1} {
			l, err := r.client.List(ctx, client.ListOptions{Namespace: env.Namespace, Reason: "WaitingForSlot"})
			if err != nil {
				return err
			}
			got := map[string]string{}
			for _, tk := range l.Items {
				got[tk.ID] = tk.Phase + " " + tk.Message
			}
			for _, id := range waiters {
				if got[id] != "Pending "+want {
					return fmt.Errorf("%s lists %s as %q (%d waiting), want Pending %q", r.id, id, got[id], len(l.Items), want)
				}
			}
		}
		return nil
	})
	for _, r := range []*replicaProc{r0, r1} {
		l, err := r.client.List(ctx, client.ListOptions{Namespace: env.Namespace})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range l.Items {
			if tk.ID != ids[0] && (tk.Reason != "WaitingForSlot" || tk.Message != want) {
				t.Errorf("%s lists %s as %s/%s %q, want WaitingForSlot %q", r.id, tk.ID, tk.Phase, tk.Reason, tk.Message, want)
			}
		}
		for _, id := range waiters {
			tk, err := r.client.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if tk.Reason != "WaitingForSlot" || tk.Message != want {
				t.Errorf("GET %s on %s: %s/%s %q, want WaitingForSlot %q", id, r.id, tk.Phase, tk.Reason, tk.Message, want)
			}
		}
	}
	clustertest.Eventually(t, 30*time.Second, "r0's watch reports the waits of r1's tasks", func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range waiters {
			if msg, ok := waiting[id]; !ok || msg != want {
				return errors.New(fmt.Sprint("watch: ", id, " ", msg))
			}
		}
		return nil
	})

	for _, id := range ids {
		if _, err := r0.client.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		clustertest.Eventually(t, time.Minute, "task "+id+" ends", func(ctx context.Context) error {
			tk, err := r0.client.Get(ctx, id)
			if err == nil && !tk.Terminal {
				err = fmt.Errorf("%s/%s", tk.Phase, tk.Reason)
			}
			return err
		})
	}
}
