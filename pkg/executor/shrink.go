package executor

// fifo is the executor's work queue's storage (workqueue.Queue): client-go's
// DefaultQueue, a slice it pops from the front, keeps the array of its
// longest line until appends outgrow it, and a burst of thousands of pod
// events leaves tens of KB behind for good. fifo lets go of its array when
// its line empties, so a burst's room is freed once the burst is worked off.
type fifo[T comparable] struct {
	items []T
}

func (q *fifo[T]) Touch(T) {}

func (q *fifo[T]) Push(item T) { q.items = append(q.items, item) }

func (q *fifo[T]) Len() int { return len(q.items) }

func (q *fifo[T]) Pop() T {
	item := q.items[0]
	if len(q.items) == 1 {
		q.items = nil
		return item
	}
	var zero T
	q.items[0] = zero // the array still holds it otherwise
	q.items = q.items[1:]
	return item
}

// emptied returns m, or a new empty map when m is empty: a Go map keeps the
// room of the most entries it ever held, so a map of passing entries (pod
// creations not seen yet, clean-up calls, waiters) that a burst filled
// would keep that burst's room for good. Call it after deleting from such
// a map.
func emptied[K comparable, V any](m map[K]V) map[K]V {
	if len(m) == 0 {
		return map[K]V{}
	}
	return m
}
