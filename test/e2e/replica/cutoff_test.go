package replica

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// TestReplicaCutOffFromPostgres: two replicas lose their PostgreSQL server
// for 30 s while tasks finish. They report not ready, act on no pod (a task
// whose outcome cannot be recorded keeps its pod), and once the server is
// back they become ready and record every outcome once.
func TestReplicaCutOffFromPostgres(t *testing.T) {
	const tasks = 40
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	_, url, err := srv.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env := clustertest.New(t)
	pods := watchPods(t, env)
	g := newGroup(t, env, url, 4, 6*time.Second)
	procs := []*replicaProc{g.start("r0"), g.start("r1")}
	g.waitBalanced(time.Minute, "r0", "r1")

	for i := range tasks {
		id := fmt.Sprintf("cut-%02d", i)
		// The main containers end during the outage.
		doc := simTaskDoc(t, "cut", time.Duration(8000+rand.IntN(6000))*time.Millisecond)
		if _, _, err := procs[i%2].client.Submit(ctx, env.Namespace, doc, client.SubmitOptions{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	clustertest.Eventually(t, time.Minute, "every task has its pod", func(context.Context) error {
		pods.mu.Lock()
		defer pods.mu.Unlock()
		if n := len(pods.first); n < tasks {
			return fmt.Errorf("%d pods", n)
		}
		return nil
	})
	taskPods := func(ctx context.Context) (int, error) {
		l, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if err != nil {
			return 0, err
		}
		return len(l.Items), nil
	}

	if err := srv.Crash(); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	clustertest.Eventually(t, 20*time.Second, "both replicas not ready", func(context.Context) error {
		for _, p := range procs {
			if p.ready() == nil {
				return fmt.Errorf("%s still ready", p.id)
			}
		}
		return nil
	})
	t.Logf("both replicas not ready %s after the server stopped", time.Since(down).Round(time.Millisecond))
	// For the rest of 30 s: no pod is stopped or deleted (no outcome can be
	// recorded, so none is acted on), reads fail with an error, not a guess.
	for time.Since(down) < 30*time.Second {
		n, err := taskPods(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n != tasks {
			t.Fatalf("%d task pods during the outage, want all %d kept", n, tasks)
		}
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		_, err = procs[0].client.Get(rctx, "cut-00")
		rcancel()
		if err == nil || client.IsNotFound(err) {
			t.Fatalf("a read during the outage answered %v, want an error", err)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(time.Second):
		}
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	clustertest.Eventually(t, time.Minute, "both replicas ready again", func(context.Context) error {
		for _, p := range procs {
			if err := p.ready(); err != nil {
				return fmt.Errorf("%s: %w", p.id, err)
			}
		}
		return nil
	})
	t.Logf("both replicas ready %s after the server was back", time.Since(up).Round(time.Millisecond))
	clustertest.Eventually(t, 3*time.Minute, "every task finished", func(ctx context.Context) error {
		for tk, err := range procs[1].client.ListAll(ctx, client.ListOptions{Namespace: env.Namespace}) {
			if err != nil {
				return err
			}
			if !tk.Terminal {
				return fmt.Errorf("%s not finished", tk.ID)
			}
		}
		return nil
	})
	for i := range tasks {
		tk, err := procs[0].client.Get(ctx, fmt.Sprintf("cut-%02d", i))
		if err != nil {
			t.Fatal(err)
		}
		if tk.Phase != "Succeeded" || len(tk.Attempts) != 1 {
			t.Errorf("%s: %s/%s, %d attempts: want Succeeded once", tk.ID, tk.Phase, tk.Reason, len(tk.Attempts))
		}
	}
	if d := pods.duplicates(); len(d) > 0 {
		t.Errorf("attempts with more than one pod: %v", d)
	}
	exectest.WaitNoTaskPods(t, env, 2*time.Minute)
	t.Logf("outage of %s: every outcome recorded once after it", up.Sub(down).Round(time.Second))
}
