package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"time"

	"github.com/kubetask/kubetask/pkg/api"
)

// WatchOptions are the options of Watch.
type WatchOptions struct {
	// TaskID watches one task. It takes no filter.
	TaskID string
	// Cursor resumes after the event with this cursor (an Event's Cursor,
	// a TaskList's Cursor, or what an earlier Watch returned). Default: from
	// the moment the first connection is made.
	Cursor string
	// Namespace, Phase, Reason, NamePrefix, Labels and LabelSelector filter
	// the events of a watch of every task, as in ListOptions (a phase or a
	// reason filter matches the event's).
	Namespace, Phase, Reason, NamePrefix string
	Labels                               map[string]string
	LabelSelector                        string
	// Cluster keeps the events of attempts on this cluster (a service
	// with several clusters).
	Cluster string
	// Bookmarks delivers the Bookmark events too: they carry no change,
	// only a cursor to resume from. Default: Watch keeps their cursor and
	// delivers nothing.
	Bookmarks bool
	// IdleTimeout reconnects when nothing arrived for that long, not even a
	// heartbeat (the server sends one every 15 s by default): a connection
	// that died without a word. Default 90s; negative: never.
	IdleTimeout time.Duration
}

// ErrStopWatch ends a watch without an error when its callback returns it.
var ErrStopWatch = errors.New("stop watching")

const defaultIdleTimeout = 90 * time.Second

var (
	errStreamEnded = errors.New("the server ended the event stream")
	errIdle        = errors.New("no data on the event stream, not even a heartbeat")
)

func (o *WatchOptions) request() (request, error) {
	if o.TaskID != "" {
		if o.Namespace != "" || o.Phase != "" || o.Reason != "" || o.NamePrefix != "" || len(o.Labels) > 0 || o.LabelSelector != "" || o.Cluster != "" {
			return request{}, errors.New("watching a task: the watch of one task (TaskID) takes no filter")
		}
		return request{method: http.MethodGet, path: pathOf("tasks", o.TaskID, "watch")}, nil
	}
	q := url.Values{}
	filters(q, o.Namespace, o.Phase, o.Reason, o.NamePrefix, selector(o.Labels, o.LabelSelector))
	if o.Cluster != "" {
		q.Set("cluster", o.Cluster)
	}
	return request{method: http.MethodGet, path: "/watch", query: q}, nil
}

// Watch calls fn with each event of the tasks opts selects, in order, until
// ctx ends (it returns ctx's error), fn returns an error (it returns it; nil
// for ErrStopWatch) or the server refuses the watch (an *Error: a bad filter
// or cursor, an unknown task, no permission). It returns the cursor after the
// last event it delivered (or the last bookmark), from which a later Watch
// resumes.
//
// When a connection drops or the server ends the stream, Watch connects
// again after a backoff and resumes after the last event it read, so fn
// misses no event and sees none twice. It keeps trying until ctx ends; only
// when the first connection fails does it return at once. An Expired event
// says that the server no longer had the events after the cursor (it
// restarted, or the cursor is too old): events were missed, list again; the
// watch goes on after it. fn runs on the watch's goroutine: while it runs, no
// other event is read.
func (c *Client) Watch(ctx context.Context, opts WatchOptions, fn func(api.Event) error) (string, error) {
	what := "watching tasks"
	if opts.TaskID != "" {
		what = "watching task " + opts.TaskID
	}
	r, err := opts.request()
	if err != nil {
		return opts.Cursor, err
	}
	w := &watch{c: c, opts: opts, fn: fn, cursor: opts.Cursor}
	if w.opts.IdleTimeout == 0 {
		w.opts.IdleTimeout = defaultIdleTimeout
	}
	bo := c.backoff.start()
	connected := false
	var busy busyTries
	for {
		res := w.stream(ctx, r)
		switch {
		case res.stop:
			return w.cursor, nil
		case res.fnErr != nil:
			return w.cursor, res.fnErr
		case ctx.Err() != nil:
			return w.cursor, ctx.Err()
		case !connected && !res.connected:
			// The first connection: only a 429 (too many streams) is
			// tried again, after its Retry-After (WithBusyRetry).
			e, ok := isBusy(res.err)
			if !ok {
				return w.cursor, fmt.Errorf("%s: %w", what, res.err)
			}
			d, err := c.nextBusy(&busy, res.err, e)
			if err != nil {
				return w.cursor, fmt.Errorf("%s: %w", what, err)
			}
			c.log.Debug("watch refused by a limit, trying again", "what", what, "delay", d, "detail", e.Problem.Detail)
			if err := c.wait(ctx, d); err != nil {
				return w.cursor, err
			}
			continue
		case !retryable(res.err):
			return w.cursor, fmt.Errorf("%s: %w", what, res.err)
		}
		connected = true
		if res.progress {
			bo.reset()
		}
		d := c.reconnectDelay(bo.delay(), res.err)
		c.log.Debug("watch reconnecting", "what", what, "err", res.err, "delay", d, "cursor", w.cursor)
		if err := c.wait(ctx, d); err != nil {
			return w.cursor, err
		}
	}
}

type watch struct {
	c      *Client
	opts   WatchOptions
	fn     func(api.Event) error
	cursor string
}

// streamResult is how one connection of a watch ended.
type streamResult struct {
	connected bool  // the server accepted the watch (2xx)
	progress  bool  // it delivered a task event, or lasted a while
	stop      bool  // fn returned ErrStopWatch
	fnErr     error // fn returned this
	err       error // the connection's end
}

