package executor

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/pkg/task"
)

// podSelector selects the unreleased pods of this instance and of the
// instances it adopts. Released (kept) pods leave the cache.
func (e *Executor) podSelector() labels.Selector {
	owners := append([]string{e.cfg.InstanceID}, e.cfg.AdoptFrom...)
	managed, _ := labels.NewRequirement(task.LabelManagedBy, selection.Equals, []string{task.ManagedByValue})
	owner, _ := labels.NewRequirement(task.LabelExecutor, selection.In, owners)
	unreleased, _ := labels.NewRequirement(task.LabelReleased, selection.DoesNotExist, nil)
	return labels.NewSelector().Add(*managed, *owner, *unreleased)
}

// startPodCaches starts one pod cache per namespace, running until ctx ends,
// in place of those of an earlier term, and returns them and the namespaces.
func (e *Executor) startPodCaches(ctx context.Context) ([]*podCache, []string) {
	namespaces := e.cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	sel := e.podSelector().String()
	var caches []*podCache
	var indexers []cache.Indexer
	for _, ns := range namespaces {
		c := newPodCache(e.podListWatch(ns, sel), e.podCacheOptions(ns))
		caches = append(caches, c)
		indexers = append(indexers, c.Indexer())
	}
	e.mu.Lock()
	e.caches = caches
	e.indexers.Store(&indexers)
	e.mu.Unlock()
	for _, c := range caches {
		go c.Run(ctx)
	}
	return caches, namespaces
}

// syncedChecker is done once the cache's first list has been handed to
// the handler in full (HasSynced), for cache.WaitFor to wait on without
// polling.
func (c *podCache) syncedChecker() cache.DoneChecker { return c.fifo.HasSyncedChecker() }

// podListWatch lists and watches the pods of namespace ns that selector
// selects, counting the requests.
func (e *Executor) podListWatch(ns, selector string) *cache.ListWatch {
	pods := e.client.CoreV1().Pods(ns)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			list, err := pods.List(ctx, opts)
			e.noteList(err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			if e.cfg.WatchTimeout > 0 {
				secs := int64(max(e.cfg.WatchTimeout/time.Second, 1))
				opts.TimeoutSeconds = &secs
			}
			w, err := pods.Watch(ctx, opts)
			if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
				// A streaming list (client-go's WatchListClient): the
				// cache's first list, counted with the LISTs.
				e.noteList(err)
				return w, err
			}
			result := "ok"
			if err != nil {
				result = "error"
			}
			e.metrics.watches.WithLabelValues(result).Inc()
			return w, err
		},
	}
}

// podCacheOptions are the options of the pod cache of namespace ns: pods
// kept compact (cachedPod), indexed by run, handed to podEvent, failures
// counted and logged.
func (e *Executor) podCacheOptions(ns string) podCacheOptions {
	var client any = e.client
	if e.cfg.PlainList {
		client = plainList{}
	}
	return podCacheOptions{
		Namespace: ns,
		Client:    client,
		Transform: compactTransform,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { e.podEvent(obj, false) },
			UpdateFunc: func(_, obj any) { e.podEvent(obj, false) },
			DeleteFunc: func(obj any) { e.podEvent(obj, true) },
		},
		ResyncPeriod: e.cfg.ResyncPeriod,
		Backoff:      e.cfg.WatchBackoff,
		OnWatchError: func(ctx context.Context, r *cache.Reflector, err error) {
			kind := "other"
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				kind = "expired"
			}
			e.metrics.watchErrors.WithLabelValues(kind).Inc()
			e.cfg.Logger.Info("pod watch ended, relisting", "namespace", ns, "kind", kind, "err", err)
			cache.DefaultWatchErrorHandler(ctx, r, err)
		},
		OnExpired: func() {
			e.metrics.watchErrors.WithLabelValues("expired").Inc()
			e.cfg.Logger.Info("pod watch expired, relisting", "namespace", ns)
		},
		Blind:  e.metrics.podCacheBlind.WithLabelValues(ns),
		Clock:  e.cfg.Clock,
		Logger: e.cfg.Logger,
	}
}

// plainList, as a pod cache's Client, makes its Reflector list with a LIST
// request (Config.PlainList).
type plainList struct{}

// IsWatchListSemanticsUnSupported tells client-go's Reflector not to use a
// streaming list.
func (plainList) IsWatchListSemanticsUnSupported() bool { return true }

// compactTransform is the pod caches' Transform: a pod becomes the
// cachedPod the caches keep of it.
func compactTransform(obj any) (any, error) {
	if pod, ok := obj.(*corev1.Pod); ok {
		return compactPod(pod), nil
	}
	return obj, nil
}

// podEvent handles a pod cache's event: the pod's task is synced again, an
// admitted creation is marked seen (from now on the cache counts its slot),
// and a pod that left the cache frees a slot for the oldest waiting task.
func (e *Executor) podEvent(obj any, deleted bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*cachedPod)
	if !ok {
		return
	}
	if id := pod.run(); id != "" {
		if !deleted {
			e.mu.Lock()
			if c := e.creations[id]; c != nil && c.name == pod.name() && !c.seen {
				c.seen = true
				delete(e.unseenCr, id)
				e.unseenCr = emptied(e.unseenCr)
				e.unseen.Add(-1)
			}
			e.mu.Unlock()
		}
		e.queue.Add(id)
	}
	if deleted {
		e.wakeWaiting()
	}
	e.kickCaptures(pod.key())
	if e.cfg.OnPodChange != nil {
		e.cfg.OnPodChange(pod.namespace.String(), pod.name())
	}
}

// podIndexers are the current term's pod caches' indexers (none before the
// first term).
func (e *Executor) podIndexers() []cache.Indexer {
	if p := e.indexers.Load(); p != nil {
		return *p
	}
	return nil
}

// cachedPodCount is the number of pods in the executor's caches: the pods
// that exist and hold a parallelism slot.
func (e *Executor) cachedPodCount() int {
	n := 0
	for _, idx := range e.podIndexers() {
		if x, ok := idx.(*podIndexer); ok {
			n += x.count()
			continue
		}
		n += len(idx.ListKeys())
	}
	return n
}

// cachedPodsByNamespace counts the pods in the executor's caches by
// namespace (their keys are namespace/name): from the pod caches' own
// counts, in as many steps as there are namespaces.
func (e *Executor) cachedPodsByNamespace() map[string]int {
	byNS := map[string]int{}
	for _, idx := range e.podIndexers() {
		if x, ok := idx.(*podIndexer); ok {
			x.addCounts(byNS)
			continue
		}
		for _, key := range idx.ListKeys() {
			byNS[keyNamespace(key)]++
		}
	}
	return byNS
}

// podsOfRun returns the cached pods of task id, all attempts, as
// cachedPod.pod builds them.
func (e *Executor) podsOfRun(id string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, idx := range e.podIndexers() {
		objs, _ := idx.ByIndex(runIndex, id)
		for _, o := range objs {
			if p, ok := o.(*cachedPod); ok {
				out = append(out, p.pod())
			}
		}
	}
	return out
}
