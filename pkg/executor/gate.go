package executor

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// gate lets workers and creators act only while the executor holds its
// instance Lease. Closing it waits until no one is inside, so that once a
// term ends nothing of it still acts on pods.
type gate struct {
	clock    clock.PassiveClock
	mu       sync.Mutex
	cond     *sync.Cond
	isOpen   bool
	stopped  bool
	inside   int
	openCh   chan struct{} // closed while open
	closedAt time.Time
}

func newGate(clk clock.PassiveClock) *gate {
	g := &gate{clock: clk, openCh: make(chan struct{}), closedAt: clk.Now()}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// wait blocks until the gate is open; false when ctx ended or the gate stopped.
func (g *gate) wait(ctx context.Context) bool {
	g.mu.Lock()
	ch, stopped := g.openCh, g.stopped
	g.mu.Unlock()
	if stopped {
		return false
	}
	select {
	case <-ch:
		g.mu.Lock()
		defer g.mu.Unlock()
		return !g.stopped
	case <-ctx.Done():
		return false
	}
}

// enter reports whether the gate is open and, if so, counts the caller in.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.isOpen {
		return false
	}
	g.inside++
	return true
}

func (g *gate) leave() {
	g.mu.Lock()
	g.inside--
	g.cond.Broadcast()
	g.mu.Unlock()
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.isOpen {
		g.isOpen = true
		g.closedAt = time.Time{}
		close(g.openCh)
	}
}

// close closes the gate and waits until nobody is inside.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.isOpen {
		g.isOpen = false
		g.closedAt = g.clock.Now()
		g.openCh = make(chan struct{})
	}
	for g.inside > 0 {
		g.cond.Wait()
	}
}

// stop releases everyone waiting for good.
func (g *gate) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	g.stopped = true
	if !g.isOpen {
		close(g.openCh)
	}
}

// closedSince is when the gate closed; zero while it is open.
func (g *gate) closedSince() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closedAt
}
