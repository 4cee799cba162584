package executor

import (
	"fmt"
	"strings"
	"sync"

	"k8s.io/client-go/tools/cache"
)

// runIndex is the one index of a pod cache: a task's pods by its ID
// (cachedPod.run).
const runIndex = "run"

// podIndexer is a pod cache's store: client-go's thread-safe store keyed by
// podKey, with the run index kept beside it in two plain maps instead of
// client-go's index (a set per value and a map of sets per index: about
// 300 B per pod, a third of a tracked pod's cost, for a task that has one
// pod nearly all its life).
//
// Guarantees, as client-go's indexer: a change of the store and of its run
// index are one step to readers (ByIndex, and every method of the store,
// see the store and the index as of the same changes); ByIndex returns a
// new slice of the cached objects. Only *cachedPod objects with a run are
// indexed; every other object is stored and not indexed, as indexByRun
// would leave it. Index, IndexKeys and ListIndexFuncValues are the inner
// store's, which has no index: use ByIndex. It also counts the stored
// objects by namespace (addCounts, count), kept with each change as the
// index is, so that the slots in use are counted without listing every key
// on each admission (which made admissions cost as many steps as there are
// pods in flight).
type podIndexer struct {
	cache.Indexer // the store itself, with no index of its own

	mu   sync.RWMutex
	one  map[string]*cachedPod   // by run: its only cached pod
	more map[string][]*cachedPod // by run: its cached pods, when more than one
	byNS map[string]int          // stored objects by their key's namespace
	all  int                     // stored objects
}

func newPodIndexer() *podIndexer {
	return &podIndexer{
		Indexer: cache.NewIndexer(podKey, cache.Indexers{}),
		one:     map[string]*cachedPod{},
		more:    map[string][]*cachedPod{},
		byNS:    map[string]int{},
	}
}

// addCounts adds the number of stored objects of each namespace to into.
func (x *podIndexer) addCounts(into map[string]int) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for ns, n := range x.byNS {
		into[ns] += n
	}
}

// count is the number of stored objects.
func (x *podIndexer) count() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.all
}

// keyNamespace is the namespace part of a podKey ("ns/name").
func keyNamespace(key string) string {
	ns, _, _ := strings.Cut(key, "/")
	return ns
}

// tally moves the count of key's namespace by d; x.mu is held.
func (x *podIndexer) tally(key string, d int) {
	ns := keyNamespace(key)
	x.all += d
	if x.byNS[ns] += d; x.byNS[ns] == 0 {
		delete(x.byNS, ns)
	}
}

// Add stores obj in place of the object with its key, if any.
func (x *podIndexer) Add(obj any) error { return x.change(obj, x.Indexer.Add, true) }

// Update stores obj in place of the object with its key, if any.
func (x *podIndexer) Update(obj any) error { return x.change(obj, x.Indexer.Update, true) }

// Delete removes the object with obj's key, if any.
func (x *podIndexer) Delete(obj any) error { return x.change(obj, x.Indexer.Delete, false) }

// change applies store(obj) to the store and the same change to the run
// index, as one step to readers: the object stored with obj's key before
// leaves the index, and obj enters it when stored.
func (x *podIndexer) change(obj any, store func(any) error, stored bool) error {
	key, err := podKey(obj)
	if err != nil {
		return fmt.Errorf("indexing pod: %w", err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	old, had, err := x.GetByKey(key)
	if err != nil {
		return err
	}
	if err := store(obj); err != nil {
		return err
	}
	if had {
		x.unindex(old)
		x.tally(key, -1)
	}
	if stored {
		x.index(obj)
		x.tally(key, +1)
	}
	return nil
}

// Replace replaces the whole store with list.
func (x *podIndexer) Replace(list []any, resourceVersion string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.Indexer.Replace(list, resourceVersion); err != nil {
		return err
	}
	x.one, x.more, x.byNS, x.all = map[string]*cachedPod{}, map[string][]*cachedPod{}, map[string]int{}, 0
	for _, key := range x.ListKeys() {
		if obj, ok, _ := x.GetByKey(key); ok {
			x.index(obj)
			x.tally(key, +1)
		}
	}
	return nil
}

// ByIndex returns the cached pods of task value (runIndex only).
func (x *podIndexer) ByIndex(indexName, value string) ([]any, error) {
	if indexName != runIndex {
		return nil, fmt.Errorf("index %q does not exist: a pod cache has only %q", indexName, runIndex)
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	if p := x.one[value]; p != nil {
		return []any{p}, nil
	}
	pods := x.more[value]
	out := make([]any, len(pods))
	for i, p := range pods {
		out[i] = p
	}
	return out, nil
}

// index adds obj to the run index; x.mu is held.
func (x *podIndexer) index(obj any) {
	p, ok := obj.(*cachedPod)
	if !ok {
		return
	}
	id := p.run()
	if id == "" {
		return
	}
	if first := x.one[id]; first != nil {
		delete(x.one, id)
		x.more[id] = []*cachedPod{first, p}
		return
	}
	if pods, ok := x.more[id]; ok {
		x.more[id] = append(pods, p)
		return
	}
	x.one[id] = p
}

// unindex removes obj, the stored object of its key, from the run index;
// x.mu is held.
func (x *podIndexer) unindex(obj any) {
	p, ok := obj.(*cachedPod)
	if !ok {
		return
	}
	id := p.run()
	if id == "" {
		return
	}
	if x.one[id] == p {
		delete(x.one, id)
		return
	}
	pods := x.more[id]
	for i, q := range pods {
		if q == p {
			pods = append(pods[:i:i], pods[i+1:]...)
			break
		}
	}
	switch len(pods) {
	case 0:
		delete(x.more, id)
	case 1:
		delete(x.more, id)
		x.one[id] = pods[0]
	default:
		x.more[id] = pods
	}
}
