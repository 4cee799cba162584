package executor

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/internal/localcluster"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// realisticTask is podtest.RealisticTask on a kwok node, which runs it
// until it is deleted. The API server adds the projected service-account
// token volume, its default tolerations and managedFields for the
// executor's create and kwok's status.
func realisticTask(name string) *task.Task {
	t := podtest.RealisticTask(name)
	t.Spec.Template.Spec.NodeSelector = localcluster.SimNodeSelector()
	t.Spec.Template.Spec.Tolerations = []corev1.Toleration{localcluster.SimNodeToleration()}
	return t
}

// memoryRun measures what a tracked pod costs: n realistic running task
// pods in the executor (heap after GC with the pods tracked, minus the heap
// of the executor started with no task and minus its store's records), the
// same pods in a plain client-go informer in the same process, and the
// growth of kube-controller-manager's resident memory, whose informers cache
// every pod of the cluster.
func memoryRun(tb testing.TB, n int) []row {
	tb.Helper()
	ensureSimNodes(tb, simNodesFor(n))
	env := clustertest.New(tb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := newOutcomes()
	st := store.NewMemory()
	kcm0 := rssOf("kube-controller-manager")

	g0 := runtime.NumGoroutine()
	h0 := heapAfterGC()
	ex, stop := exectest.StartExecutor(tb, env, executor.Config{InstanceID: "bench", Store: st, OnEvent: out.add, Parallelism: n, QPS: executor.Unlimited})
	defer stop()
	hStarted := heapAfterGC()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("m%05d", i)
		if _, err := ex.Submit(ctx, id, realisticTask(id)); err != nil {
			tb.Fatalf("submitting %s: %v", id, err)
		}
	}
	defer exectest.RemoveTaskPods(tb, env)
	waitFor(tb, 15*time.Minute, "memory: tasks running", func() (bool, string) {
		_, running := out.counts()
		return running == n, fmt.Sprintf("%d of %d running", running, n)
	})
	settle(ctx, tb, env, ex)
	h1 := heapAfterGC()
	kcm1 := rssOf("kube-controller-manager")

	plainCtx, plainCancel := context.WithCancel(ctx)
	plain := podInformer(env.Client, env.Namespace, task.ManagedSelector().String())
	go plain.RunWithContext(plainCtx)
	if !cache.WaitForCacheSync(ctx.Done(), plain.HasSynced) {
		tb.Fatal("plain informer did not sync")
	}
	if got := len(plain.GetStore().List()); got != n {
		tb.Fatalf("plain informer has %d pods, want %d", got, n)
	}
	sample := plain.GetStore().List()[0].(*corev1.Pod)
	h2 := heapAfterGC()
	plainCancel()
	plain = nil

	stop()
	// Start has returned, but the caches' and the plain informer's
	// goroutines end on their own: the executor is gone from the heap
	// only once they have.
	waitFor(tb, time.Minute, "memory: the executor's goroutines ended", func() (bool, string) {
		n := runtime.NumGoroutine()
		return n <= g0+2, fmt.Sprintf("%d goroutines, %d before the executor started", n, g0)
	})
	// Up to two goroutines may stay (the HTTP/2 connection of client-go's
	// shared transport), but an informer goroutine that has not ended yet
	// keeps the whole cache reachable: wait until collecting frees the
	// executor's heap, or give up and report it unmeasured below.
	var h3 uint64 // the store's records are still referenced by st
	freedEnough := func() bool { return int64(h1)-int64(h3) >= (int64(h1)-int64(hStarted))/10 }
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if h3 = heapAfterGC(); freedEnough() || time.Now().After(deadline) {
			break
		}
	}
	_, _ = st.Get(ctx, "m00000")

	per := func(a, b uint64) float64 { return float64(int64(a)-int64(b)) / float64(n) }
	fixed := per(hStarted, h0)
	cachePerPod := per(h1, h3) - fixed // the executor without its store
	note := fmt.Sprintf("pods with %d containers, %d env vars, %d volumes, %d managedFields entries", len(sample.Spec.Containers), len(sample.Spec.Containers[0].Env), len(sample.Spec.Volumes), len(sample.ManagedFields))
	execNote := "heap per tracked pod: pod cache, queue, task state (store records not counted); " + note
	if freed := int64(h1) - int64(h3); !freedEnough() {
		// The stopped executor's heap was still reachable (seen in some
		// runs; docs/benchmarks.md): the difference would be meaningless.
		cachePerPod = math.NaN()
		execNote = fmt.Sprintf("not measured: only %d B freed when the executor stopped; ", freed) + note
		// What still runs is the first suspect for what holds it.
		fmt.Fprintln(os.Stderr, "  memory: the executor's heap was not freed; goroutines still running:")
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
	}
	rows := []row{
		{name: "memory: kubetask executor", tasks: n, heap: cachePerPod, note: execNote},
		{name: "memory: kubetask executor + memory store", tasks: n, heap: per(h1, hStarted), note: "as above plus the in-memory store's record of each task"},
		{name: "memory: plain client-go informer", tasks: n, heap: per(h2, h1), note: "heap per pod, no transform, same process"},
	}
	if kcm0 > 0 && kcm1 > 0 {
		rows = append(rows, row{name: "memory: kube-controller-manager", tasks: n, heap: per(kcm1, kcm0), note: "growth of its resident memory (RSS) per pod"})
	}
	fmt.Fprintf(os.Stderr, "  memory: heap before %d, executor started %d, %d tasks running %d, + plain informer %d, executor stopped %d; controller-manager RSS %d -> %d\n", h0, hStarted, n, h1, h2, h3, kcm0, kcm1)
	return rows
}

// settle waits until the executor's pod cache holds, for every task pod,
// the version the API server has, with every container running.
func settle(ctx context.Context, tb testing.TB, env *clustertest.Env, ex *executor.Executor) {
	tb.Helper()
	waitFor(tb, 5*time.Minute, "memory: pod cache current", func() (bool, string) {
		list, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if err != nil {
			return false, err.Error()
		}
		stale := 0
		for i := range list.Items {
			p := &list.Items[i]
			c := ex.CachedPod(p.Namespace, p.Name)
			if c == nil || c.ResourceVersion != p.ResourceVersion || !allRunning(p) {
				stale++
			}
		}
		return stale == 0, fmt.Sprintf("%d of %d pods not yet running and current in the cache", stale, len(list.Items))
	})
}

// allRunning reports whether every container of pod runs.
func allRunning(pod *corev1.Pod) bool {
	if len(pod.Status.ContainerStatuses) != len(pod.Spec.Containers) {
		return false
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.State.Running == nil {
			return false
		}
	}
	return true
}

// rssOf is the resident memory of the cluster component name, in bytes; 0
// when unknown.
func rssOf(name string) uint64 {
	for _, p := range clustertest.Cluster().Processes() {
		if p.Name == name {
			return rssOfPID(p.PID)
		}
	}
	return 0
}

func rssOfPID(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}
