package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// fx is an executor whose sync passes a test drives one at a time: the
// informer cache is an indexer the test fills, the API server a fake
// clientset, time a fake clock. No informer, worker or creator runs.
type fx struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	clk    *clocktesting.FakeClock
	ex     *Executor
	idx    cache.Indexer
	exec   *fakeExec
	events []Event
}

// fakeExec answers result reads: out, or err.
type fakeExec struct {
	out   string
	err   error
	calls int
}

func (f *fakeExec) Exec(_ context.Context, _, _, _ string, _ []string, stdout, _ io.Writer) error {
	f.calls++
	if f.err != nil {
		return f.err
	}
	_, err := io.WriteString(stdout, f.out)
	return err
}

func newFx(t *testing.T, mod func(*Config)) *fx {
	t.Helper()
	f := &fx{t: t, ctx: context.Background(), client: fake.NewClientset(), clk: clocktesting.NewFakeClock(podtest.T0), exec: &fakeExec{out: "42"}}
	cfg := Config{
		Client: f.client, Execer: f.exec, InstanceID: "ex", Namespaces: []string{"ns"}, Clock: f.clk,
		Store:   store.NewMemoryWithClock(f.clk),
		OnEvent: func(ev Event) { f.events = append(f.events, ev) },
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	ex, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.ex = ex
	// The API server gives every pod it creates a UID.
	var uids int
	f.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if p, ok := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod); ok && p.UID == "" {
			uids++
			p.UID = types.UID(fmt.Sprintf("uid-%s-%d", p.Name, uids))
		}
		return false, nil, nil
	})
	f.beginTerm()
	f.idx = newPodIndexer()
	ex.indexers.Store(&[]cache.Indexer{f.idx})
	if ex.queue != nil { // a RecordOnly executor has none
		t.Cleanup(ex.queue.ShutDown)
	}
	return f
}

// beginTerm starts a term of the executor as Start's term does when it
// holds the Lease: a new epoch in the store, and a context that a fenced
// write ends.
func (f *fx) beginTerm() int64 {
	f.t.Helper()
	epoch, err := f.ex.store.BeginTerm(f.ctx, f.ex.cfg.InstanceID)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, end := context.WithCancelCause(f.ctx)
	f.t.Cleanup(func() { end(nil) })
	f.ex.mu.Lock()
	f.ex.termCtx, f.ex.endTerm = ctx, end
	f.ex.mu.Unlock()
	f.ex.epoch.Store(epoch)
	return epoch
}

// newTask is the tasks' default: main container "main" beside an envoy-like
// sidecar, default timeouts, cleanup Delete, no retries.
func newTask(edits ...func(*task.Task)) *task.Task {
	t := &task.Task{TypeMeta: metav1.TypeMeta{APIVersion: task.APIVersion, Kind: task.Kind}}
	t.Name = "job"
	t.Spec.MainContainer = "main"
	zero := int32(0)
	t.Spec.Retries.Limit = &zero
	t.Spec.Template.Spec.Containers = []corev1.Container{
		{Name: "main", Image: "busybox", Command: []string{"true"}},
		{Name: "envoy", Image: "envoy", Command: []string{"envoy"}},
	}
	for _, e := range edits {
		e(t)
	}
	return t
}

