package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/kubetask/kubetask/pkg/store"
)

// Quotas caps the tasks of each namespace, so that one tenant cannot fill
// the store (each task keeps up to 1 MiB of document, and a waiting task
// is held in the executor's memory) for the others.
type Quotas struct {
	// Counter counts a namespace's tasks in the store. Required.
	Counter store.NamespaceCounter
	// MaxUnfinished caps the tasks of a namespace not finished yet
	// (waiting or running): a submission beyond is 429 (they finish).
	// 0: no cap.
	MaxUnfinished int64
	// MaxTotal caps the tasks a namespace keeps, finished ones included
	// until retention deletes them: a submission beyond is 403. 0: no cap.
	MaxTotal int64
	// Refresh is how old a namespace's count may be before it is counted
	// again, in the background: between counts the server adds the tasks
	// it created. Default 2s.
	Refresh time.Duration
}

// quotas keeps each namespace's count, so that a submission reads the
// store only for the first of its namespace since the start: the others
// use the count and the tasks created since, and a stale count is renewed
// in the background.
type quotas struct {
	cfg Quotas
	now func() time.Time

	mu sync.Mutex
	ns map[string]*quotaCount
}

type quotaCount struct {
	count      store.NamespaceCount
	at         time.Time
	added      int64 // tasks created (or being created) since count
	refreshing bool
}

func newQuotas(cfg *Quotas, now func() time.Time) (*quotas, error) {
	if cfg == nil {
		return nil, nil
	}
	if cfg.Counter == nil {
		return nil, fmt.Errorf("quotas: Counter is required (the store's store.NamespaceCounter)")
	}
	if cfg.MaxUnfinished < 0 || cfg.MaxTotal < 0 {
		return nil, fmt.Errorf("quotas: caps must not be negative (0: none), got %d and %d", cfg.MaxUnfinished, cfg.MaxTotal)
	}
	c := *cfg
	if c.Refresh <= 0 {
		c.Refresh = 2 * time.Second
	}
	return &quotas{cfg: c, now: now, ns: map[string]*quotaCount{}}, nil
}

// take reserves a task of namespace ns under the caps: it returns the
// function that gives the reservation back (the submission created
// nothing), or the refusal, a 429 or 403 naming the cap.
func (q *quotas) take(ctx context.Context, ns string) (func(), error) {
	if q == nil || (q.cfg.MaxUnfinished == 0 && q.cfg.MaxTotal == 0) {
		return func() {}, nil
	}
	q.mu.Lock()
	e := q.ns[ns]
	q.mu.Unlock()
	if e == nil {
		// The namespace's first submission since the start counts.
		c, err := q.cfg.Counter.CountNamespace(ctx, ns)
		if err != nil {
			return nil, unavailable("cannot count the namespace's tasks now; try again")
		}
		q.mu.Lock()
		if e = q.ns[ns]; e == nil {
			e = &quotaCount{count: c, at: q.now()}
			q.ns[ns] = e
		}
		q.mu.Unlock()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !e.refreshing && q.now().Sub(e.at) > q.cfg.Refresh {
		e.refreshing = true
		go q.refresh(ns, e, e.added) //nolint:gosec // the count is the namespace's, not this request's: it outlives the request
	}
	unfinished, total := e.count.Unfinished+e.added, e.count.Total+e.added
	if q.cfg.MaxTotal > 0 && total >= q.cfg.MaxTotal {
		return nil, huma.NewError(http.StatusForbidden, fmt.Sprintf(
			"namespace %q keeps %d tasks, its cap (maxTasksPerNamespace) is %d: finished tasks count until retention deletes them; ask the operator for a higher cap or a shorter retention",
			ns, total, q.cfg.MaxTotal))
	}
	if q.cfg.MaxUnfinished > 0 && unfinished >= q.cfg.MaxUnfinished {
		return nil, huma.NewError(http.StatusTooManyRequests, fmt.Sprintf(
			"namespace %q has %d unfinished tasks, its cap (maxUnfinishedTasksPerNamespace) is %d: wait for some to finish, or cancel some, then submit again",
			ns, unfinished, q.cfg.MaxUnfinished))
	}
	e.added++
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			e.added--
			q.mu.Unlock()
		})
	}, nil
}

// refresh counts ns again; the tasks added before the count began are in
// it. A task created while the count runs may be counted twice until the
// next count: a cap may refuse a little early, never let more through.
func (q *quotas) refresh(ns string, e *quotaCount, addedBefore int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := q.cfg.Counter.CountNamespace(ctx, ns)
	q.mu.Lock()
	defer q.mu.Unlock()
	e.refreshing = false
	if err != nil {
		return // the old count and its additions stand; the next take tries again
	}
	e.count, e.at = c, q.now()
	e.added -= addedBefore
}
