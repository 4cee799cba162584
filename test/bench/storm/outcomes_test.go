package storm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/task"
)

// outcomes collects the terminal AttemptFinished events of every executor
// of a run (it is their Config.OnEvent).
type outcomes struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced at every terminal event
	by      map[string][]executor.Event
}

func newOutcomes() *outcomes {
	return &outcomes{changed: make(chan struct{}), by: map[string][]executor.Event{}}
}

// Add is an executor.Config.OnEvent.
func (o *outcomes) Add(ev executor.Event) {
	if !ev.Terminal {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.by[ev.ID] = append(o.by[ev.ID], ev)
	close(o.changed)
	o.changed = make(chan struct{})
}

// Of returns the terminal events of id.
func (o *outcomes) Of(id string) []executor.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]executor.Event(nil), o.by[id]...)
}

// RecordedAt is when the first terminal outcome of id was recorded.
func (o *outcomes) RecordedAt(id string) (time.Time, bool) {
	evs := o.Of(id)
	if len(evs) == 0 {
		return time.Time{}, false
	}
	return evs[0].Time, true
}

// Wait waits until every id has a terminal event, or ctx ends.
func (o *outcomes) Wait(ctx context.Context, ids []string) error {
	missing, err := waitUntil(ctx, &o.mu, &o.changed, func() int {
		n := 0
		for _, id := range ids {
			if len(o.by[id]) == 0 {
				n++
			}
		}
		return n
	})
	if err != nil {
		return fmt.Errorf("%d of %d tasks without an outcome: %w", missing, len(ids), err)
	}
	return nil
}

// waitUntil evaluates missing with mu held until it returns 0, waiting
// between evaluations for *changed, a channel the holder of mu closes and
// replaces at every change. It returns missing's last count, and ctx's
// cause if ctx ends first.
func waitUntil(ctx context.Context, mu *sync.Mutex, changed *chan struct{}, missing func() int) (int, error) {
	for {
		mu.Lock()
		n, ch := missing(), *changed
		mu.Unlock()
		if n == 0 {
			return 0, nil
		}
		select {
		case <-ctx.Done():
			return n, context.Cause(ctx)
		case <-ch:
		}
	}
}

// deliveries notes, for each task, when the executor's pod cache first held
// its pod with the main container terminated (its Config.OnPodChange): what
// the executor could act on, as against when it recorded the outcome.
type deliveries struct {
	container string
	ex        atomic.Pointer[executor.Executor]

	mu sync.Mutex
	at map[string]time.Time
}

func newDeliveries(container string) *deliveries {
	return &deliveries{container: container, at: map[string]time.Time{}}
}

// OnPodChange is an executor.Config.OnPodChange.
func (d *deliveries) OnPodChange(namespace, name string) {
	now := time.Now()
	ex := d.ex.Load()
	if ex == nil {
		return
	}
	p := ex.CachedPod(namespace, name)
	if p == nil {
		return
	}
	id := p.Labels[task.LabelRun]
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == d.container && cs.State.Terminated != nil {
			d.mu.Lock()
			if _, ok := d.at[id]; !ok && id != "" {
				d.at[id] = now
			}
			d.mu.Unlock()
		}
	}
}

// DeliveredAt is when the executor's cache first showed task id's main
// container terminated.
func (d *deliveries) DeliveredAt(id string) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	at, ok := d.at[id]
	return at, ok
}
