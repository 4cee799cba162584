package server

import (
	"container/list"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
)

// ring keeps the most recent events, numbered from 1 in the order they were
// published, for watches to read and resume from. A cursor names a position
// (the number of the last event read) and the ring's epoch, which is new in
// every process: a cursor from another process, or one older than the oldest
// kept event, has expired.
type ring struct {
	epoch string
	size  int

	mu     sync.Mutex
	buf    []ringEntry
	last   uint64        // number of the newest event; 0 before the first
	notify chan struct{} // closed and replaced at every append
	// starts holds, for each task ID whose Submitted event is kept, the
	// number of the newest one: where its current record's events begin
	// (an ID names another record after retention deleted the first).
	starts map[string]uint64
}

type ringEntry struct {
	num    uint64 // the event's number
	ev     api.Event
	labels map[string]string
}

func newRing(size int) *ring {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("reading random bytes: " + err.Error())
	}
	var epoch [8]byte
	v := uint64(b[0])<<32 | uint64(b[1])<<24 | uint64(b[2])<<16 | uint64(b[3])<<8 | uint64(b[4])
	for i := 7; i >= 0; i-- {
		epoch[i] = crockford[v&31]
		v >>= 5
	}
	return &ring{epoch: string(epoch[:]), size: size, buf: make([]ringEntry, 0, min(size, 1024)), notify: make(chan struct{}), starts: map[string]uint64{}}
}

func (r *ring) cursor(n uint64) string { return r.epoch + "-" + strconv.FormatUint(n, 10) }

// first is the number of the oldest kept event (last+1 when none is kept).
func (r *ring) first() uint64 {
	return r.last - uint64(len(r.buf)) + 1
}

// append numbers ev, sets its cursor, keeps it (dropping the oldest when
// full) and wakes the readers.
func (r *ring) append(ev api.Event, labels map[string]string) {
	r.mu.Lock()
	r.last++
	ev.Cursor = r.cursor(r.last)
	e := ringEntry{num: r.last, ev: ev, labels: labels}
	if len(r.buf) < r.size {
		r.buf = append(r.buf, e)
	} else {
		i := (r.last - 1) % uint64(r.size) //nolint:gosec // size is positive
		if old := &r.buf[i]; old.ev.Type == string(executor.EventSubmitted) && r.starts[old.ev.TaskID] == old.num {
			delete(r.starts, old.ev.TaskID)
		}
		r.buf[i] = e
	}
	if ev.Type == string(executor.EventSubmitted) && ev.TaskID != "" {
		r.starts[ev.TaskID] = r.last
	}
	close(r.notify)
	r.notify = make(chan struct{})
	r.mu.Unlock()
}

// recordStart is the number of the newest kept Submitted event of task id
// (the first event of its current record), 0 when none is kept: then the
// record began before the oldest kept event, or its Submitted event never
// reached this server (another replica's, lost: PublishMissed).
func (r *ring) recordStart(id string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts[id]
}

// head is the number of the newest event.
func (r *ring) head() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// headCursor is the cursor of the newest event: a watch from it gets every
// later one.
func (r *ring) headCursor() string { return r.cursor(r.head()) }

// since returns up to limit events after number after, oldest first, and the
// channel closed by the next append. ok is false when events after after are
// no longer kept (or after is in the future): the reader missed some.
func (r *ring) since(after uint64, limit int) (out []ringEntry, ok bool, wait <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if after > r.last || after+1 < r.first() {
		return nil, false, r.notify
	}
	for n := after + 1; n <= r.last && len(out) < limit; n++ {
		out = append(out, r.buf[(n-1)%uint64(r.size)]) //nolint:gosec // size is positive
	}
	return out, true, r.notify
}

// errBadCursor reports a cursor this server did not make.
type errBadCursor struct{ cursor string }

func (e errBadCursor) Error() string {
	return fmt.Sprintf("malformed cursor %q: use the id of an event this API sent (epoch-number)", e.cursor)
}

// resume returns the position a watch from cursor starts after: the head
// for no cursor, the cursor's number when its events are kept, and the head
// with expired set when they are not (another epoch, too old, or from the
// future).
func (r *ring) resume(cursor string) (pos uint64, expired bool, err error) {
	if cursor == "" {
		return r.head(), false, nil
	}
	epoch, num, ok := strings.Cut(cursor, "-")
	n, perr := strconv.ParseUint(num, 10, 64)
	if !ok || perr != nil || epoch == "" {
		return 0, false, errBadCursor{cursor}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if epoch != r.epoch || n > r.last || n+1 < r.first() {
		return r.last, true, nil
	}
	return n, false, nil
}

// taskMeta is what a watch filters events on that the executor's events do
// not carry.
type taskMeta struct {
	namespace, name string
	labels          map[string]string
}

// fits reports whether m may describe the task of ev: not for ev's record's
// first event (Submitted), which may be a new record with an ID used before,
// nor for an event whose pod is in another namespace.
func (m taskMeta) fits(ev executor.Event) bool {
	if ev.Type == executor.EventSubmitted {
		return false
	}
	ns, _, hasPod := strings.Cut(ev.Pod, "/")
	return !hasPod || ns == m.namespace
}

// metaCache keeps the metadata of recently seen tasks (least recently used
// out), so that publishing an event rarely reads the store.
type metaCache struct {
	max int

	mu    sync.Mutex
	items map[string]*list.Element
	order *list.List // front: most recently used
}

type metaItem struct {
	id   string
	meta taskMeta
}

func newMetaCache(size int) *metaCache {
	return &metaCache{max: size, items: map[string]*list.Element{}, order: list.New()}
}

func (c *metaCache) get(id string) (taskMeta, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[id]
	if !ok {
		return taskMeta{}, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*metaItem).meta, true
}

// clear forgets every entry.
func (c *metaCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.items)
	c.order.Init()
}

func (c *metaCache) put(id string, m taskMeta) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[id]; ok {
		el.Value.(*metaItem).meta = m
		c.order.MoveToFront(el)
		return
	}
	c.items[id] = c.order.PushFront(&metaItem{id: id, meta: m})
	for c.order.Len() > c.max {
		el := c.order.Back()
		c.order.Remove(el)
		delete(c.items, el.Value.(*metaItem).id)
	}
}
