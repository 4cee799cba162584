package replica

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/test/exectest"
)

// TestSplitBrainCreatesNoDuplicate forces two processes to run the same
// shard at once: two executors with the same instance ID, each holding "its"
// Lease (in two namespaces), each with its own connection pool to the same
// PostgreSQL database, both acting on the same 100 tasks. Deterministic pod
// names and the store's compare-and-swap keep it harmless: one pod per
// attempt, one outcome per task, one Terminal event across both.
func TestSplitBrainCreatesNoDuplicate(t *testing.T) {
	const tasks = 100
	env := clustertest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	other := env.Namespace + "-lease"
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Namespaces().Delete(context.Background(), other, metav1.DeleteOptions{})
	})
	url := pgtest.Database(t)
	pods := watchPods(t, env)

	var (
		mu        sync.Mutex
		terminal  = map[string]int{}
		actedBy   = map[string]map[string]bool{} // executor -> tasks it emitted a pod event for
		executors []*executor.Executor
	)
	for _, name := range []string{"a", "b"} {
		st, err := store.OpenPostgres(ctx, url, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		leaseNS := env.Namespace
		if name == "b" {
			leaseNS = other
		}
		actedBy[name] = map[string]bool{}
		ex, err := executor.New(executor.Config{
			RESTConfig: env.Config, InstanceID: "split", Namespaces: []string{env.Namespace}, DefaultNamespace: env.Namespace,
			LeaseNamespace: leaseNS, LeaseHolder: "holder-" + name, Store: st, QPS: 200, Burst: 400,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("process", name),
			OnEvent: func(ev executor.Event) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case ev.Type == executor.EventAttemptFinished && ev.Terminal:
					terminal[ev.ID]++
				case ev.Type == executor.EventPodCreated, ev.Type == executor.EventPodAdopted, ev.Type == executor.EventPodDeleting, ev.Type == executor.EventPodStopping:
					actedBy[name][ev.ID] = true
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		executors = append(executors, ex)
	}
	for i := range tasks {
		tk := exectest.SimTask("split", map[string]string{kwokstages.ExitContainer: "main", kwokstages.ExitAfter: fmt.Sprintf("%dms", 500+rand.IntN(1500))})
		tk.Namespace = env.Namespace
		if _, err := executors[0].Submit(ctx, fmt.Sprintf("split-%03d", i), tk); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(context.Background())
	for _, ex := range executors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ex.Start(runCtx); err != nil {
				t.Errorf("Start: %v", err)
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()

	st := executorsStore(t, url)
	clustertest.Eventually(t, 3*time.Minute, "every task finished", func(ctx context.Context) error {
		recs, err := st.List(ctx, store.ListOptions{NonTerminal: true})
		if err != nil {
			return err
		}
		if len(recs) > 0 {
			return fmt.Errorf("%d tasks not finished", len(recs))
		}
		return nil
	})
	exectest.WaitNoTaskPods(t, env, 2*time.Minute)
	recs, err := st.List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != tasks {
		t.Fatalf("%d records, want %d", len(recs), tasks)
	}
	for _, r := range recs {
		if r.Phase != "Succeeded" || len(r.Attempts) != 1 || r.Attempt != 0 {
			t.Errorf("%s: %s/%s, attempt %d, %d outcomes: want Succeeded once; outcomes: %+v", r.ID, r.Phase, r.Reason, r.Attempt, len(r.Attempts), r.Attempts)
		}
	}
	if d := pods.duplicates(); len(d) > 0 {
		t.Errorf("attempts with more than one pod: %v", d)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range recs {
		if terminal[r.ID] != 1 {
			t.Errorf("%s: %d Terminal events across the two processes, want 1", r.ID, terminal[r.ID])
		}
	}
	both := 0
	for id := range actedBy["a"] {
		if actedBy["b"][id] {
			both++
		}
	}
	t.Logf("split brain: a acted on %d tasks, b on %d, both on %d; one pod ran per attempt (%d more created and discarded unrun by the fence), one outcome per task",
		len(actedBy["a"]), len(actedBy["b"]), both, pods.unrun())
	if len(actedBy["b"]) == 0 || len(actedBy["a"]) == 0 {
		t.Errorf("one process never acted: the split brain was not forced (a %d, b %d)", len(actedBy["a"]), len(actedBy["b"]))
	}
}

func executorsStore(t *testing.T, url string) store.Store {
	st, err := store.OpenPostgres(context.Background(), url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}