func (f *fx) submit(id string, t *task.Task, opts ...SubmitOption) store.Record {
	f.t.Helper()
	t = t.DeepCopy()
	t.Namespace = "ns"
	rec, err := f.ex.Submit(f.ctx, id, t, opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	return rec
}

func (f *fx) record(id string) store.Record {
	f.t.Helper()
	rec, err := f.ex.store.Get(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return rec
}

func (f *fx) update(id string, edit func(*store.Record)) {
	f.t.Helper()
	rec := f.record(id)
	edit(&rec)
	if _, err := f.ex.store.Update(f.ctx, rec); err != nil {
		f.t.Fatal(err)
	}
}

// podOf builds the pod of attempt n of task id as kubetask creates it, with
// the node, scheduling, deletion and status facts of w.
func (f *fx) podOf(id string, n int, w *podtest.PodWrapper) *corev1.Pod {
	f.t.Helper()
	rec := f.record(id)
	var t task.Task
	if err := json.Unmarshal(rec.Task, &t); err != nil {
		f.t.Fatal(err)
	}
	pod, err := task.BuildPod(&t, task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Executor: f.ex.cfg.InstanceID, Nonce: rec.Nonce}, n)
	if err != nil {
		f.t.Fatal(err)
	}
	from := w.Obj()
	pod.UID = from.UID
	pod.CreationTimestamp = from.CreationTimestamp
	pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = from.DeletionTimestamp, from.DeletionGracePeriodSeconds
	pod.Spec.NodeName, pod.Spec.SchedulingGates = from.Spec.NodeName, from.Spec.SchedulingGates
	if from.Spec.ActiveDeadlineSeconds != nil {
		pod.Spec.ActiveDeadlineSeconds = from.Spec.ActiveDeadlineSeconds
	}
	pod.Status = from.Status
	return pod
}

// cache puts pod in the informer cache only, as the caches' Transform
// keeps it.
func (f *fx) cache(pod *corev1.Pod) {
	f.t.Helper()
	if err := f.idx.Update(compactPod(pod)); err != nil {
		f.t.Fatal(err)
	}
}

// uncache removes pod from the informer cache only.
func (f *fx) uncache(pod *corev1.Pod) {
	f.t.Helper()
	_ = f.idx.Delete(compactPod(pod))
}

// server puts pod in the API server only.
func (f *fx) server(pod *corev1.Pod) {
	f.t.Helper()
	tr := f.client.Tracker()
	if _, err := f.client.CoreV1().Pods(pod.Namespace).Get(f.ctx, pod.Name, metav1.GetOptions{}); err == nil {
		if err := tr.Update(corev1.SchemeGroupVersion.WithResource("pods"), pod.DeepCopy(), pod.Namespace); err != nil {
			f.t.Fatal(err)
		}
		return
	}
	if err := tr.Add(pod.DeepCopy()); err != nil {
		f.t.Fatal(err)
	}
}

// both puts pod in the API server and the cache.
func (f *fx) both(pod *corev1.Pod) {
	f.t.Helper()
	f.server(pod)
	f.cache(pod)
}

// serverPod reads pod name from the API server (nil when gone).
// reflect makes the cache show pod name as the API server has it (gone:
// not cached), as the watch would.
func (f *fx) reflect(name string) {
	f.t.Helper()
	f.drainCleanups()
	if live := f.serverPod(name); live != nil {
		f.cache(live)
		return
	}
	for _, o := range f.idx.List() {
		if p := o.(*cachedPod).pod(); p.Name == name {
			f.uncache(p)
		}
	}
}

func (f *fx) serverPod(name string) *corev1.Pod {
	p, err := f.client.CoreV1().Pods("ns").Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return p
}

// sync runs one pass for id, then the clean-up calls it handed over, and
// returns the pass's requeue, the API requests made ("verb resource",
// subresources and names left out) and the pass's error.
func (f *fx) sync(id string) (time.Duration, []string, error) {
	f.t.Helper()
	f.client.ClearActions()
	d, err := f.ex.sync(f.ctx, id)
	f.drainCleanups()
	return d, f.actionVerbs(), err
}

// actionVerbs are the API requests made since the client's actions were
// last cleared, as "verb resource".
func (f *fx) actionVerbs() []string {
	var verbs []string
	for _, a := range f.client.Actions() {
		verbs = append(verbs, a.GetVerb()+" "+a.GetResource().Resource)
	}
	return verbs
}

// drainCleanups performs the queued clean-up calls (delete, stop,
// release) as the cleaner goroutines would.
func (f *fx) drainCleanups() {
	for {
		select {
		case key := <-f.ex.cleanups:
			f.ex.cleanOne(f.ctx, key)
		default:
			return
		}
	}
}

// drainCreations performs the queued creations as the creator goroutines
// would, and returns the task IDs it created for.
func (f *fx) drainCreations() []string {
	var ids []string
	for {
		select {
		case id := <-f.ex.creates:
			f.ex.createOne(f.ctx, id)
			ids = append(ids, id)
		default:
			return ids
		}
	}
}

// state is the task's state as Get reports it: "Phase/Reason".
func (f *fx) state(id string) string {
	f.t.Helper()
	rec, err := f.ex.Get(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return rec.Phase + "/" + rec.Reason
}

func (f *fx) eventTypes(id string) []string {
	var out []string
	for _, ev := range f.events {
		if ev.ID == id && ev.Type != EventState && ev.Type != EventSubmitted {
			out = append(out, string(ev.Type))
		}
	}
	return out
}

// reactorError makes the fake API server answer verb on resource with err.
func (f *fx) reactorError(verb, resource string, err error) {
	f.client.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, err
	})
}
