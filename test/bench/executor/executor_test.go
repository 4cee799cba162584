package executor

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/internal/localcluster"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// ensureSimNodes adds kwok nodes until the cluster has at least n.
func ensureSimNodes(tb testing.TB, n int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := clustertest.Cluster()
	if have := len(c.SimNodeNames()); have < n {
		if err := c.AddSimNodes(ctx, n-have); err != nil {
			tb.Fatalf("adding simulated nodes: %v", err)
		}
	}
}

// quickTask is a task whose only container completes with 0 at once on a
// kwok node: the same pod the Job baseline runs.
func quickTask(name string) *task.Task {
	t := exectest.SimTask(name, map[string]string{kwokstages.CompleteAfter: "0s", kwokstages.CompleteCode: "0"})
	t.Spec.Template.Spec.Containers = t.Spec.Template.Spec.Containers[:1] // main only
	return t
}

// tracker watches a namespace's pods with its own plain informer and notes
// when it first sees each pod's main container terminated, and the deletions.
type tracker struct {
	key func(*corev1.Pod) string

	mu         sync.Mutex
	created    int
	terminated map[string]time.Time
	deleted    int
	lastDelete time.Time
	// last is the last pod deleted, as the watch last showed it.
	last *corev1.Pod
}

func newTracker(key func(*corev1.Pod) string) *tracker {
	return &tracker{key: key, terminated: map[string]time.Time{}}
}

func (tr *tracker) observe(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if terminated(pod) {
		now := time.Now()
		k := tr.key(pod)
		tr.mu.Lock()
		if _, seen := tr.terminated[k]; !seen {
			tr.terminated[k] = now
		}
		tr.mu.Unlock()
	}
}

// start runs the informer until ctx ends and waits for its first sync.
func (tr *tracker) start(ctx context.Context, tb testing.TB, client kubernetes.Interface, ns, selector string) {
	inf := podInformer(client, ns, selector)
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			tr.mu.Lock()
			tr.created++
			tr.mu.Unlock()
			tr.observe(obj)
		},
		UpdateFunc: func(_, obj any) { tr.observe(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			pod, _ := obj.(*corev1.Pod)
			tr.mu.Lock()
			tr.deleted++
			tr.lastDelete = time.Now()
			if pod != nil {
				tr.last = pod
			}
			tr.mu.Unlock()
		},
	})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		tb.Fatal("tracker informer did not sync")
	}
}

// lastPod is the last pod deleted (nil for none).
func (tr *tracker) lastPod() *corev1.Pod {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.last
}

func (tr *tracker) counts() (created, deleted int, last time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.created, tr.deleted, tr.lastDelete
}

// podInformer is a plain client-go pod informer: no transform, no indexers
// beyond the namespace one.
func podInformer(client kubernetes.Interface, ns, selector string) cache.SharedIndexInformer {
	pods := client.CoreV1().Pods(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			return pods.Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// outcomes collects the executor's events: when each task's attempt outcome
// was recorded, and its terminal events.
type outcomes struct {
	mu       sync.Mutex
	recorded map[string]time.Time
	// delivered is when OnEvent received the AttemptFinished event: the
	// executor emits it right after recording the outcome (the pod is then
	// stopped, released and deleted).
	delivered map[string]time.Time
	terminal  map[string][]executor.Event
	running   map[string]bool
}

func newOutcomes() *outcomes {
	return &outcomes{recorded: map[string]time.Time{}, delivered: map[string]time.Time{}, terminal: map[string][]executor.Event{}, running: map[string]bool{}}
}

func (o *outcomes) add(ev executor.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ev.Type == executor.EventAttemptFinished {
		if _, ok := o.recorded[ev.ID]; !ok {
			o.recorded[ev.ID] = ev.Time // the store's AttemptOutcome.ObservedAt
			o.delivered[ev.ID] = time.Now()
		}
	}
	if ev.Terminal {
		o.terminal[ev.ID] = append(o.terminal[ev.ID], ev)
	}
	if ev.Phase == "Running" {
		o.running[ev.ID] = true
	}
}

func (o *outcomes) counts() (terminal, running int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.terminal), len(o.running)
}

// waitFor polls cond every 200 ms, printing progress every 10 s, and fails
// the benchmark after timeout.
func waitFor(tb testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	nextLog := time.Now().Add(10 * time.Second)
	for {
		ok, progress := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not done after %s: %s", what, timeout, progress)
		}
		if time.Now().After(nextLog) {
			fmt.Fprintf(os.Stderr, "    ... %s: %s\n", what, progress)
			nextLog = time.Now().Add(10 * time.Second)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// apiserverRequestsBy is apiserver_request_total over every client by
// "VERB resource[/subresource]"; nil when the metrics cannot be read.
func apiserverRequestsBy(ctx context.Context, client kubernetes.Interface) map[string]float64 {
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil
	}
	return requestsByVerb(string(raw))
}

func quickJob(name string) *batchv1.Job {
	zero, one := int32(0), int32(1)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			TTLSecondsAfterFinished: &zero,
			BackoffLimit:            &zero,
			Completions:             &one,
			Parallelism:             &one,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{kwokstages.CompleteAfter: "0s", kwokstages.CompleteCode: "0"}},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					NodeSelector:  localcluster.SimNodeSelector(),
					Tolerations:   []corev1.Toleration{localcluster.SimNodeToleration()},
					Containers:    []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"true"}}},
				},
			},
		},
	}
}
