package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"k8s.io/utils/clock"
)

// NewMemory returns a Store that keeps records in memory, for embedding and
// tests. Nothing survives the process. It is safe for concurrent use; every
// record it accepts or returns is a deep copy, so neither side can change the
// other's data through a shared slice or pointer.
func NewMemory() Store {
	return NewMemoryWithClock(clock.RealClock{})
}

// NewMemoryWithClock is NewMemory with the clock that sets CreatedAt and
// UpdatedAt, so tests can control them.
func NewMemoryWithClock(clk clock.PassiveClock) Store {
	return &memory{clock: clk, recs: map[string]Record{}}
}

var _ Store = (*memory)(nil)

type memory struct {
	clock clock.PassiveClock

	mu     sync.RWMutex
	recs   map[string]Record
	closed bool
}

// errClosed is returned by every method of a closed store except Close.
var errClosed = fmt.Errorf("task store closed")

func (m *memory) Create(ctx context.Context, rec Record) (Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, false, fmt.Errorf("task record create: %w", err)
	}
	if rec.ID == "" {
		return Record{}, false, fmt.Errorf("task record create: empty ID")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Record{}, false, errClosed
	}
	if cur, ok := m.recs[rec.ID]; ok {
		return cur.DeepCopy(), false, nil
	}
	now := m.clock.Now().Round(0)
	rec = rec.DeepCopy()
	rec.Version = 1
	rec.CreatedAt, rec.UpdatedAt = now, now
	m.recs[rec.ID] = rec
	return rec.DeepCopy(), true, nil
}

func (m *memory) Get(ctx context.Context, id string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, fmt.Errorf("task record %s: %w", id, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return Record{}, errClosed
	}
	rec, ok := m.recs[id]
	if !ok {
		return Record{}, fmt.Errorf("task record %s: %w", id, ErrNotFound)
	}
	return rec.DeepCopy(), nil
}

func (m *memory) Update(ctx context.Context, rec Record) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, fmt.Errorf("task record %s update: %w", rec.ID, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Record{}, errClosed
	}
	cur, ok := m.recs[rec.ID]
	if !ok {
		return Record{}, fmt.Errorf("task record %s update: %w", rec.ID, ErrNotFound)
	}
	if cur.Version != rec.Version {
		return Record{}, fmt.Errorf("task record %s update (version %d, stored %d): %w",
			rec.ID, rec.Version, cur.Version, ErrConflict)
	}
	rec = rec.DeepCopy()
	rec.Version = cur.Version + 1
	rec.CreatedAt = cur.CreatedAt
	rec.UpdatedAt = m.clock.Now().Round(0)
	m.recs[rec.ID] = rec
	return rec.DeepCopy(), nil
}

func (m *memory) List(ctx context.Context, opts ListOptions) ([]Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("task record list: %w", err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed
	}
	var out []Record
	for _, rec := range m.recs {
		if opts.Executor != "" && rec.Executor != opts.Executor {
			continue
		}
		if opts.NonTerminal && rec.Terminal {
			continue
		}
		out = append(out, rec.DeepCopy())
	}
	slices.SortFunc(out, func(a, b Record) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Close makes every later call fail; the records are dropped.
func (m *memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.recs = nil
	return nil
}
