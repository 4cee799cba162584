package executor

import (
	"fmt"
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
// store's, which has no index: use ByIndex.
type podIndexer struct {
	cache.Indexer // the store itself, with no index of its own

	mu   sync.RWMutex
	one  map[string]*cachedPod   // by run: its only cached pod
	more map[string][]*cachedPod // by run: its cached pods, when more than one
}

func newPodIndexer() *podIndexer {
	return &podIndexer{
		Indexer: cache.NewIndexer(podKey, cache.Indexers{}),
		one:     map[string]*cachedPod{},
		more:    map[string][]*cachedPod{},
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
	}
	if stored {
		x.index(obj)
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
	x.one, x.more = map[string]*cachedPod{}, map[string][]*cachedPod{}
	for _, obj := range x.List() {
		x.index(obj)
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
