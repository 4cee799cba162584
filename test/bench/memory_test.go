package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// realisticTask is a task of the size real ones have: a main container and
// an envoy-like sidecar, each with env, resources, mounts and probes; a
// ConfigMap and an emptyDir volume (the API server adds the projected
// service-account token volume, managedFields for the executor's create and
// kwok's status, and its default tolerations). kwok runs it until deleted.
func realisticTask(name string) *task.Task {
	t := exectest.SimTask(name, nil)
	t.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "etl", "app.kubernetes.io/component": "task", "team": "data-platform"}
	t.Spec.Template.Annotations = map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "15090"}
	env := func(prefix string) []corev1.EnvVar {
		var out []corev1.EnvVar
		for i := range 10 {
			out = append(out, corev1.EnvVar{Name: fmt.Sprintf("%s_SETTING_%d", prefix, i), Value: fmt.Sprintf("value-%d-%s", i, strings.Repeat("x", 16))})
		}
		return append(out, corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
	}
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi")},
	}
	mounts := []corev1.VolumeMount{{Name: "config", MountPath: "/etc/task"}, {Name: "scratch", MountPath: "/scratch"}}
	c := t.Spec.Template.Spec.Containers
	c[0].Command = []string{"/bin/sh", "-c", "python -m etl.run --date $(DATE) --input s3://bucket/input --output s3://bucket/output"}
	c[0].Env, c[0].Resources, c[0].VolumeMounts = env("MAIN"), res, mounts
	c[1].Args = []string{"proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local", "--proxyLogLevel=warning"}
	c[1].Env, c[1].Resources, c[1].VolumeMounts = env("PROXY"), res, mounts[:1]
	c[1].Ports = []corev1.ContainerPort{{Name: "http-envoy-prom", ContainerPort: 15090, Protocol: corev1.ProtocolTCP}}
	c[1].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz/ready", Port: intstr.FromInt32(15021)}}, PeriodSeconds: 2}
	t.Spec.Template.Spec.Volumes = []corev1.Volume{
		{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "etl-config"}}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
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
	h3 := heapAfterGC() // the store's records are still referenced by st
	_, _ = st.Get(ctx, "m00000")

	per := func(a, b uint64) float64 { return float64(int64(a)-int64(b)) / float64(n) }
	fixed := per(hStarted, h0)
	cachePerPod := per(h1, h3) - fixed // the executor without its store
	note := fmt.Sprintf("pods with %d containers, %d env vars, %d volumes, %d managedFields entries", len(sample.Spec.Containers), len(sample.Spec.Containers[0].Env), len(sample.Spec.Volumes), len(sample.ManagedFields))
	rows := []row{
		{name: "memory: kubetask executor", tasks: n, heap: cachePerPod, note: "heap per tracked pod: pod cache, queue, task state (store records not counted); " + note},
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
