package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/client/clienttest"
	"github.com/kubetask/kubetask/pkg/executor"
)

// cutter is a proxy in front of the API that cuts streaming responses: after
// a budget of body bytes it closes the connection abruptly (no end of the
// chunked body), wherever it is in an event or a log. It can also answer 503
// to the next requests, as a server that is restarting.
type cutter struct {
	target string
	// cut selects the responses to cut (by request path).
	cut func(path string) bool
	// budgets are the body bytes each cut response gets, in turn.
	budgets []int

	mu        sync.Mutex
	responses int
	cuts      int
	lastIDs   []string // the Last-Event-ID of each cut request
	fail503   atomic.Int32
	ts        *httptest.Server
}

func newCutter(t *testing.T, target string, cut func(string) bool, budgets ...int) *cutter {
	c := &cutter{target: target, cut: cut, budgets: budgets}
	c.ts = httptest.NewServer(c)
	t.Cleanup(c.ts.Close)
	return c
}

func (c *cutter) counts() (cuts int, lastIDs []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cuts, append([]string(nil), c.lastIDs...)
}

func (c *cutter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if c.fail503.Add(-1) >= 0 {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"title":"Service Unavailable","status":503,"detail":"restarting"}`)
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, c.target+r.URL.RequestURI(), r.Body)
	if err != nil {
		panic(err)
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	budget := -1
	if c.cut(r.URL.Path) {
		c.mu.Lock()
		budget = c.budgets[c.responses%len(c.budgets)]
		c.responses++
		c.lastIDs = append(c.lastIDs, r.Header.Get(api.HeaderLastEventID))
		c.mu.Unlock()
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		if budget >= 0 && n > budget {
			_, _ = w.Write(buf[:budget])
			_ = rc.Flush()
			c.mu.Lock()
			c.cuts++
			c.mu.Unlock()
			panic(http.ErrAbortHandler) // closes the connection mid-body
		}
		if n > 0 {
			_, _ = w.Write(buf[:n])
			_ = rc.Flush()
			if budget >= 0 {
				budget -= n
			}
		}
		if err != nil {
			break
		}
	}
	for k, vs := range resp.Trailer {
		w.Header()[http.TrailerPrefix+k] = vs
	}
}

// collector gathers the events a Watch delivers.
type collector struct {
	mu     sync.Mutex
	events []api.Event
	more   chan struct{}
}

func newCollector() *collector { return &collector{more: make(chan struct{}, 1)} }

func (c *collector) add(ev api.Event) error {
	c.mu.Lock()
	c.events = append(c.events, ev)
	c.mu.Unlock()
	select {
	case c.more <- struct{}{}:
	default:
	}
	return nil
}

func (c *collector) got() []api.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]api.Event(nil), c.events...)
}

// waitFor waits until n events arrived (the test fails after 10s).
func (c *collector) waitFor(t *testing.T, n int) []api.Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if evs := c.got(); len(evs) >= n {
			return evs
		}
		select {
		case <-c.more:
		case <-deadline:
			t.Fatalf("%d events within 10s, want %d: %+v", len(c.got()), n, c.got())
		}
	}
}

func publish(srv *clienttest.Server, id string, from, to int) {
	for i := from; i < to; i++ {
		srv.Publish(executor.Event{ID: id, Type: executor.EventState, Phase: "Running", Reason: "Running", Message: fmt.Sprint("m", i)})
	}
}

// TestWatchResumesAfterCutConnections: a watch whose connections are cut in
// the middle of events, and refused with 503 for a while, delivers every
// event once, in order.
func TestWatchResumesAfterCutConnections(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	direct := newClient(t, srv.URL)
	tk := submit(t, direct, "default", taskDoc("hello"), client.SubmitOptions{})
	other := submit(t, direct, "other", taskDoc("hello"), client.SubmitOptions{})
	list, err := direct.List(testContext(t), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutter(t, srv.URL, func(p string) bool { return p == api.Prefix+"/watch" }, 450, 1000, 700, 520, 2000)
	c := newClient(t, proxy.ts.URL)

	const total = 60
	publish(srv, tk.ID, 0, total/2)
	publish(srv, other.ID, 0, 5) // filtered out
	col := newCollector()
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	type result struct {
		cursor string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		cursor, err := c.Watch(ctx, client.WatchOptions{Cursor: list.Cursor, Namespace: "default"}, col.add)
		done <- result{cursor, err}
	}()
	col.waitFor(t, 10)
	proxy.fail503.Store(3) // the next reconnections are refused for a while
	publish(srv, tk.ID, total/2, total)
	evs := col.waitFor(t, total)

	for i, ev := range evs {
		if ev.Message != fmt.Sprint("m", i) || ev.TaskID != tk.ID || ev.Type != "State" || ev.Cursor == "" {
			t.Fatalf("event %d: %+v, want m%d of task %s", i, ev, i, tk.ID)
		}
	}
	cuts, lastIDs := proxy.counts()
	if cuts < 5 {
		t.Fatalf("only %d cuts: the test proves nothing", cuts)
	}
	if lastIDs[0] != list.Cursor {
		t.Errorf("first request resumed from %q, want the list's cursor %q", lastIDs[0], list.Cursor)
	}
	if proxy.fail503.Load() >= 0 {
		t.Errorf("the 503s were not all tried")
	}
	cancel()
	r := <-done
	if !errors.Is(r.err, context.Canceled) || r.cursor != evs[total-1].Cursor {
		t.Fatalf("watch ended with %v at %q, want Canceled at the last event's %q", r.err, r.cursor, evs[total-1].Cursor)
	}
	if n := len(col.got()); n != total {
		t.Fatalf("%d events after the end, want %d", n, total)
	}
}

func TestWatchOfOneTaskStopsWhenToldTo(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	other := submit(t, c, "default", taskDoc("other"), client.SubmitOptions{})
	l, err := c.List(testContext(t), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	publish(srv, other.ID, 0, 3)
	publish(srv, tk.ID, 0, 5)
	var got []string
	var bookmarks int
	cursor, err := c.Watch(testContext(t), client.WatchOptions{TaskID: tk.ID, Cursor: l.Cursor, Bookmarks: true}, func(ev api.Event) error {
		if ev.Type == api.EventBookmark {
			bookmarks++
			return nil
		}
		got = append(got, ev.Message)
		if len(got) == 3 {
			return client.ErrStopWatch
		}
		return nil
	})
	if err != nil || strings.Join(got, ",") != "m0,m1,m2" || bookmarks != 1 || cursor == l.Cursor {
		t.Fatalf("got %v, %d bookmarks, cursor %q, %v", got, bookmarks, cursor, err)
	}
	// Resuming from the returned cursor goes on after m2.
	var rest []string
	_, err = c.Watch(testContext(t), client.WatchOptions{TaskID: tk.ID, Cursor: cursor}, func(ev api.Event) error {
		rest = append(rest, ev.Message)
		if len(rest) == 2 {
			return client.ErrStopWatch
		}
		return nil
	})
	if err != nil || strings.Join(rest, ",") != "m3,m4" {
		t.Fatalf("resumed: %v %v", rest, err)
	}
	// The callback's own error ends the watch with it.
	boom := errors.New("boom")
	if _, err := c.Watch(testContext(t), client.WatchOptions{TaskID: tk.ID, Cursor: l.Cursor}, func(api.Event) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("callback error: %v", err)
	}
}

func TestWatchRefusalsAreFinal(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	never := func(ev api.Event) error { return fmt.Errorf("unexpected event %+v", ev) }
	if _, err := c.Watch(testContext(t), client.WatchOptions{TaskID: "nope"}, never); !client.IsNotFound(err) {
		t.Errorf("watch of an unknown task: %v", err)
	}
	if _, err := c.Watch(testContext(t), client.WatchOptions{Phase: "Sleeping"}, never); client.StatusCode(err) != 400 {
		t.Errorf("bad filter: %v", err)
	}
	if _, err := c.Watch(testContext(t), client.WatchOptions{TaskID: "x", Namespace: "default"}, never); err == nil {
		t.Error("a task watch with a filter was accepted")
	}
	// A server that cannot be reached: the first connection fails at once.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	if _, err := newClient(t, dead.URL).Watch(testContext(t), client.WatchOptions{}, never); err == nil || client.StatusCode(err) != 0 {
		t.Errorf("unreachable server: %v", err)
	}
	// An answer that is not an event stream.
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "<html></html>") }))
	defer html.Close()
	if _, err := newClient(t, html.URL).Watch(testContext(t), client.WatchOptions{}, never); err == nil || !strings.Contains(err.Error(), "not an event stream") {
		t.Errorf("not an event stream: %v", err)
	}
}

func TestWatchFromAnExpiredCursorDeliversExpired(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	col := newCollector()
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Watch(ctx, client.WatchOptions{Cursor: "zzzzzzzz-1"}, col.add)
		done <- err
	}()
	if ev := col.waitFor(t, 1)[0]; ev.Type != api.EventExpired || !strings.Contains(ev.Message, "list the tasks again") {
		t.Fatalf("first event %+v, want Expired", ev)
	}
	publish(srv, tk.ID, 0, 1)
	if ev := col.waitFor(t, 2)[1]; ev.Message != "m0" {
		t.Fatalf("after Expired: %+v", ev)
	}
	cancel()
	<-done
}

// TestWatchReconnectsAnIdleConnection: a stream on which nothing arrives,
// not even a heartbeat, is dropped and resumed.
func TestWatchReconnectsAnIdleConnection(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{Configure: func(c *server.Config) { c.Heartbeat = time.Hour }})
	c := newClient(t, srv.URL)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	col := newCollector()
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	go func() {
		_, _ = c.Watch(ctx, client.WatchOptions{TaskID: tk.ID, IdleTimeout: 20 * time.Millisecond}, col.add)
	}()
	waitForRequests(t, srv, "GET "+api.Prefix+"/tasks/"+tk.ID+"/watch", 3)
	publish(srv, tk.ID, 0, 1)
	if ev := col.waitFor(t, 1)[0]; ev.Message != "m0" {
		t.Fatalf("%+v", ev)
	}
}

// waitForRequests waits until n requests req arrived (the test fails after
// 10s).
func waitForRequests(t *testing.T, srv *clienttest.Server, req string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); countOf(srv.Requests(), req) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests %q within 10s, want %d", countOf(srv.Requests(), req), req, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func countOf(reqs []string, req string) int {
	n := 0
	for _, r := range reqs {
		if r == req {
			n++
		}
	}
	return n
}

func TestWaitReturnsTheFinalOutcome(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	type result struct {
		t   *api.Task
		err error
	}
	done := make(chan result, 1)
	var seen atomic.Int32
	go func() {
		out, err := c.WaitFunc(testContext(t), tk.ID, func(api.Event) { seen.Add(1) })
		done <- result{out, err}
	}()
	srv.WaitForRequest(t, "GET "+api.Prefix+"/tasks/"+tk.ID+"/watch")
	// A failed attempt that is retried is not the outcome.
	srv.Finish(t, tk.ID, "Failed", "Evicted", "evicted", 137, true)
	srv.SetState(t, tk.ID, "Running", "Running", "", true)
	select {
	case r := <-done:
		t.Fatalf("Wait returned before the outcome: %+v %v", r.t, r.err)
	default:
	}
	srv.Finish(t, tk.ID, "Failed", "ExitCode", "exit 3", 3, false)
	r := <-done
	if r.err != nil || !r.t.Terminal || r.t.Reason != "ExitCode" || *r.t.ExitCode != 3 || len(r.t.Attempts) != 2 {
		t.Fatalf("%+v %v", r.t, r.err)
	}
	if n := seen.Load(); n != 3 {
		t.Errorf("WaitFunc saw %d events, want 3", n)
	}
	// A finished task: at once, without a watch.
	before := len(srv.Requests())
	out, err := c.Wait(testContext(t), tk.ID)
	if err != nil || !out.Terminal || len(srv.Requests()) != before+1 {
		t.Fatalf("wait of a finished task: %+v %v, requests %v", out, err, srv.Requests()[before:])
	}
	if _, err := c.Wait(testContext(t), "nope"); !client.IsNotFound(err) {
		t.Fatalf("wait of an unknown task: %v", err)
	}
}

func TestWaitUntilAndGetWithCursor(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	got, cursor, err := c.GetWithCursor(testContext(t), tk.ID)
	if err != nil || got.ID != tk.ID || cursor == "" {
		t.Fatalf("%+v %q %v", got, cursor, err)
	}
	// A change after the read is seen from the read's cursor.
	publish(srv, tk.ID, 0, 1)
	var first api.Event
	_, err = c.Watch(testContext(t), client.WatchOptions{TaskID: tk.ID, Cursor: cursor}, func(ev api.Event) error {
		first = ev
		return client.ErrStopWatch
	})
	if err != nil || first.Message != "m0" {
		t.Fatalf("%+v %v", first, err)
	}

	done := make(chan *api.Task, 1)
	go func() {
		out, err := c.WaitUntil(testContext(t), tk.ID, func(t *api.Task) bool { return t.Attempt >= 1 })
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	waitForRequests(t, srv, "GET "+api.Prefix+"/tasks/"+tk.ID+"/watch", 2)
	srv.SetState(t, tk.ID, "Running", "Running", "", true)
	select {
	case out := <-done:
		t.Fatalf("returned before the condition held: %+v", out)
	default:
	}
	srv.Finish(t, tk.ID, "Failed", "Evicted", "", 137, true)
	if out := <-done; out == nil || out.Attempt != 1 || out.Terminal {
		t.Fatalf("%+v", out)
	}
}

// TestWaitAfterAnExpiredCursorReadsTheTaskAgain: when the server lost the
// events after Wait's cursor (it restarted), Wait does not wait for a
// terminal event that will never come: it reads the task again.
func TestWaitAfterAnExpiredCursorReadsTheTaskAgain(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	srv.Finish(t, tk.ID, "Succeeded", "Completed", "", 0, false)
	// The first read is answered as by the earlier process: the task
	// unfinished, with a cursor of that process. Everything else goes to
	// the server.
	target, _ := url.Parse(srv.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	var gets atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == api.Prefix+"/tasks/"+tk.ID && gets.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(api.HeaderCursor, "zzzzzzzz-1")
			fmt.Fprintf(w, `{"id":%q,"phase":"Running","terminal":false}`, tk.ID)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	out, err := newClient(t, proxy.URL).Wait(testContext(t), tk.ID)
	if err != nil || !out.Terminal || out.Reason != "Completed" || gets.Load() != 2 {
		t.Fatalf("%+v %v after %d gets", out, err, gets.Load())
	}
}

// safeBuffer is a buffer written by one goroutine and read by another.
type safeBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *safeBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *safeBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

func waitLen(t *testing.T, b *safeBuffer, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); b.Len() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("read %d bytes within 10s, want %d", b.Len(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// randomLog is n bytes of text and binary.
func randomLog(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		if i%50 == 49 {
			b[i] = '\n'
		} else {
			b[i] = byte(r.UintN(256))
		}
	}
	return b
}

// TestLogsFollowResumesByteExact: a follow whose connections are cut every
// few hundred bytes, while the log grows, returns the log exactly, and ends
// when the log is complete.
func TestLogsFollowResumesByteExact(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	direct := newClient(t, srv.URL)
	tk := submit(t, direct, "default", taskDoc("hello"), client.SubmitOptions{})
	logPath := api.Prefix + "/tasks/" + tk.ID + "/logs"
	proxy := newCutter(t, srv.URL, func(p string) bool { return p == logPath }, 97, 300, 13, 501)
	c := newClient(t, proxy.ts.URL)
	log := randomLog(6000)
	parts := [][]byte{log[:1000], log[1000:1001], log[1001:3500], log[3500:5999], log[5999:]}

	srv.AppendLog(t, tk.ID, 0, "main", string(parts[0]), false)
	r, err := c.Logs(testContext(t), tk.ID, client.LogOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out safeBuffer
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(&out, r)
		done <- err
	}()
	waitLen(t, &out, 1000)
	read := 1000
	for i, p := range parts[1:] {
		srv.AppendLog(t, tk.ID, 0, "main", string(p), i == len(parts)-2)
		read += len(p)
		if i < len(parts)-2 {
			waitLen(t, &out, read)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("reading: %v", err)
	}
	if !bytes.Equal(out.buf.Bytes(), log) {
		t.Fatalf("read %d bytes, not the log's %d bytes exactly", out.buf.Len(), len(log))
	}
	if cuts, _ := proxy.counts(); cuts < 10 {
		t.Fatalf("only %d cuts: the test proves nothing", cuts)
	}
	if info := r.Info(); !info.Complete || info.Size != int64(len(log)) || r.Offset() != int64(len(log)) || r.Attempt() != 0 {
		t.Fatalf("info %+v, offset %d, attempt %d", info, r.Offset(), r.Attempt())
	}
	if n, err := r.Read(make([]byte, 10)); n != 0 || err != io.EOF { //nolint:errorlint // a Reader returns io.EOF itself
		t.Fatalf("read after the end: %d %v", n, err)
	}
}

func TestLogsWithoutFollowResumeToo(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	direct := newClient(t, srv.URL)
	tk := submit(t, direct, "default", taskDoc("hello"), client.SubmitOptions{})
	log := randomLog(3000)
	srv.AppendLog(t, tk.ID, 0, "main", string(log[:2000]), false)
	proxy := newCutter(t, srv.URL, func(p string) bool { return strings.HasSuffix(p, "/logs") }, 150)
	c := newClient(t, proxy.ts.URL)
	read := func(t *testing.T, opts client.LogOptions) []byte {
		t.Helper()
		r, err := c.Logs(testContext(t), tk.ID, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		got, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, tc := range []struct {
		name string
		opts client.LogOptions
		want []byte
	}{
		{"from the start", client.LogOptions{}, log[:2000]},
		{"from an offset", client.LogOptions{Offset: 777}, log[777:2000]},
		{"at the end", client.LogOptions{Offset: 2000}, nil},
		{"an attempt", client.LogOptions{Attempt: new(0), Offset: 1}, log[1:2000]},
	} {
		if got := read(t, tc.opts); !bytes.Equal(got, tc.want) {
			t.Fatalf("%s: read %d bytes, want %d exactly", tc.name, len(got), len(tc.want))
		}
	}
	// After a retry the default is the new attempt.
	srv.Finish(t, tk.ID, "Failed", "Evicted", "", 137, true)
	srv.AppendLog(t, tk.ID, 1, "main", string(log[2000:]), true)
	if got := read(t, client.LogOptions{}); !bytes.Equal(got, log[2000:]) {
		t.Fatalf("current attempt: read %d bytes, want %d exactly", len(got), len(log[2000:]))
	}
	if got := read(t, client.LogOptions{Attempt: new(0)}); !bytes.Equal(got, log[:2000]) {
		t.Fatalf("first attempt: read %d bytes, want %d exactly", len(got), 2000)
	}
	if cuts, _ := proxy.counts(); cuts < 10 {
		t.Fatalf("only %d cuts: the test proves nothing", cuts)
	}
}

// TestLogsFollowEndedByTheServerResumes: the server ends follows early
// (its stream timeout) with the resume trailer; the reader goes on.
func TestLogsFollowEndedByTheServerResumes(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{Configure: func(c *server.Config) { c.StreamTimeout = 20 * time.Millisecond }})
	c := newClient(t, srv.URL)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	srv.AppendLog(t, tk.ID, 0, "main", "one\n", false)
	r, err := c.Logs(testContext(t), tk.ID, client.LogOptions{Attempt: new(0), Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out safeBuffer
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(&out, r)
		done <- err
	}()
	waitForRequests(t, srv, "GET "+api.Prefix+"/tasks/"+tk.ID+"/logs", 4)
	srv.AppendLog(t, tk.ID, 0, "main", "two\n", true)
	if err := <-done; err != nil || out.buf.String() != "one\ntwo\n" {
		t.Fatalf("%q %v", out.buf.String(), err)
	}
}

// TestLogsFollowOfAnAttemptThatEndsWithoutItsLog: the server ends the follow
// of a finished attempt whose log will not be complete; so does the reader.
func TestLogsFollowOfAnAttemptThatEndsWithoutItsLog(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	srv.AppendLog(t, tk.ID, 0, "main", "partial", false)
	srv.Finish(t, tk.ID, "Failed", "NodeLost", "", 137, false)
	r, err := c.Logs(testContext(t), tk.ID, client.LogOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "partial" || r.Info().Complete {
		t.Fatalf("%q %v %+v", got, err, r.Info())
	}
}

func TestLogsCloseEndsAFollow(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	srv.AppendLog(t, tk.ID, 0, "main", "x", false)
	r, err := c.Logs(testContext(t), tk.ID, client.LogOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if n, err := r.Read(b); n != 1 || err != nil {
		t.Fatalf("%d %v", n, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.Read(b)
		done <- err
	}()
	srv.WaitForRequest(t, "GET "+api.Prefix+"/tasks/"+tk.ID+"/logs")
	r.Close()
	select {
	case err := <-done:
		if err == nil || err == io.EOF { //nolint:errorlint // a Reader returns io.EOF itself
			t.Fatalf("read after Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a blocked Read")
	}
}
