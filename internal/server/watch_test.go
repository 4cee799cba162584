package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
)

// sseStream is a test's open watch.
type sseStream struct {
	t      *testing.T
	resp   *http.Response
	r      *bufio.Reader
	cancel context.CancelFunc
	// comments counts the comment lines read (heartbeats).
	comments int
}

func (h *harness) watch(path string, hdr ...string) *sseStream {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.ts.URL+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		h.t.Fatalf("watch %s: %s %s", path, resp.Status, resp.Header.Get("Content-Type"))
	}
	s := &sseStream{t: h.t, resp: resp, r: bufio.NewReader(resp.Body), cancel: cancel}
	h.t.Cleanup(s.close)
	return s
}

func (s *sseStream) close() {
	s.cancel()
	s.resp.Body.Close()
}

// next reads the next event (skipping comments), failing after a while.
func (s *sseStream) next() api.Event {
	s.t.Helper()
	type result struct {
		ev  api.Event
		err error
	}
	done := make(chan result, 1)
	go func() {
		var id, name, data string
		for {
			line, err := s.r.ReadString('\n')
			if err != nil {
				done <- result{err: err}
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case line == "":
				if data == "" {
					continue
				}
				var ev api.Event
				err := json.Unmarshal([]byte(data), &ev)
				if err == nil && (ev.Cursor != id || ev.Type != name) {
					err = fmt.Errorf("id %q and event %q do not match the data %s", id, name, data)
				}
				done <- result{ev, err}
				return
			case strings.HasPrefix(line, ":"):
				s.comments++
			case strings.HasPrefix(line, "id: "):
				id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = strings.TrimPrefix(line, "data: ")
			default:
				done <- result{err: fmt.Errorf("unexpected line %q", line)}
				return
			}
		}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			s.t.Fatalf("reading the stream: %v", r.err)
		}
		return r.ev
	case <-time.After(10 * time.Second):
		s.t.Fatal("no event within 10s")
	}
	return api.Event{}
}

// publish sends a State event of task id with message msg.
func (h *harness) publish(id, msg string) {
	h.srv.Publish(executor.Event{ID: id, Type: executor.EventState, Phase: "Running", Reason: "Running", Message: msg, Time: time.Now()})
}

func TestWatchResumesWithoutLossOrDuplicate(t *testing.T) {
	h := newHarness(t, nil)
	tk := h.mustSubmit("default", taskDoc("hello"))

	w := h.watch(api.Prefix + "/watch")
	if ev := w.next(); ev.Type != api.EventBookmark || ev.Cursor == "" {
		t.Fatalf("first event %+v, want a bookmark", ev)
	}
	for i := range 5 {
		h.publish(tk.ID, fmt.Sprint("m", i))
	}
	var last api.Event
	for i := range 2 {
		last = w.next()
		if last.Message != fmt.Sprint("m", i) || last.TaskID != tk.ID || last.Namespace != "default" || last.Name != "hello" {
			t.Fatalf("event %d: %+v", i, last)
		}
	}
	w.close() // disconnect mid-stream
	for i := 5; i < 8; i++ {
		h.publish(tk.ID, fmt.Sprint("m", i))
	}
	// Reconnect with Last-Event-ID: m2 to m7, once each, in order.
	w = h.watch(api.Prefix+"/watch?cursor=ignored-0", "Last-Event-ID", last.Cursor)
	if ev := w.next(); ev.Type != api.EventBookmark || ev.Cursor != last.Cursor {
		t.Fatalf("resumed stream starts with %+v, want a bookmark at %s", ev, last.Cursor)
	}
	for i := 2; i < 8; i++ {
		if ev := w.next(); ev.Message != fmt.Sprint("m", i) {
			t.Fatalf("resumed event %+v, want m%d", ev, i)
		}
	}
	// The same with ?cursor=.
	w2 := h.watch(api.Prefix + "/watch?cursor=" + last.Cursor)
	w2.next()
	if ev := w2.next(); ev.Message != "m2" {
		t.Fatalf("resumed by query: %+v", ev)
	}
}

func TestWatchFromAnExpiredCursorSaysSoAndGoesOn(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.EventBuffer = 3 })
	tk := h.mustSubmit("default", taskDoc("hello")) // event 1: Submitted
	w := h.watch(api.Prefix + "/watch")
	start := w.next()
	h.publish(tk.ID, "m0")
	old := w.next()
	w.close()
	for i := 1; i < 6; i++ {
		h.publish(tk.ID, fmt.Sprint("m", i))
	}
	for name, cursor := range map[string]string{
		"older than the ring":   old.Cursor,
		"from another process":  "zzzzzzzz-1",
		"from the future":       strings.Split(start.Cursor, "-")[0] + "-99",
		"before the first kept": start.Cursor,
	} {
		t.Run(name, func(t *testing.T) {
			w := h.watch(api.Prefix+"/watch", "Last-Event-ID", cursor)
			ev := w.next()
			if ev.Type != api.EventExpired || !strings.Contains(ev.Message, "list the tasks again") {
				t.Fatalf("first event %+v, want Expired", ev)
			}
			h.publish(tk.ID, "after "+name)
			if ev := w.next(); ev.Message != "after "+name {
				t.Fatalf("after Expired: %+v", ev)
			}
		})
	}
}

