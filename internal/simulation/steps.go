package simulation

import (
	"context"
	"errors"
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
	seq     int64  // registration order, the tie-break of equal keys
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
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errShutdown
	}
	s.seq++
	st := &step{actor: actor, key: key, seq: s.seq, release: make(chan error, 1)}
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
// registration.
func (s *steps) snapshot() []*step {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]*step(nil), s.pending...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].key != out[j].key {
			return out[i].key < out[j].key
		}
		return out[i].seq < out[j].seq
	})
	return out
}

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
