package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/kubetask/kubetask/pkg/api"
)

// LogOptions are the options of Logs.
type LogOptions struct {
	// Attempt is the attempt whose log to read, 0 for the first. Default:
	// the task's current attempt when Logs is called.
	Attempt *int
	// Container is the container whose log to read. Default: the task's
	// main container.
	Container string
	// Offset is the byte of the log to start at (the bytes read before).
	Offset int64
	// Follow goes on as the log grows, until it is complete.
	Follow bool
}

// LogInfo describes a task's archived log, as the server reported it last.
type LogInfo struct {
	// Size is the number of bytes archived.
	Size int64
	// Complete is true once the whole log is archived.
	Complete bool
	// Truncated is true when the log reached the archive's size cap (a
	// marker line in the log says so).
	Truncated bool
}

// LogReader reads a task's log from the server. It is an io.ReadCloser whose
// Read returns the log's bytes from the starting offset, each exactly once:
// when a response ends early (a dropped connection, a server that ends a
// follow to let the client resume), it requests the log again from the
// offset it reached, after a backoff when the connection failed, until its
// context ends. Without Follow it returns io.EOF at the end of what was
// archived when it started; with Follow, exactly when the server ends the
// log (it is complete, or the attempt is over and nothing more will be
// archived). Read is not safe for concurrent use; Close may be called while a
// Read blocks, and ends it.
type LogReader struct {
	mu sync.Mutex // held by Read, and by Close once it cancelled ctx

	c       *Client
	ctx     context.Context
	cancel  context.CancelFunc
	id      string
	attempt int
	opts    LogOptions

	resp     *http.Response // the current response; nil between them
	got      int64          // bytes of the current response
	offset   int64
	info     LogInfo
	bo       *backoff
	failures int // requests since the last byte read that failed or brought nothing
	err      error
}

// Logs opens the log of one container of one attempt of task id (see
// LogReader). Close the reader when done. An unknown task, attempt or
// container (one whose log the task does not keep) is an *Error with
// IsNotFound; a server without a log archive answers 501.
func (c *Client) Logs(ctx context.Context, id string, opts LogOptions) (*LogReader, error) {
	if opts.Offset < 0 {
		return nil, fmt.Errorf("reading the log of task %s: negative offset %d", id, opts.Offset)
	}
	attempt := 0
	if opts.Attempt != nil {
		attempt = *opts.Attempt
	} else {
		// Resumed requests must read the same attempt's log, whichever
		// attempt is the task's current one by then.
		t, err := c.Get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("reading the log of task %s: %w", id, err)
		}
		attempt = t.Attempt
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &LogReader{c: c, ctx: rctx, cancel: cancel, id: id, attempt: attempt, opts: opts, offset: opts.Offset, bo: c.backoff.start()}
	var busy busyTries
	for {
		resp, err := r.request() //nolint:bodyclose // the reader owns the body: Read closes it at its end, Close before
		if err == nil {
			r.start(resp)
			return r, nil
		}
		if e, ok := isBusy(err); ok {
			// Too many streams: try again after Retry-After (WithBusyRetry).
			var d time.Duration
			if d, err = c.nextBusy(&busy, err, e); err == nil {
				werr := c.wait(rctx, d)
				if werr == nil {
					continue
				}
				err = fmt.Errorf("%w (while waiting to try again after: %w)", werr, e)
			}
		}
		cancel()
		return nil, fmt.Errorf("reading the log of task %s: %w", id, err)
	}
}

// Attempt returns the attempt whose log the reader reads.
func (r *LogReader) Attempt() int { return r.attempt }

// Offset returns the offset in the log after the bytes read so far (the
// starting offset plus what Read returned).
func (r *LogReader) Offset() int64 { return r.offset }

// Info returns the log's archive as the server reported it last (when a
// response started, and again when it ended).
func (r *LogReader) Info() LogInfo { return r.info }

