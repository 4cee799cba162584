// Package exectest has helpers for executor tests against the local cluster:
// an event collector, an executor run for the length of a test, task
// builders for the local process node and for kwok nodes.
package exectest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/internal/localcluster"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Events collects executor events per task; Add is an executor.Config.OnEvent.
type Events struct {
	mu sync.Mutex
	by map[string][]executor.Event
}

// NewEvents returns an empty collector.
func NewEvents() *Events { return &Events{by: map[string][]executor.Event{}} }

// Add records ev.
func (e *Events) Add(ev executor.Event) {
	e.mu.Lock()
	e.by[ev.ID] = append(e.by[ev.ID], ev)
	e.mu.Unlock()
}

// Terminal returns the terminal events of id.
func (e *Events) Terminal(id string) []executor.Event {
	return e.filter(id, func(ev executor.Event) bool { return ev.Terminal })
}

// AttemptsFinished returns the AttemptFinished events of id.
func (e *Events) AttemptsFinished(id string) []executor.Event {
	return e.filter(id, func(ev executor.Event) bool { return ev.Type == executor.EventAttemptFinished })
}

// First returns the time of id's first event of type typ (zero when there
// is none).
func (e *Events) First(id string, typ executor.EventType) time.Time {
	if evs := e.filter(id, func(ev executor.Event) bool { return ev.Type == typ }); len(evs) > 0 {
		return evs[0].Time
	}
	return time.Time{}
}

