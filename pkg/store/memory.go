package store

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

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
	return NewMemoryWithOptions(Options{Clock: clk})
}

// NewMemoryWithOptions is NewMemory with options. The store also implements
// Pager, Logs, Retention and Clusters; its Page filters and sorts every
// record (it is meant for tests and small embeddings, not for a million
// records).
func NewMemoryWithOptions(opts Options) Store {
	return &memory{
		clock:      opts.clock(),
		maxLogSize: opts.maxLogSize(),
		recs:       map[string]Record{},
		epochs:     map[string]int64{},
		logs:       map[string]map[LogKey]*memoryLog{},
		clusters:   map[string]Cluster{},
	}
}

var (
	_ Store     = (*memory)(nil)
	_ Pager     = (*memory)(nil)
	_ Logs      = (*memory)(nil)
	_ Retention = (*memory)(nil)
)

type memory struct {
	clock      clock.PassiveClock
	maxLogSize int64

	mu   sync.RWMutex
	recs map[string]Record
	// epochs holds each executor instance's fencing epoch.
	epochs map[string]int64
	// logs holds each task's logs by task ID.
	logs map[string]map[LogKey]*memoryLog
	// clusters holds the clusters' rows by name (Clusters).
	clusters map[string]Cluster
	closed   bool
}

// memoryLog is one archived log.
type memoryLog struct {
	data []byte
	info LogInfo
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
	if !sameUse(cur.Nonce, rec.Nonce) {
		return Record{}, fmt.Errorf("task record %s update: %w", rec.ID, anotherUse(rec.Version, cur.Nonce, rec.Nonce))
	}
	if rec.Epoch != 0 && m.epochs[rec.Executor] != rec.Epoch {
		return Record{}, fmt.Errorf("task record %s update (epoch %d of %s, current %d): %w",
			rec.ID, rec.Epoch, rec.Executor, m.epochs[rec.Executor], ErrFenced)
	}
	rec = rec.DeepCopy()
	rec.Version = cur.Version + 1
	rec.CreatedAt = cur.CreatedAt
	rec.UpdatedAt = m.clock.Now().Round(0)
	m.recs[rec.ID] = rec
	return rec.DeepCopy(), nil
}

func (m *memory) BeginTerm(ctx context.Context, instance string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("term of %s: %w", instance, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, errClosed
	}
	m.epochs[instance]++
	return m.epochs[instance], nil
}

func (m *memory) Epoch(ctx context.Context, instance string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("epoch of %s: %w", instance, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, errClosed
	}
	return m.epochs[instance], nil
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
		if opts.Cluster != "" && rec.Cluster != opts.Cluster {
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

func (m *memory) Page(ctx context.Context, opts PageOptions) (Page, error) {
	if err := ctx.Err(); err != nil {
		return Page{}, fmt.Errorf("task record page: %w", err)
	}
	q, err := opts.query()
	if err != nil {
		return Page{}, fmt.Errorf("task record page: %w", err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return Page{}, errClosed
	}
	var out []Record
	for _, rec := range m.recs {
		if q.matches(rec) {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b Record) int {
		return comparePageKeys(pageKey{a.CreatedAt.UnixNano(), a.ID}, pageKey{b.CreatedAt.UnixNano(), b.ID})
	})
	out = out[:min(len(out), q.limit+1)]
	for i := range out {
		out[i] = out[i].DeepCopy()
	}
	return q.page(out), nil
}

func (m *memory) AppendLog(ctx context.Context, key LogKey, a LogAppend) (LogInfo, error) {
	offset, data, cursor, complete := a.Offset, a.Data, a.Cursor, a.Complete
	if err := ctx.Err(); err != nil {
		return LogInfo{}, fmt.Errorf("log %s append: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return LogInfo{}, errClosed
	}
	if rec, ok := m.recs[key.TaskID]; !ok || !logOf(rec.Nonce, a.Nonce) {
		return LogInfo{}, fmt.Errorf("log %s append: %w", key, ErrNotFound)
	}
	l := m.logs[key.TaskID][key]
	if l == nil {
		l = &memoryLog{}
	}
	if offset != l.info.Size {
		return l.info.copy(), fmt.Errorf("log %s append at %d (size %d): %w", key, offset, l.info.Size, ErrLogOffset)
	}
	if l.info.Complete && len(data) > 0 {
		return l.info.copy(), fmt.Errorf("log %s append: %w", key, ErrLogComplete)
	}
	kept, truncated, err := clipLog(l.info.Size, l.info.Truncated, m.maxLogSize, data, func() (byte, error) {
		return l.data[len(l.data)-1], nil
	})
	if err != nil {
		return LogInfo{}, fmt.Errorf("log %s append: %w", key, err)
	}
	l.data = append(l.data, kept...)
	l.info = LogInfo{
		Size:      int64(len(l.data)),
		Complete:  l.info.Complete || complete,
		Truncated: truncated,
		Cursor:    bytes.Clone(cursor),
	}
	if m.logs[key.TaskID] == nil {
		m.logs[key.TaskID] = map[LogKey]*memoryLog{}
	}
	m.logs[key.TaskID][key] = l
	return l.info.copy(), nil
}

func (m *memory) ReadLog(ctx context.Context, key LogKey, offset int64, limit int) ([]byte, LogInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, LogInfo{}, fmt.Errorf("log %s: %w", key, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, LogInfo{}, errClosed
	}
	l := m.logs[key.TaskID][key]
	if l == nil {
		return nil, LogInfo{}, fmt.Errorf("log %s: %w", key, ErrNotFound)
	}
	if offset < 0 || offset > l.info.Size {
		return nil, l.info.copy(), fmt.Errorf("log %s read at %d (size %d): %w", key, offset, l.info.Size, ErrLogOffset)
	}
	end := offset + min(int64(max(limit, 0)), l.info.Size-offset)
	return bytes.Clone(l.data[offset:end:end]), l.info.copy(), nil
}

func (m *memory) LogKeys(ctx context.Context, taskID string) ([]LogKey, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("logs of task %s: %w", taskID, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed
	}
	keys := slices.Collect(maps.Keys(m.logs[taskID]))
	slices.SortFunc(keys, compareLogKeys)
	return keys, nil
}

func (m *memory) DeleteFinishedBefore(ctx context.Context, t time.Time, batch int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("task retention: %w", err)
	}
	if batch <= 0 {
		return 0, fmt.Errorf("task retention: batch %d is not positive", batch)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, errClosed
	}
	var old []Record
	for _, rec := range m.recs {
		if rec.Terminal && rec.UpdatedAt.Before(t) {
			old = append(old, rec)
		}
	}
	slices.SortFunc(old, func(a, b Record) int {
		if c := a.UpdatedAt.Compare(b.UpdatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	old = old[:min(len(old), batch)]
	for _, rec := range old {
		delete(m.recs, rec.ID)
		delete(m.logs, rec.ID)
	}
	return len(old), nil
}

// Close makes every later call fail; the records and logs are dropped.
func (m *memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.recs = nil
	m.logs = nil
	m.clusters = nil
	return nil
}
