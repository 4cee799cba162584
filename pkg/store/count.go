package store

import (
	"context"
	"fmt"
)

// NamespaceCount is how many tasks a namespace holds: Unfinished (not
// terminal: waiting or running) and Total (finished ones too, until
// retention deletes them).
type NamespaceCount struct {
	Unfinished, Total int64
}

// NamespaceCounter is implemented by the stores that count a namespace's
// tasks (memory, SQLite, PostgreSQL), for per-namespace quotas. The count
// reads the namespace's rows (an index of namespace), so callers should
// cache it rather than count at every submission.
type NamespaceCounter interface {
	CountNamespace(ctx context.Context, namespace string) (NamespaceCount, error)
}

var (
	_ NamespaceCounter = (*memory)(nil)
	_ NamespaceCounter = (*sqliteStore)(nil)
	_ NamespaceCounter = (*postgresStore)(nil)
)

// CountNamespace counts the namespace's records.
func (m *memory) CountNamespace(_ context.Context, namespace string) (NamespaceCount, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var c NamespaceCount
	for _, r := range m.recs {
		if r.Namespace != namespace {
			continue
		}
		c.Total++
		if !r.Terminal {
			c.Unfinished++
		}
	}
	return c, nil
}

// CountNamespace counts the namespace's rows (index tasks_by_namespace).
func (s *sqliteStore) CountNamespace(ctx context.Context, namespace string) (NamespaceCount, error) {
	var c NamespaceCount
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(terminal = 0), 0) FROM tasks WHERE namespace = ?`, namespace).Scan(&c.Total, &c.Unfinished)
	if err != nil {
		return NamespaceCount{}, fmt.Errorf("counting the tasks of namespace %s: %w", namespace, err)
	}
	return c, nil
}

// CountNamespace counts the namespace's rows.
func (s *postgresStore) CountNamespace(ctx context.Context, namespace string) (_ NamespaceCount, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	defer func() { err = timedOut(ctx, err) }()
	var c NamespaceCount
	err = s.pool.QueryRow(ctx, `SELECT COUNT(*), COUNT(*) FILTER (WHERE NOT terminal) FROM tasks WHERE namespace = $1`, namespace).Scan(&c.Total, &c.Unfinished)
	if err != nil {
		return NamespaceCount{}, fmt.Errorf("counting the tasks of namespace %s: %w", namespace, err)
	}
	return c, nil
}