func (e *Events) filter(id string, keep func(executor.Event) bool) []executor.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []executor.Event
	for _, ev := range e.by[id] {
		if keep(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// WaitTerminal waits until every id has a terminal event.
func (e *Events) WaitTerminal(t *testing.T, timeout time.Duration, ids ...string) {
	t.Helper()
	clustertest.Eventually(t, timeout, "every task terminal", func(context.Context) error {
		var missing []string
		for _, id := range ids {
			if len(e.Terminal(id)) == 0 {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			if len(missing) > 5 {
				missing = append(missing[:5], fmt.Sprintf("... (%d in all)", len(missing)))
			}
			return fmt.Errorf("not terminal: %s", strings.Join(missing, ", "))
		}
		return nil
	})
}

// StartExecutor runs an executor in the test's namespace (or in
// cfg.Namespaces when set) until the test ends (or stop is called) and
// returns it.
func StartExecutor(t testing.TB, env *clustertest.Env, cfg executor.Config) (*executor.Executor, func()) {
	t.Helper()
	if cfg.RESTConfig == nil {
		cfg.RESTConfig = env.Config
	}
	if len(cfg.Namespaces) == 0 {
		cfg.Namespaces = []string{env.Namespace}
	}
	cfg.DefaultNamespace = env.Namespace
	if cfg.InstanceID == "" {
		cfg.InstanceID = "test"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 200, 400
	}
	ex, err := executor.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Start(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("executor Start: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	clustertest.Eventually(t, time.Minute, "executor healthy", func(context.Context) error { return ex.Healthy() })
	return ex, stop
}

// LocalTask runs script with sh on the local process node, optionally with a
// sidecar script. It needs no selector or toleration: simulated nodes are
// tainted, so the scheduler puts it on the local node.
func LocalTask(name, script, sidecar string) *task.Task {
	grace := int64(2)
	t := &task.Task{
		TypeMeta:   metav1.TypeMeta{APIVersion: task.APIVersion, Kind: task.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}
	t.Spec.MainContainer = "main"
	spec := &t.Spec.Template.Spec
	spec.TerminationGracePeriodSeconds = &grace
	spec.Containers = []corev1.Container{{
		Name: "main", Image: "busybox", Command: []string{"sh", "-c", script},
		Env: []corev1.EnvVar{{Name: "ATTEMPT", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['kubetask.dev/attempt']"}}}},
	}}
	if sidecar != "" {
		spec.Containers = append(spec.Containers, corev1.Container{Name: "envoy", Image: "envoyproxy/envoy:v1.31", Command: []string{"sh", "-c", sidecar}})
	}
	return t
}

// SimTask runs on kwok nodes; annotations drive what the simulated kubelet does.
func SimTask(name string, annotations map[string]string) *task.Task {
	t := &task.Task{
		TypeMeta:   metav1.TypeMeta{APIVersion: task.APIVersion, Kind: task.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}
	t.Spec.MainContainer = "main"
	t.Spec.Template.Annotations = annotations
	spec := &t.Spec.Template.Spec
	spec.NodeSelector = localcluster.SimNodeSelector()
	spec.Tolerations = []corev1.Toleration{localcluster.SimNodeToleration()}
	spec.Containers = []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"true"}},
		{Name: "envoy", Image: "envoyproxy/envoy:v1.31", Command: []string{"envoy"}}}
	return t
}

// Submit submits tk under id or fails the test.
func Submit(t *testing.T, ex *executor.Executor, id string, tk *task.Task) {
	t.Helper()
	if _, err := ex.Submit(context.Background(), id, tk); err != nil {
		t.Fatalf("submitting %s: %v", id, err)
	}
}

// WaitNoTaskPods waits until no kubetask pod is left in the namespace.
func WaitNoTaskPods(t testing.TB, env *clustertest.Env, timeout time.Duration) {
	t.Helper()
	clustertest.Eventually(t, timeout, "no task pod left", func(ctx context.Context) error {
		pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if err != nil {
			return err
		}
		if n := len(pods.Items); n > 0 {
			p := pods.Items[0]
			return fmt.Errorf("%d pods left, e.g. %s (phase %s, deleting %v, finalizers %v)", n, p.Name, p.Status.Phase, p.DeletionTimestamp != nil, p.Finalizers)
		}
		return nil
	})
}

// ExitCode is ev's exit code, -1 when it has none.
func ExitCode(ev executor.Event) int32 {
	if ev.ExitCode == nil {
		return -1
	}
	return *ev.ExitCode
}

// Record reads id from st or fails the test.
func Record(t *testing.T, st store.Store, id string) store.Record {
	t.Helper()
	r, err := st.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// RemoveTaskPods strips kubetask's finalizer from every task pod left in
// env's namespace (an executor stopped with its tasks running, on purpose),
// deletes them (grace period 0) and waits until they are gone.
func RemoveTaskPods(t testing.TB, env *clustertest.Env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pods := env.Client.CoreV1().Pods(env.Namespace)
	sel := metav1.ListOptions{LabelSelector: task.ManagedSelector().String()}
	list, err := pods.List(ctx, sel)
	if err != nil {
		t.Errorf("listing pods to remove: %v", err)
		return
	}
	// One pod at a time from 16 workers: a DeleteCollection of thousands of
	// pods outlasts the API server's request timeout.
	zero := int64(0)
	var g errgroup.Group
	g.SetLimit(16)
	for _, p := range list.Items {
		g.Go(func() error {
			if len(p.Finalizers) > 0 {
				_, err := pods.Patch(ctx, p.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("removing finalizers of %s: %v", p.Name, err)
				}
			}
			err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s: %v", p.Name, err)
			}
			return nil // each pod's error is reported; the rest go on
		})
	}
	_ = g.Wait()
	WaitNoTaskPods(t, env, 5*time.Minute)
}

// MetricSum gathers reg and sums the series of the counter or gauge name
// whose labels have the values given as name, value pairs (every series
// when none is given); 0 when there is no such metric, NaN when reg cannot
// be gathered.
func MetricSum(reg prometheus.Gatherer, name string, labelValues ...string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return math.NaN()
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labelValues); i += 2 {
				for _, l := range m.GetLabel() {
					if l.GetName() == labelValues[i] && l.GetValue() != labelValues[i+1] {
						continue series
					}
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// MainRuns records, from a watch on env's namespace that kubetask does not
// control, when each task pod's main container ran: its start and finish as
// the node reported them in the pod's status (second precision).
type MainRuns struct {
	mu   sync.Mutex
	main string
	runs map[types.UID]*MainRun
}

// MainRun is one pod's main container run: Start is zero until a status
// showed it running or terminated, Finish until one showed it terminated.
type MainRun struct {
	Pod, Task     string
	Start, Finish time.Time
}

// WatchMainRuns records the runs of container main in env's task pods
// until the test ends.
func WatchMainRuns(t testing.TB, env *clustertest.Env, main string) *MainRuns {
	t.Helper()
	m := &MainRuns{main: main, runs: map[types.UID]*MainRun{}}
	f := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace(env.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = task.ManagedSelector().String() }))
	inf := f.Core().V1().Pods().Informer()
	note := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			m.note(pod)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: note, UpdateFunc: func(_, o any) { note(o) }, DeleteFunc: note})
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	return m
}

func (m *MainRuns) note(pod *corev1.Pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.runs[pod.UID]
	if r == nil {
		r = &MainRun{Pod: pod.Name, Task: pod.Labels[task.LabelRun]}
		m.runs[pod.UID] = r
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name != m.main {
			continue
		}
		switch s := st.State; {
		case s.Running != nil && r.Start.IsZero():
			r.Start = s.Running.StartedAt.Time
		case s.Terminated != nil:
			r.Start, r.Finish = s.Terminated.StartedAt.Time, s.Terminated.FinishedAt.Time
		}
	}
}

// Runs returns the runs recorded so far, by start.
func (m *MainRuns) Runs() []MainRun {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []MainRun
	for _, r := range m.runs {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// MostAtOnce is the largest number of main containers that ran at the same
// time, from the runs' start and finish: a run ends at its finish (one not
// seen finished runs on), and one that starts in the second another
// finished did not overlap it (the node reports whole seconds).
func MostAtOnce(runs []MainRun) int {
	most := 0
	for _, r := range runs {
		if r.Start.IsZero() {
			continue
		}
		n := 0
		for _, o := range runs {
			if !o.Start.IsZero() && !o.Start.After(r.Start) && (o.Finish.IsZero() || o.Finish.After(r.Start)) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// EtcdPodRequests is kube-apiserver's etcd_requests_total for pods, by
// operation (get, create, update, delete ...), read from its metrics. It
// shows what request counts do not: an update or a delete that lost a race
// with another writer of the same pod is read and written again inside the
// API server, one request from the client, two or more from etcd's side.
func EtcdPodRequests(ctx context.Context, env *clustertest.Env) (map[string]float64, error) {
	raw, err := env.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading kube-apiserver's metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parsing kube-apiserver's metrics: %w", err)
	}
	by := map[string]float64{}
	for _, m := range fams["etcd_requests_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		if l["resource"] == "pods" && l["group"] == "" {
			by[l["operation"]] += m.GetCounter().GetValue()
		}
	}
	return by, nil
}
