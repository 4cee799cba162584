package storm

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/kubetask/kubetask/pkg/task"
)

// observer is the benchmark's reference clock: on a connection of its own
// it watches the task pods of one namespace and notes when it first sees,
// for each task, its pod running, its main container terminated, and its
// pod deleting. The storm does not drop its watch, and it never backs off:
// a watch that ends is resumed at once from its last resourceVersion, and
// 410 Expired is answered at once with a fresh LIST. A state first seen in
// such a LIST is noted at the LIST's time and counted in fromList (its lag
// is then understated by at most the observer's own blind time, blindMax).
// A pod it saw that is gone (deleted, or missing from such a LIST) is noted
// gone: when its main container's end fell into the observer's blind time,
// the pod may be gone before the observer saw it terminated, and that task's
// lag cannot be measured.
type observer struct {
	client    kubernetes.Interface
	namespace string
	container string // the task's main container

	mu         sync.Mutex
	changed    chan struct{} // closed and replaced at every change
	running    map[string]time.Time
	terminated map[string]time.Time
	deleting   map[string]time.Time
	gone       map[string]time.Time
	pods       map[string]string // task ID -> pod name
	fromList   int
	relists    int
	blindMax   time.Duration
}

func newObserver(client kubernetes.Interface, namespace, container string) *observer {
	return &observer{
		client: client, namespace: namespace, container: container,
		changed: make(chan struct{}),
		running: map[string]time.Time{}, terminated: map[string]time.Time{}, deleting: map[string]time.Time{}, gone: map[string]time.Time{},
		pods: map[string]string{},
	}
}

// Run watches until ctx ends.
func (o *observer) Run(ctx context.Context) {
	pods := o.client.CoreV1().Pods(o.namespace)
	sel := task.ManagedSelector().String()
	rv := ""
	var lost time.Time // when the last watch ended; zero at the start
	for ctx.Err() == nil {
		if rv == "" {
			list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				pause(ctx)
				continue
			}
			o.note(list.Items, !lost.IsZero())
			o.noteGone(list.Items)
			rv = list.ResourceVersion
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: rv, AllowWatchBookmarks: true})
		switch {
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			rv = ""
			continue
		case err != nil:
			pause(ctx)
			continue
		}
		if !lost.IsZero() {
			o.mu.Lock()
			o.blindMax = max(o.blindMax, time.Since(lost))
			o.mu.Unlock()
		}
		rv = o.consume(ctx, w, rv)
		lost = time.Now()
	}
}

// consume handles w's events until it ends and returns the version to
// resume from ("" to list again).
func (o *observer) consume(ctx context.Context, w watch.Interface, rv string) string {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return rv
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv
			}
			switch ev.Type {
			case watch.Error:
				if err := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					o.mu.Lock()
					o.relists++
					o.mu.Unlock()
					return ""
				}
				return rv
			case watch.Added, watch.Modified, watch.Bookmark:
				pod, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				rv = pod.ResourceVersion
				if ev.Type != watch.Bookmark {
					o.note([]corev1.Pod{*pod}, false)
				}
			case watch.Deleted:
				pod, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				rv = pod.ResourceVersion
				o.note([]corev1.Pod{*pod}, false) // its final state
				o.mu.Lock()
				if id := pod.Labels[task.LabelRun]; id != "" {
					if _, ok := o.gone[id]; !ok {
						o.gone[id] = time.Now()
					}
				}
				o.mu.Unlock()
			}
		}
	}
}

// note records what pods show for the first time; fromList says they come
// from a LIST after a lost watch.
func (o *observer) note(pods []corev1.Pod, fromList bool) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	changed := false
	first := func(m map[string]time.Time, id string) {
		if _, ok := m[id]; !ok {
			m[id] = now
			changed = true
			if fromList {
				o.fromList++
			}
		}
	}
	for i := range pods {
		p := &pods[i]
		id := p.Labels[task.LabelRun]
		if id == "" {
			continue
		}
		o.pods[id] = p.Name
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name != o.container {
				continue
			}
			if cs.State.Running != nil {
				first(o.running, id)
			}
			if cs.State.Terminated != nil {
				first(o.terminated, id)
			}
		}
		if p.DeletionTimestamp != nil {
			first(o.deleting, id)
		}
	}
	if changed {
		close(o.changed)
		o.changed = make(chan struct{})
	}
}

// noteGone notes gone every pod the observer saw that listed does not hold.
func (o *observer) noteGone(listed []corev1.Pod) {
	now := time.Now()
	there := map[string]bool{}
	for i := range listed {
		there[listed[i].Labels[task.LabelRun]] = true
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	changed := false
	for id := range o.pods {
		if _, ok := o.gone[id]; !ok && !there[id] {
			o.gone[id] = now
			changed = true
		}
	}
	if changed {
		close(o.changed)
		o.changed = make(chan struct{})
	}
}

// TerminatedAt is when the observer first saw task id's main container
// terminated.
func (o *observer) TerminatedAt(id string) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok := o.terminated[id]
	return at, ok
}

// PodOf is the name of task id's pod, "" if not seen.
func (o *observer) PodOf(id string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.pods[id]
}

// stats are the observer's relists after 410 Expired, the states it first
// saw in a LIST after a lost watch, and its longest time without a watch.
func (o *observer) stats() (relists, fromList int, blindMax time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.relists, o.fromList, o.blindMax
}

// Wait waits until every id has been seen in the state of which (running,
// terminated, deleting, or ended: terminated or gone), or ctx ends.
func (o *observer) Wait(ctx context.Context, which string, ids []string) error {
	missing, err := waitUntil(ctx, &o.mu, &o.changed, func() int {
		ms := map[string][]map[string]time.Time{"running": {o.running}, "terminated": {o.terminated}, "deleting": {o.deleting}, "ended": {o.terminated, o.gone}}[which]
		n := 0
		for _, id := range ids {
			seen := false
			for _, m := range ms {
				_, ok := m[id]
				seen = seen || ok
			}
			if !seen {
				n++
			}
		}
		return n
	})
	if err != nil {
		return fmt.Errorf("%d of %d tasks not seen %s: %w", missing, len(ids), which, err)
	}
	return nil
}

// pause waits a little before a request is tried again, so that an API
// server that refuses requests is not hammered.
func pause(ctx context.Context) {
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// GoneAt is when the observer first knew task id's pod gone.
func (o *observer) GoneAt(id string) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok := o.gone[id]
	return at, ok
}
