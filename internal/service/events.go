package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"sync/atomic"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
)

// sharedEvent is an executor event as the replicas of a group pass it to
// each other, with the process it comes from, so that none publishes its
// own twice. Missed (and no event) says that the origin dropped events it
// could not send: the receivers' watches report Expired and list again.
type sharedEvent struct {
	Origin string          `json:"o"`
	Event  *executor.Event `json:"e,omitempty"`
	Missed bool            `json:"m,omitempty"`
}

// eventSharer passes this process's executor events to the other replicas
// of its group and theirs to this process's watches. Delivery through the
// store is at most once; every loss it can know of (a send that failed, a
// full queue, a listening connection lost) becomes an Expired on the watches
// that may have missed something, so that a watcher relists instead of
// waiting for ever.
type eventSharer struct {
	bus     store.Broadcaster
	srv     func() publisher // nil until the server is up
	log     *slog.Logger
	origin  string
	queue   chan executor.Event
	dropped atomic.Bool // an event was not sent: tell the others
}

// publisher is where the others' events go: the server's watches.
type publisher interface {
	Publish(executor.Event)
	PublishMissed(reason string)
}

var _ publisher = (*server.Server)(nil)

func newEventSharer(bus store.Broadcaster, srv func() publisher, log *slog.Logger) *eventSharer {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &eventSharer{bus: bus, srv: srv, log: log, origin: hex.EncodeToString(b), queue: make(chan executor.Event, 4096)}
}

// offer queues ev for the other replicas; it never blocks the executor.
func (e *eventSharer) offer(ev executor.Event) {
	select {
	case e.queue <- ev:
	default:
		e.dropped.Store(true)
	}
}

// run sends the queued events and publishes the others' until ctx ends.
func (e *eventSharer) run(ctx context.Context) {
	go func() {
		_ = e.bus.WatchBroadcasts(ctx, e.receive, func() {
			if s := e.srv(); s != nil {
				s.PublishMissed("the connection to the other replicas was lost")
			}
		})
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-e.queue:
			e.send(ctx, ev)
		}
	}
}

func (e *eventSharer) send(ctx context.Context, ev executor.Event) {
	if e.dropped.Swap(false) {
		if !e.broadcast(ctx, sharedEvent{Origin: e.origin, Missed: true}) {
			e.dropped.Store(true)
		}
	}
	if !e.broadcast(ctx, sharedEvent{Origin: e.origin, Event: &ev}) {
		e.dropped.Store(true)
	}
}

// broadcast sends se, shrunk to fit when it is too large, and reports
// whether it was sent.
func (e *eventSharer) broadcast(ctx context.Context, se sharedEvent) bool {
	msg, err := encodeShared(se)
	if err == nil {
		err = e.bus.Broadcast(ctx, msg)
	}
	if err != nil && ctx.Err() == nil {
		e.log.Warn("could not share an event with the other replicas; their watches will list again", "err", err)
	}
	return err == nil
}

func (e *eventSharer) receive(msg []byte) {
	var se sharedEvent
	if err := json.Unmarshal(msg, &se); err != nil || se.Origin == e.origin {
		return
	}
	s := e.srv()
	switch {
	case s == nil:
	case se.Missed:
		s.PublishMissed("another replica could not share some of its events")
	case se.Event != nil && se.Event.ID != "":
		s.Publish(*se.Event)
	}
}

// encodeShared encodes se; an event too large for a broadcast travels
// without its result, its task's metadata and with a shortened message (a
// watcher that wants them reads the task).
func encodeShared(se sharedEvent) ([]byte, error) {
	msg, err := json.Marshal(se)
	if err == nil && len(msg) > store.MaxBroadcast && se.Event != nil {
		ev := *se.Event
		// Without its task's metadata a Submitted event makes the
		// receiver read the record.
		ev.Result, ev.Message, ev.Task = nil, truncate(ev.Message, 1024), nil
		se.Event = &ev
		msg, err = json.Marshal(se)
	}
	return msg, err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