// stream reads one connection's events into fn.
func (w *watch) stream(ctx context.Context, r request) (res streamResult) {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.header = http.Header{"Accept": {"text/event-stream"}, "Cache-Control": {"no-cache"}}
	if w.cursor != "" {
		r.header.Set(api.HeaderLastEventID, w.cursor)
	}
	start := time.Now()
	resp, err := w.c.send(cctx, r)
	if err != nil {
		res.err = err
		return res
	}
	defer resp.Body.Close()
	res.connected = true
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		res.err = &protocolError{fmt.Sprintf("the server answered %q, not an event stream: is %s kubetask's API?", mt, w.c.base)}
		return res
	}
	var body io.Reader = resp.Body
	if d := w.opts.IdleTimeout; d > 0 {
		t := time.AfterFunc(d, func() { cancel(fmt.Errorf("%w for %s", errIdle, d)) })
		defer t.Stop()
		body = &idleReader{r: resp.Body, t: t, d: d}
	}
	sr := newSSEReader(body)
	for {
		sev, err := sr.Next()
		if err != nil {
			if cause := context.Cause(cctx); errors.Is(cause, errIdle) {
				err = cause
			} else if errors.Is(err, io.EOF) {
				err = errStreamEnded
			}
			res.err = err
			res.progress = res.progress || time.Since(start) >= w.c.backoff.max
			return res
		}
		var ev api.Event
		if err := json.Unmarshal([]byte(sev.Data), &ev); err != nil {
			res.err = &protocolError{fmt.Sprintf("event %q of the stream is not a task event: %v", sev.ID, err)}
			return res
		}
		if sev.ID != "" {
			w.cursor = sev.ID
		}
		if ev.Cursor == "" {
			ev.Cursor = sev.ID
		}
		if ev.Type == api.EventBookmark && !w.opts.Bookmarks {
			continue
		}
		res.progress = res.progress || ev.Type != api.EventBookmark
		if err := w.fn(ev); err != nil {
			if errors.Is(err, ErrStopWatch) {
				res.stop = true
			} else {
				res.fnErr = err
			}
			return res
		}
	}
}

// idleReader pushes an idle timer back at each read that returns data.
type idleReader struct {
	r io.Reader
	t *time.Timer
	d time.Duration
}

func (r *idleReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.t.Reset(r.d)
	}
	return n, err
}

// Wait returns task id once it is terminal (its outcome is final): at once
// when it is, else when its watch delivers the final outcome. It watches from
// the cursor of its first read, so it misses no change, and reads the task
// again after an Expired event. It returns an error only when ctx ends, the
// task cannot be read (an *Error: unknown, no permission), the first
// connection of the watch fails or the server refuses the watch.
func (c *Client) Wait(ctx context.Context, id string) (*api.Task, error) {
	return c.WaitFunc(ctx, id, nil)
}

// WaitFunc is Wait that calls fn (when not nil) with each event of the task
// until then (none when the task is terminal already), for progress.
func (c *Client) WaitFunc(ctx context.Context, id string, fn func(api.Event)) (*api.Task, error) {
	return c.waitUntil(ctx, id, func(t *api.Task) bool { return t.Terminal },
		func(ev api.Event) bool { return ev.Terminal || ev.Type == api.EventExpired }, fn)
}

// WaitUntil returns task id once cond holds for it. It checks cond on a first
// read of the task and, watching the task from that read's cursor, on a new
// read after each event of the task; it ends as Wait does.
func (c *Client) WaitUntil(ctx context.Context, id string, cond func(*api.Task) bool) (*api.Task, error) {
	return c.waitUntil(ctx, id, cond, func(api.Event) bool { return true }, nil)
}

// waitUntil reads the task when it starts, and then after each event for
// which reread is true, until cond holds; fn sees each event.
func (c *Client) waitUntil(ctx context.Context, id string, cond func(*api.Task) bool, reread func(api.Event) bool, fn func(api.Event)) (*api.Task, error) {
	t, cursor, err := c.GetWithCursor(ctx, id)
	if err != nil {
		return nil, err
	}
	if cond(t) {
		return t, nil
	}
	// Without a cursor the watch starts after the read: read again once
	// it started (its first bookmark), not to miss a change in between.
	recheck := cursor == ""
	var out *api.Task
	_, err = c.Watch(ctx, WatchOptions{TaskID: id, Cursor: cursor, Bookmarks: recheck}, func(ev api.Event) error {
		switch {
		case ev.Type == api.EventBookmark:
			if !recheck {
				return nil
			}
			recheck = false
		case fn != nil:
			fn(ev)
		}
		if ev.Type != api.EventBookmark && !reread(ev) {
			return nil
		}
		t, err := c.getRetrying(ctx, id)
		if err != nil {
			return err
		}
		if !cond(t) {
			return nil
		}
		out = t
		return ErrStopWatch
	})
	if out != nil {
		return out, nil
	}
	return nil, err
}

// getRetrying is Get that tries again, with backoff, while the failure is
// one that may pass.
func (c *Client) getRetrying(ctx context.Context, id string) (*api.Task, error) {
	bo := c.backoff.start()
	for {
		t, err := c.Get(ctx, id)
		if err == nil || ctx.Err() != nil || !retryable(err) {
			return t, err
		}
		if err := sleep(ctx, bo.delay()); err != nil {
			return nil, err
		}
	}
}
