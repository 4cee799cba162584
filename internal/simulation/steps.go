package simulation

import (
	"context"
	"errors"
	"hash/fnv"
	"runtime"
	"sort"
	"sync"
	"time"
)

// errShutdown answers every step once the run is over.
var errShutdown = errors.New("simulation: the run is over")

// step is one simulated I/O call waiting for the world to let it happen: an
// API request arriving, its answer coming back, a store call, a watch event
// delivered. Its goroutine is blocked until release.
type step struct {
	actor   string // the process (or "user", "world") whose step it is
	key     string // what it is, stable across runs of one seed
	caller  uint64 // who asks: a hash of the caller's functions (callerOf)
	seq     int64  // registration order, the last tie-break
	release chan error
}

// steps holds the pending steps. Every simulated call registers one and
// blocks; the world picks which goes next.
type steps struct {
	mu      sync.Mutex
	pending []*step
	seq     int64
	closed  bool
}

// wait registers a step and blocks until the world releases it (nil: go on;
// an error: the injected fault) or ctx ends.
func (s *steps) wait(ctx context.Context, actor, key string) error {
	caller := callerOf()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errShutdown
	}
	s.seq++
	st := &step{actor: actor, key: key, caller: caller, seq: s.seq, release: make(chan error, 1)}
	s.pending = append(s.pending, st)
	s.mu.Unlock()
	if ctx == nil {
		return <-st.release
	}
	select {
	case err := <-st.release:
		return err
	case <-ctx.Done():
		s.mu.Lock()
		for i, p := range s.pending {
			if p == st {
				s.pending = append(s.pending[:i], s.pending[i+1:]...)
				break
			}
		}
		s.mu.Unlock()
		select {
		case err := <-st.release: // released at the same moment: the release wins
			return err
		default:
		}
		return ctx.Err()
	}
}

// snapshot returns the pending steps in a stable order: by key, then by
// caller, then by registration. Two goroutines of a process that register
// steps of one key in one round (a replica freeing a shard's Lease while
// the shard's executor renews it) do so in the order the Go scheduler ran
// them, which is not always the same: the callers' functions tell them
// apart (seed 7147 gave one of two histories before, about one run in
// three).
func (s *steps) snapshot() []*step {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]*step(nil), s.pending...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].key != out[j].key {
			return out[i].key < out[j].key
		}
		if out[i].caller != out[j].caller {
			return out[i].caller < out[j].caller
		}
		return out[i].seq < out[j].seq
	})
	return out
}

// callerOf hashes the names of the functions on the calling goroutine's
// stack: stable across runs and builds (unlike program counters and
// goroutine IDs), it tells apart two goroutines that ask the same thing
// from different code. The names' hash is cached by the stack's program
// counters.
func callerOf() uint64 {
	var pcs [48]uintptr
	n := runtime.Callers(3, pcs[:])
	var k uint64 = 14695981039346656037
	for _, pc := range pcs[:n] {
		k = (k ^ uint64(pc)) * 1099511628211
	}
	if v, ok := callers.Load(k); ok {
		return v.(uint64)
	}
	h := fnv.New64a()
	for _, pc := range pcs[:n] {
		name := "?"
		if f := runtime.FuncForPC(pc - 1); f != nil {
			name = f.Name()
		}
		h.Write([]byte(name))
	}
	callers.Store(k, h.Sum64())
	return h.Sum64()
}

// callers caches callerOf's hash by the hash of a stack's program counters.
var callers sync.Map

// take removes st from the pending steps and lets it go with err.
func (s *steps) take(st *step, err error) {
	s.mu.Lock()
	for i, p := range s.pending {
		if p == st {
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	st.release <- err
}

// close ends the run: every pending and future step returns errShutdown.
func (s *steps) close() {
	s.mu.Lock()
	s.closed = true
	p := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, st := range p {
		st.release <- errShutdown
	}
}

// since formats a simulated instant as the time since the run's start.
func since(start, t time.Time) string {
	return t.Sub(start).Truncate(time.Millisecond).String()
}