// TestPublishMissedReachesEveryWatch: events that may have been lost on
// their way from another replica make every watch, whatever its filter,
// report Expired; the stream goes on after it.
func TestPublishMissedReachesEveryWatch(t *testing.T) {
	h := newHarness(t, nil)
	a := h.mustSubmit("team-a", taskDoc("a"))
	streams := map[string]*sseStream{
		"all":          h.watch(api.Prefix + "/watch"),
		"namespace":    h.watch(api.Prefix + "/watch?namespace=team-b"),
		"another task": h.watch(api.Prefix + "/tasks/" + a.ID + "/watch"),
	}
	for _, w := range streams {
		w.next() // the bookmark
	}
	h.srv.PublishMissed("a test")
	h.publish(a.ID, "after")
	for name, w := range streams {
		if ev := w.next(); ev.Type != api.EventExpired || !strings.Contains(ev.Message, "list the tasks again") || ev.Cursor == "" {
			t.Errorf("%s: %+v, want Expired with a cursor", name, ev)
		}
	}
	if ev := streams["all"].next(); ev.Message != "after" {
		t.Errorf("after Expired: %+v", ev)
	}
}

func TestWatchFiltersAndScopes(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	h := newHarness(t, func(c *server.Config) { c.Clock = clk })
	a := h.mustSubmit("team-a", taskDoc("a", "team", "data"))
	b := h.mustSubmit("team-b", taskDoc("b"))

	all := h.watch(api.Prefix + "/watch?namespace=team-a&labels=team%3Ddata")
	all.next()
	one := h.watch(api.Prefix + "/tasks/" + b.ID + "/watch")
	one.next()
	h.publish(b.ID, "b1")
	h.publish(a.ID, "a1")
	if ev := all.next(); ev.TaskID != a.ID || ev.Message != "a1" {
		t.Fatalf("filtered watch got %+v", ev)
	}
	if ev := one.next(); ev.TaskID != b.ID || ev.Message != "b1" {
		t.Fatalf("task watch got %+v", ev)
	}
	// Events the filter drops move the cursor on with a bookmark at the
	// next heartbeat, so that a resume does not start before them.
	h.publish(b.ID, "b2")
	if ev := one.next(); ev.Message != "b2" {
		t.Fatalf("task watch got %+v", ev)
	}
	for deadline := time.Now().Add(10 * time.Second); !clk.HasWaiters(); {
		if time.Now().After(deadline) {
			t.Fatal("the streams set no heartbeat ticker")
		}
		time.Sleep(time.Millisecond)
	}
	clk.Step(15 * time.Second)
	if ev := all.next(); ev.Type != api.EventBookmark || !strings.HasSuffix(ev.Cursor, "-5") {
		t.Fatalf("after a dropped event and a heartbeat: %+v, want a bookmark at the dropped event", ev)
	}
	h.publish(a.ID, "a2")
	if ev := all.next(); ev.Message != "a2" || all.comments == 0 {
		t.Fatalf("got %+v after %d comments, want a2 after a heartbeat comment", ev, all.comments)
	}
	if resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/nope/watch", nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("watch of an unknown task: %s %s", resp.Status, b)
	}
}

// A submission reaches the filtered watches without a read of its record:
// the Submitted event carries the task's namespace, name and labels.
func TestSubmittedEventNeedsNoRead(t *testing.T) {
	h := newHarness(t, nil)
	w := h.watch(api.Prefix + "/watch?namespace=team-a&labels=team%3Ddata")
	w.next() // the bookmark of the stream's start
	before := h.exec.gets.Load()
	tk := h.mustSubmit("team-a", taskDoc("a", "team", "data"))
	if n := h.exec.gets.Load() - before; n != 0 {
		t.Errorf("a submission read its record %d time(s) on its way to the watches, want 0", n)
	}
	if ev := w.next(); ev.Type != string(executor.EventSubmitted) || ev.TaskID != tk.ID || ev.Namespace != "team-a" || ev.Name != "a" {
		t.Fatalf("filtered watch got %+v, want the Submitted event of %s (team-a/a)", ev, tk.ID)
	}
	// An event without the metadata (a replica's, shrunk to fit) is still
	// placed by a read of its record.
	h.srv.Publish(executor.Event{ID: tk.ID, Type: executor.EventSubmitted, Phase: "Pending", Reason: "Submitted", Time: time.Now()})
	if ev := w.next(); ev.TaskID != tk.ID || ev.Namespace != "team-a" || ev.Name != "a" {
		t.Fatalf("filtered watch got %+v for an event without its task's metadata", ev)
	}
	if n := h.exec.gets.Load() - before; n != 1 {
		t.Errorf("an event without its task's metadata read the record %d time(s), want 1", n)
	}
}

func TestWatchEndsWhenTheServerStops(t *testing.T) {
	h := newHarness(t, nil)
	w := h.watch(api.Prefix + "/watch")
	w.next()
	h.srv.CloseStreams()
	done := make(chan error, 1)
	go func() {
		_, err := w.r.ReadString('\n')
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the stream went on")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
	}
	if resp, _ := h.do(http.MethodGet, "/readyz", nil); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("readyz while stopping: %s", resp.Status)
	}
}