// Close ends the reader (its connection, a Read that blocks) and releases its
// resources.
func (r *LogReader) Close() error {
	r.cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closeResponse()
	if r.err == nil {
		r.err = errors.New("log reader closed")
	}
	return nil
}

// Read reads the next bytes of the log, resuming as needed (see LogReader).
func (r *LogReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if r.err != nil {
			return 0, r.err
		}
		if len(p) == 0 {
			return 0, nil
		}
		if r.resp == nil {
			if err := r.resume(); err != nil {
				r.err = err
				return 0, err
			}
		}
		n, err := r.resp.Body.Read(p)
		r.got += int64(n)
		r.offset += int64(n)
		if err != nil {
			r.end(err)
		}
		if n > 0 {
			r.failures = 0
			r.bo.reset()
			return n, nil
		}
	}
}

// end closes a response that ended with err and decides what follows: the
// end of the log (io.EOF), the end of the reader (its context ended), or a
// new request.
func (r *LogReader) end(err error) {
	resp := r.resp
	r.closeResponse()
	if r.got == 0 {
		// A response that brought nothing: the next one waits.
		r.failures++
	}
	switch {
	case r.ctx.Err() != nil:
		r.err = r.ctx.Err()
	case errors.Is(err, io.EOF):
		// The response ended as the server meant: its trailers say whether
		// the log goes on.
		r.setInfo(resp.Trailer)
		more, ok := parseBool(resp.Trailer.Get(api.HeaderLogResume))
		if !ok {
			// No trailers (a proxy dropped them): a follow that
			// delivered something may go on; one that delivered nothing
			// or read a complete log is over.
			more = r.opts.Follow && r.got > 0 && !r.info.Complete
		}
		if !more {
			r.err = io.EOF
		}
	}
	// Otherwise the connection broke: resume reconnects.
}

func (r *LogReader) closeResponse() {
	if r.resp != nil {
		_ = r.resp.Body.Close()
		r.resp = nil
	}
}

// start takes a new response.
func (r *LogReader) start(resp *http.Response) {
	r.resp, r.got = resp, 0
	r.setInfo(resp.Header)
}

func (r *LogReader) setInfo(h http.Header) {
	if n, err := strconv.ParseInt(h.Get(api.HeaderLogSize), 10, 64); err == nil {
		r.info.Size = n
	}
	if b, ok := parseBool(h.Get(api.HeaderLogComplete)); ok {
		r.info.Complete = b
	}
	if b, ok := parseBool(h.Get(api.HeaderLogTruncated)); ok {
		r.info.Truncated = b
	}
}

// resume requests the log again from the offset reached, retrying with
// backoff while the failures may pass.
func (r *LogReader) resume() error {
	var last error // of the previous request
	for {
		if r.failures > 0 {
			d := r.c.reconnectDelay(r.bo.delay(), last)
			r.c.log.Debug("log reconnecting", "task", r.id, "attempt", r.attempt, "offset", r.offset, "delay", d)
			if err := r.c.wait(r.ctx, d); err != nil {
				return err
			}
		}
		resp, err := r.request() //nolint:bodyclose // the reader owns the body: Read closes it at its end, Close before
		last = err
		if err == nil {
			r.start(resp)
			return nil
		}
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
		if !retryable(err) {
			return fmt.Errorf("reading the log of task %s from byte %d: %w", r.id, r.offset, err)
		}
		r.failures++
	}
}

func (r *LogReader) request() (*http.Response, error) {
	q := url.Values{"attempt": {strconv.Itoa(r.attempt)}}
	if r.opts.Container != "" {
		q.Set("container", r.opts.Container)
	}
	if r.offset > 0 {
		q.Set("offset", strconv.FormatInt(r.offset, 10))
	}
	if r.opts.Follow {
		q.Set("follow", "true")
	}
	return r.c.send(r.ctx, request{method: http.MethodGet, path: pathOf("tasks", r.id, "logs"), query: q, header: http.Header{"Accept": {"text/plain"}}})
}

func parseBool(s string) (bool, bool) {
	b, err := strconv.ParseBool(s)
	return b, err == nil
}
