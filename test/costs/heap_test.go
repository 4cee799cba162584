package costs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// maxHeapPerPod bounds the executor's heap per tracked pod (its pod cache,
// queue and per-task state; not the store's records): the goal of
// docs/benchmarks.md ("Memory", at most 2 KB), which `make bench` measures
// at 1,590 B with 10,000 pods on kwok.
const maxHeapPerPod = 2000

// heapPods is how many pods TestHeapPerTrackedPod tracks: enough that the
// executor's fixed heap (its caches' and queue's own structures, the
// Lease's) is a few bytes per pod.
const heapPods = 2000

type noExec struct{}

func (noExec) Exec(context.Context, string, string, string, []string, io.Writer, io.Writer) error {
	return fmt.Errorf("no exec in this test")
}

// TestHeapPerTrackedPod runs the executor over a fake clientset (no API
// server: the pods are objects in this process, which a test of the heap
// needs), submits heapPods realistic tasks (podtest.RealisticTask: a main
// container and an envoy-like sidecar), makes each pod look as the API
// server returns it once both containers run (podtest.RunningPod), and
// measures the heap after GC with the executor tracking them, then after it
// stopped, keeping the store and the fake's pods: the difference per pod is
// the executor's own.
func TestHeapPerTrackedPod(t *testing.T) {
	const ns = "data"
	// The simple clientset: NewClientset's field manager makes every write
	// several times slower, and the executor does not read managed fields.
	client := fake.NewSimpleClientset() //nolint:staticcheck // see above
	client.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		return true, unbounded(w), nil
	})

	st := store.NewMemory()
	var running, created atomic.Int64
	ex, err := executor.New(executor.Config{
		Client: client, Execer: noExec{}, InstanceID: "heap", Namespaces: []string{ns}, DefaultNamespace: ns,
		Store: st, Parallelism: heapPods, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnEvent: func(ev executor.Event) {
			switch {
			case ev.Type == executor.EventPodCreated:
				created.Add(1)
			case ev.Type == executor.EventState && ev.Phase == string(podstate.Running):
				running.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ex.Start(ctx) }()
	clustertest.Eventually(t, time.Minute, "executor healthy", func(context.Context) error { return ex.Healthy() })

	start := time.Now()
	tk := podtest.RealisticTask("etl")
	for i := range heapPods {
		tk.Name = fmt.Sprintf("etl-%05d", i)
		if _, err := ex.Submit(ctx, fmt.Sprintf("r-%05d", i), tk); err != nil {
			t.Fatal(err)
		}
	}
	pods := client.CoreV1().Pods(ns)
	clustertest.Eventually(t, 2*time.Minute, "every pod created", func(ctx context.Context) error {
		if n := created.Load(); n < heapPods {
			return fmt.Errorf("%d of %d pods created", n, heapPods)
		}
		return nil
	})
	// The kubelet's part: every container of every pod runs.
	for j := range heapPods {
		if err := run(ctx, pods, st, tk, j); err != nil {
			t.Fatal(err)
		}
	}
	clustertest.Eventually(t, time.Minute, "the executor sees every pod run", func(context.Context) error {
		if n := running.Load(); n < heapPods {
			return fmt.Errorf("%d of %d running", n, heapPods)
		}
		return nil
	})
	tracking := heapAfterGC()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ex = nil
	// The executor's goroutines end after Start returns; its heap is free
	// once they did. Its compact pods alone are 0.7 KB each (cachedpod.go):
	// less freed than minFreedPerPod means the stopped executor is still
	// reachable, and nothing was measured.
	const minFreedPerPod = 500
	stopped := heapAfterGC()
	for deadline := time.Now().Add(20 * time.Second); stopped+heapPods*minFreedPerPod > tracking && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		stopped = heapAfterGC()
	}
	if stopped+heapPods*minFreedPerPod > tracking {
		t.Fatalf("heap %d B tracking %d pods, %d B 20 s after the executor stopped: less than %d B per pod freed, so the stopped executor's heap is still reachable and nothing was measured", tracking, heapPods, stopped, minFreedPerPod)
	}
	per := (tracking - stopped) / heapPods
	t.Logf("executor heap per tracked pod: %d B (%d pods; heap %d B tracking them, %d B stopped; bound %d B; %s in all)", per, heapPods, tracking, stopped, maxHeapPerPod, time.Since(start).Round(100*time.Millisecond))
	if per > maxHeapPerPod {
		t.Errorf("the executor holds %d B of heap per tracked pod, more than %d B (docs/costs.md)", per, maxHeapPerPod)
	}
	runtime.KeepAlive(client)
	runtime.KeepAlive(st)
}

// run makes pod j of tk as the API server returns it once every container
// runs (podtest.RunningPod), keeping what the executor stamped on it.
func run(ctx context.Context, pods interface {
	Get(context.Context, string, metav1.GetOptions) (*corev1.Pod, error)
	Update(context.Context, *corev1.Pod, metav1.UpdateOptions) (*corev1.Pod, error)
}, st store.Store, tk *task.Task, j int) error {
	id := fmt.Sprintf("r-%05d", j)
	rec, err := st.Get(ctx, id)
	if err != nil {
		return err
	}
	t := tk.DeepCopy()
	t.Name = rec.Name
	ident := task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Executor: rec.Executor, Nonce: rec.Nonce}
	live, err := pods.Get(ctx, task.PodName(ident, 0), metav1.GetOptions{})
	if err != nil {
		return err
	}
	rp, err := podtest.RunningPod(t, ident, 0, j)
	if err != nil {
		return err
	}
	rp.Name, rp.Namespace, rp.UID, rp.ResourceVersion = live.Name, live.Namespace, live.UID, live.ResourceVersion
	rp.Labels, rp.Annotations, rp.Finalizers = live.Labels, live.Annotations, live.Finalizers
	rp.Spec.SchedulingGates = nil
	_, err = pods.Update(ctx, rp, metav1.UpdateOptions{})
	return err
}

// unbounded relays w's events through a queue of any length: the fake's
// watch panics when 100 events wait, and the executor's creators outrun
// its pod cache for a moment when thousands of pods are created in memory.
func unbounded(w watch.Interface) watch.Interface {
	out := make(chan watch.Event)
	stop := make(chan struct{})
	go func() {
		defer close(out)
		defer w.Stop()
		var queue []watch.Event
		in := w.ResultChan()
		for in != nil || len(queue) > 0 {
			var send chan watch.Event
			var next watch.Event
			if len(queue) > 0 {
				send, next = out, queue[0]
			}
			select {
			case ev, ok := <-in:
				if !ok {
					in = nil
					continue
				}
				queue = append(queue, ev)
			case send <- next:
				queue = queue[1:]
			case <-stop:
				return
			}
		}
	}()
	return &relay{out: out, stop: sync.OnceFunc(func() { close(stop) })}
}

type relay struct {
	out  chan watch.Event
	stop func()
}

func (r *relay) Stop()                          { r.stop() }
func (r *relay) ResultChan() <-chan watch.Event { return r.out }

// heapAfterGC is the live heap after two collections.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
