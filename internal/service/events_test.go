package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
)

// TestEncodeShared: an event travels whole when it fits a broadcast, and
// without its result and its task's metadata (and with a shortened message)
// when it does not.
func TestEncodeShared(t *testing.T) {
	meta := &executor.TaskMeta{Namespace: "team-a", Name: "a", Labels: map[string]string{"team": "data"}}
	many := map[string]string{}
	for i := range 200 {
		many[fmt.Sprintf("label-%03d", i)] = strings.Repeat("v", 60)
	}
	for name, tc := range map[string]struct {
		ev                   executor.Event
		keepResult, keepTask bool
	}{
		"small":                    {executor.Event{ID: "t", Type: executor.EventAttemptFinished, Result: []byte("42"), Terminal: true}, true, false},
		"large result":             {executor.Event{ID: "t", Type: executor.EventAttemptFinished, Result: []byte(strings.Repeat("r", 9000)), Terminal: true}, false, false},
		"large result and message": {executor.Event{ID: "t", Message: strings.Repeat("m", 9000), Result: []byte(strings.Repeat("r", 4000))}, false, false},
		"submitted":                {executor.Event{ID: "t", Type: executor.EventSubmitted, Task: meta}, false, true},
		"submitted, many labels":   {executor.Event{ID: "t", Type: executor.EventSubmitted, Task: &executor.TaskMeta{Namespace: "team-a", Name: "a", Labels: many}}, false, false},
	} {
		t.Run(name, func(t *testing.T) {
			msg, err := encodeShared(sharedEvent{Origin: "me", Event: &tc.ev})
			if err != nil {
				t.Fatal(err)
			}
			if len(msg) > store.MaxBroadcast {
				t.Fatalf("%d bytes, over %d", len(msg), store.MaxBroadcast)
			}
			var se sharedEvent
			if err := json.Unmarshal(msg, &se); err != nil {
				t.Fatal(err)
			}
			if se.Origin != "me" || se.Event == nil || se.Event.ID != "t" || se.Event.Terminal != tc.ev.Terminal {
				t.Fatalf("decoded %+v", se)
			}
			if got := se.Event.Result != nil; got != tc.keepResult {
				t.Errorf("result kept = %v, want %v", got, tc.keepResult)
			}
			if got := se.Event.Task != nil; got != tc.keepTask {
				t.Errorf("task's metadata kept = %v, want %v", got, tc.keepTask)
			}
			if tc.keepTask && !cmp.Equal(se.Event.Task, tc.ev.Task) {
				t.Errorf("task's metadata %+v, want %+v", se.Event.Task, tc.ev.Task)
			}
		})
	}
}

// fakeBus records broadcasts and fails them while fail is set.
type fakeBus struct {
	mu   sync.Mutex
	sent []sharedEvent
	fail bool
}

func (b *fakeBus) Broadcast(_ context.Context, msg []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail {
		return errors.New("connection refused")
	}
	var se sharedEvent
	if err := json.Unmarshal(msg, &se); err != nil {
		return err
	}
	b.sent = append(b.sent, se)
	return nil
}

func (b *fakeBus) WatchBroadcasts(ctx context.Context, _ func([]byte), _ func()) error {
	<-ctx.Done()
	return ctx.Err()
}

// fakePublisher records what reaches the watches.
type fakePublisher struct{ got []string }

func (p *fakePublisher) Publish(ev executor.Event) { p.got = append(p.got, "event "+ev.ID) }
func (p *fakePublisher) PublishMissed(string)      { p.got = append(p.got, "missed") }

// TestEventSharerSend: every event is sent; one that could not be sent (the
// store down, the queue full) is followed, at the next send, by a Missed
// marker ahead of the next event, so that the other replicas' watches list
// again instead of waiting for an outcome that never comes.
func TestEventSharerSend(t *testing.T) {
	bus := &fakeBus{}
	e := newEventSharer(bus, func() publisher { return nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	kinds := func() []string {
		var out []string
		for _, se := range bus.sent {
			switch {
			case se.Missed:
				out = append(out, "missed")
			case se.Event != nil:
				out = append(out, "event "+se.Event.ID)
			}
			if se.Origin != e.origin {
				t.Errorf("sent with origin %q, want %q", se.Origin, e.origin)
			}
		}
		return out
	}
	e.send(ctx, executor.Event{ID: "a"})
	bus.fail = true
	e.send(ctx, executor.Event{ID: "lost"})
	bus.fail = false
	e.send(ctx, executor.Event{ID: "b"})
	e.send(ctx, executor.Event{ID: "c"})
	for range cap(e.queue) + 1 {
		e.offer(executor.Event{ID: "queued"})
	}
	<-e.queue // one sent from a full queue: the one over it was dropped
	e.send(ctx, executor.Event{ID: "d"})
	want := []string{"event a", "missed", "event b", "event c", "missed", "event d"}
	if diff := cmp.Diff(want, kinds()); diff != "" {
		t.Errorf("sent (-want +got):\n%s", diff)
	}
}

// TestEventSharerReceive: the others' events and their Missed markers reach
// the watches; this process's own (heard back from the store) and messages
// that are not events do not; nothing is published before the server is up.
func TestEventSharerReceive(t *testing.T) {
	p := &fakePublisher{}
	var srv publisher
	e := newEventSharer(&fakeBus{}, func() publisher { return srv }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	msg := func(se sharedEvent) []byte {
		b, err := json.Marshal(se)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	e.receive(msg(sharedEvent{Origin: "other", Event: &executor.Event{ID: "early"}}))
	srv = p
	for _, m := range [][]byte{
		msg(sharedEvent{Origin: "other", Event: &executor.Event{ID: "x"}}),
		msg(sharedEvent{Origin: e.origin, Event: &executor.Event{ID: "own"}}),
		msg(sharedEvent{Origin: "other", Missed: true}),
		msg(sharedEvent{Origin: "other", Event: &executor.Event{}}),
		msg(sharedEvent{Origin: "other"}),
		[]byte("not json"),
		msg(sharedEvent{Origin: "other", Event: &executor.Event{ID: "y"}}),
	} {
		e.receive(m)
	}
	if diff := cmp.Diff([]string{"event x", "missed", "event y"}, p.got); diff != "" {
		t.Errorf("published (-want +got):\n%s", diff)
	}
}
