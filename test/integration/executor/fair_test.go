package executor

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/test/exectest"
)

// podsAtOnce follows a namespace's pods with an informer and keeps the most
// that existed at once, in the API server's order of events.
type podsAtOnce struct {
	mu        sync.Mutex
	now, most int
}

func watchPodsAtOnce(t *testing.T, env *clustertest.Env, ns string) *podsAtOnce {
	t.Helper()
	p := &podsAtOnce{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) {
			p.mu.Lock()
			p.now++
			p.most = max(p.most, p.now)
			p.mu.Unlock()
		},
		DeleteFunc: func(any) {
			p.mu.Lock()
			p.now--
			p.mu.Unlock()
		},
	}); err != nil {
		t.Fatal(err)
	}
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	return p
}

func (p *podsAtOnce) max() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.most
}

// TestNamespaceLimitOnKwokNodes: with a limit of 2 for namespace A and 10
// slots in all, A never has more than 2 pods at once, its waiting tasks say
// that they wait for A's limit, and B's tasks, submitted behind A's, take
// the free slots at once instead of waiting behind A's backlog.
func TestNamespaceLimitOnKwokNodes(t *testing.T) {
	envA, envB := clustertest.New(t), clustertest.New(t)
	atOnce := watchPodsAtOnce(t, envA, envA.Namespace)
	evs := exectest.NewEvents()
	ex, _ := exectest.StartExecutor(t, envA, executor.Config{
		Namespaces: []string{envA.Namespace, envB.Namespace}, Store: store.NewMemory(), OnEvent: evs.Add,
		Parallelism: 10, NamespaceParallelism: map[string]int{envA.Namespace: 2},
	})
	run := map[string]string{kwokstages.CompleteAfter: "2s", kwokstages.CompleteCode: "0"}
	var aIDs, bIDs []string
	for i := range 6 {
		id := fmt.Sprintf("a%d", i)
		tk := exectest.SimTask(id, run)
		tk.Spec.Template.Spec.Containers = tk.Spec.Template.Spec.Containers[:1]
		tk.Namespace = envA.Namespace
		exectest.Submit(t, ex, id, tk)
		aIDs = append(aIDs, id)
	}
	want := fmt.Sprintf("namespace %s at its limit of 2", envA.Namespace)
	clustertest.Eventually(t, time.Minute, "an A task waits for A's limit", func(ctx context.Context) error {
		for _, id := range aIDs {
			if r, err := ex.Get(ctx, id); err == nil && r.Reason == "WaitingForSlot" {
				if r.Message != want {
					return fmt.Errorf("%s waits: %q, want %q", id, r.Message, want)
				}
				return nil
			}
		}
		return fmt.Errorf("no A task waits")
	})
	for i := range 3 {
		id := fmt.Sprintf("b%d", i)
		tk := exectest.SimTask(id, run)
		tk.Spec.Template.Spec.Containers = tk.Spec.Template.Spec.Containers[:1]
		tk.Namespace = envB.Namespace
		exectest.Submit(t, ex, id, tk)
		bIDs = append(bIDs, id)
	}
	evs.WaitTerminal(t, 3*time.Minute, append(aIDs, bIDs...)...)
	for _, id := range append(aIDs, bIDs...) {
		if ev := evs.Terminal(id); len(ev) != 1 || ev[0].Phase != "Succeeded" {
			t.Errorf("%s: %+v, want one Succeeded outcome", id, ev)
		}
	}
	if most := atOnce.max(); most != 2 {
		t.Errorf("A had %d pods at once, want its limit, 2", most)
	}
	// A's last pod waited for two of A's 2-second rounds; B's waited for
	// nothing but their creation.
	created := func(id string) time.Time { return evs.First(id, executor.EventPodCreated) }
	var aLast time.Time
	for _, id := range aIDs {
		if c := created(id); c.After(aLast) {
			aLast = c
		}
	}
	for _, id := range bIDs {
		if c := created(id); c.IsZero() || !c.Before(aLast) {
			t.Errorf("%s's pod created at %s, not before A's last at %s: B waited behind A's backlog", id, c.Format(time.StampMilli), aLast.Format(time.StampMilli))
		}
	}
}
