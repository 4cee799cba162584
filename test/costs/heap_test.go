package costs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
// queue and per-task state; not the store's records): issue 34's goal in
// docs/benchmarks.md, at most 1 KB. Measured here: 940-950 B at 2,000
// pods, idle or loaded (docs/costs.md).
const maxHeapPerPod = 1024

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
//
// The fake's tracker serves the lists; newPodWatches the pod watches.
func TestHeapPerTrackedPod(t *testing.T) {
	const ns = "data"
	profiles := os.Getenv("KUBETASK_HEAP_PROFILES")
	if profiles != "" {
		goruntime.MemProfileRate = 64 // every few allocations: 2,000 pods' worth of a few bytes each shows
	}
	// The simple clientset: NewClientset's field manager makes every write
	// several times slower, and the executor does not read managed fields.
	client := fake.NewSimpleClientset() //nolint:staticcheck // see above
	pods := newPodWatches(client)

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
	podsOf := client.CoreV1().Pods(ns)
	clustertest.Eventually(t, 2*time.Minute, "every pod created", func(ctx context.Context) error {
		if n := created.Load(); n < heapPods {
			return fmt.Errorf("%d of %d pods created", n, heapPods)
		}
		return nil
	})
	// The kubelet's part: every container of every pod runs.
	for j := range heapPods {
		if err := run(ctx, podsOf, st, tk, j); err != nil {
			t.Fatal(err)
		}
	}
	clustertest.Eventually(t, time.Minute, "the executor sees every pod run", func(context.Context) error {
		if n := running.Load(); n < heapPods {
			return fmt.Errorf("%d of %d running", n, heapPods)
		}
		return nil
	})
	pods.mu.Lock()
	overflow := pods.overflow
	pods.mu.Unlock()
	if overflow {
		t.Fatal("a pod watch of the fake clientset ran out of room")
	}
	tracking := settledHeap(pods.busy(client))
	writeHeapProfile(t, profiles, "tracking.pprof")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ex = nil
	// The executor's goroutines end after Start returns; its heap is free
	// once they did. Its compact pods alone are 0.66 KB each (cachedpod.go):
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
	writeHeapProfile(t, profiles, "stopped.pprof")
	per := (tracking - stopped) / heapPods
	t.Logf("executor heap per tracked pod: %d B (%d pods; heap %d B tracking them, %d B stopped; bound %d B; %s in all)", per, heapPods, tracking, stopped, maxHeapPerPod, time.Since(start).Round(100*time.Millisecond))
	if per > maxHeapPerPod {
		t.Errorf("the executor holds %d B of heap per tracked pod, more than %d B (docs/costs.md)", per, maxHeapPerPod)
	}
	goruntime.KeepAlive(client)
	goruntime.KeepAlive(st)
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

// podWatches serves the pod watches of a fake clientset itself, from
// the pod writes it sees pass: the fake's own watch panics when 100 events
// wait, which the executor's creators cause for a moment when thousands of
// pods are created in memory. Each write and the delivery of its event
// happen under one lock, so events come in the order of the writes.
type podWatches struct {
	mu       sync.Mutex
	watches  []*podWatch
	overflow bool
}

func newPodWatches(client *fake.Clientset) *podWatches {
	pw := &podWatches{}
	write := k8stesting.ObjectReaction(client.Tracker())
	client.PrependReactor("*", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		var typ watch.EventType
		switch action.GetVerb() {
		case "create":
			typ = watch.Added
		case "update", "patch":
			typ = watch.Modified
		default: // reads; deletes do not happen in this test
			return false, nil, nil
		}
		pw.mu.Lock()
		defer pw.mu.Unlock()
		handled, obj, err := write(action)
		if err == nil && obj != nil {
			for _, w := range pw.watches {
				pw.overflow = !w.send(watch.Event{Type: typ, Object: obj.DeepCopyObject()}) || pw.overflow
			}
		}
		return handled, obj, err
	})
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		w := &podWatch{ch: make(chan watch.Event, 1<<15)}
		pw.mu.Lock()
		pw.watches = append(pw.watches, w)
		pw.mu.Unlock()
		return true, w, nil
	})
	return pw
}

// podWatch is one watch of podWatches, with room for 32,768 events.
type podWatch struct {
	mu      sync.Mutex
	ch      chan watch.Event
	stopped bool
}

// send delivers ev unless the watch stopped; false when it has no room.
func (w *podWatch) send(ev watch.Event) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return true
	}
	select {
	case w.ch <- ev:
		return true
	default:
		return false
	}
}

func (w *podWatch) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.stopped = true
		close(w.ch)
	}
}

func (w *podWatch) ResultChan() <-chan watch.Event { return w.ch }

// settledHeap is the live heap once the executor is done with what it was
// doing: a sync pass or a fresh read still in flight holds whole pods (25 KB
// each on the heap), and on a loaded machine the last passes of a burst end
// seconds after the events the test waits for. A loaded process also moves
// slowly, so two close readings alone do not say it is done (CI once read
// 1,027 B per pod that way, against 980 B idle). It reads the heap every
// 100 ms and returns the lowest reading once, for a whole second, busy
// reported the same count of API calls with no watch event waiting, and the
// readings stayed within 8 B per pod (at most 30 s).
func settledHeap(busy func() (calls int, waiting int)) uint64 {
	const window = 10 // readings, 100 ms apart
	var heaps []uint64
	lastCalls, quiet := -1, 0
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		calls, waiting := busy()
		h := heapAfterGC()
		if calls != lastCalls || waiting > 0 {
			lastCalls, quiet, heaps = calls, 0, heaps[:0]
			continue
		}
		quiet++
		heaps = append(heaps, h)
		if quiet < window {
			continue
		}
		low, high := slices.Min(heaps[len(heaps)-window:]), slices.Max(heaps[len(heaps)-window:])
		if high-low < 8*heapPods {
			return low
		}
	}
	if len(heaps) == 0 {
		return heapAfterGC()
	}
	return slices.Min(heaps)
}

// busy is how many API calls the fake clientset saw and how many pod watch
// events wait to be read: settledHeap's signs that the executor still works.
func (pw *podWatches) busy(client *fake.Clientset) func() (int, int) {
	return func() (int, int) {
		pw.mu.Lock()
		defer pw.mu.Unlock()
		waiting := 0
		for _, w := range pw.watches {
			w.mu.Lock()
			if !w.stopped {
				waiting += len(w.ch)
			}
			w.mu.Unlock()
		}
		calls := 0
		for _, a := range client.Actions() {
			if a.GetResource().Resource != "leases" { // the Lease's renewals go on
				calls++
			}
		}
		return calls, waiting
	}
}

// heapAfterGC is the live heap after two collections.
func heapAfterGC() uint64 {
	goruntime.GC()
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return m.HeapAlloc
}

// writeHeapProfile writes the heap profile to name in dir, when dir is set
// (KUBETASK_HEAP_PROFILES): what a tracked pod costs, by the code that
// allocated it, is
//
//	go tool pprof -sample_index=inuse_space -top -diff_base dir/stopped.pprof dir/tracking.pprof
func writeHeapProfile(t *testing.T, dir, name string) {
	t.Helper()
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		t.Fatal(err)
	}
}
