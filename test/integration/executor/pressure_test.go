package executor

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// TestQuotaExceededCreationsBackOff: a ResourceQuota allows two pods; the
// other creations are refused, the refusal is visible in the task's state,
// and every task still runs once a pod slot frees.
func TestQuotaExceededCreationsBackOff(t *testing.T) {
	env := clustertest.New(t)
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "two-pods"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("2")}},
	}
	if _, err := env.Client.CoreV1().ResourceQuotas(env.Namespace).Create(context.Background(), quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, time.Minute, "quota status computed", func(ctx context.Context) error {
		q, err := env.Client.CoreV1().ResourceQuotas(env.Namespace).Get(ctx, quota.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, ok := q.Status.Hard[corev1.ResourcePods]; !ok {
			return fmt.Errorf("no status yet")
		}
		return nil
	})
	var mu sync.Mutex
	refused := map[string]string{}
	evs := exectest.NewEvents()
	st := store.NewMemory()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{Store: st, OnEvent: func(ev executor.Event) {
		if ev.Reason == "CreateFailed" {
			mu.Lock()
			refused[ev.ID] = ev.Message
			mu.Unlock()
		}
		evs.Add(ev)
	}})
	var ids []string
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("q%d", i)
		ids = append(ids, id)
		exectest.Submit(t, ex, id, exectest.LocalTask(id, "sleep 2", ""))
	}
	evs.WaitTerminal(t, 3*time.Minute, ids...)
	for _, id := range ids {
		if ev := evs.Terminal(id); len(ev) != 1 || ev[0].Phase != "Succeeded" {
			t.Errorf("%s: %+v, want one Succeeded", id, ev)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) == 0 {
		t.Fatal("no creation was refused by the quota: the test did not test anything")
	}
	for id, msg := range refused {
		if !strings.Contains(msg, "exceeded quota") {
			t.Errorf("%s: refusal %q does not show the quota", id, msg)
		}
	}
}

// TestAdoptFromGoneInstance: tasks of an executor instance that is gone are
// taken over by another instance configured to adopt them (shared store).
func TestAdoptFromGoneInstance(t *testing.T) {
	env := clustertest.New(t)
	st := store.NewMemory()
	old, stop := exectest.StartExecutor(t, env, executor.Config{Store: st, InstanceID: "old"})
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("a%d", i)
		exectest.Submit(t, old, id, exectest.LocalTask(id, "sleep 3; exit "+fmt.Sprint(i), ""))
	}
	clustertest.Eventually(t, time.Minute, "pods of the old instance exist", func(ctx context.Context) error {
		pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.ExecutorSelector("old").String()})
		if err != nil {
			return err
		}
		if len(pods.Items) != 3 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		return nil
	})
	stop()
	evs := exectest.NewEvents()
	exectest.StartExecutor(t, env, executor.Config{Store: st, InstanceID: "new", AdoptFrom: []string{"old"}, OnEvent: evs.Add})
	evs.WaitTerminal(t, 2*time.Minute, "a0", "a1", "a2")
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("a%d", i)
		rec := exectest.Record(t, st, id)
		if rec.Executor != "new" || rec.ExitCode == nil || int(*rec.ExitCode) != i || len(rec.Attempts) != 1 {
			t.Errorf("%s: executor %s exit %v attempts %d, want new, %d, 1", id, rec.Executor, rec.ExitCode, len(rec.Attempts), i)
		}
	}
	exectest.WaitNoTaskPods(t, env, time.Minute)
}

// TestParallelismCap: with Parallelism 1, tasks run one after another; a
// task cancelled while it waits for its turn passes the turn on.
func TestParallelismCap(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	// When each main container ran, as the node reports it: the executor's
	// own Running events need not come (a busy machine's watch may show a
	// pod only once it finished), and are not the thing to prove.
	runs := exectest.WatchMainRuns(t, env, "main")
	st := store.NewMemory()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{Store: st, Parallelism: 1, CreateConcurrency: 1, OnEvent: evs.Add})
	ids := []string{"p0", "p1", "p2"}
	for _, id := range ids {
		exectest.Submit(t, ex, id, exectest.LocalTask(id, "sleep 2", ""))
	}
	// Which task runs first is up to the workers; cancel one that waits.
	var waiter string
	clustertest.Eventually(t, time.Minute, "a task waits for a slot", func(ctx context.Context) error {
		for _, id := range ids {
			if r, err := ex.Get(ctx, id); err == nil && r.Reason == "WaitingForSlot" {
				waiter = id
				return nil
			}
		}
		return fmt.Errorf("none waits")
	})
	if err := ex.Cancel(context.Background(), waiter); err != nil {
		t.Fatal(err)
	}
	evs.WaitTerminal(t, 2*time.Minute, ids...)
	for _, id := range ids {
		ev := evs.Terminal(id)[0]
		switch {
		case id == waiter && ev.Reason != "Cancelled":
			t.Errorf("%s (cancelled while waiting): %+v, want Cancelled", id, ev)
		case id != waiter && ev.Phase != "Succeeded":
			t.Errorf("%s: %+v, want Succeeded", id, ev)
		}
	}
	ran := runs.Runs()
	started := 0
	for _, r := range ran {
		if !r.Start.IsZero() {
			started++
		}
	}
	if started != len(ids)-1 {
		t.Errorf("%d main containers seen running, want %d (all but the cancelled one): %+v", started, len(ids)-1, ran)
	}
	if most := exectest.MostAtOnce(ran); most != 1 {
		t.Errorf("%d tasks ran at once, want 1: %+v", most, ran)
	}
}
