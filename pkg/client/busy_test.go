package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
)

// TestTooManyRequestsIsRetried: a call that is safe to repeat (a GET, a
// submission with an ID) and that the server answers 429 is sent again
// after the answer's Retry-After (else the retry backoff), at most
// WithBusyRetry's tries and while the waits fit in its bound; otherwise
// the 429 comes back with an error that says why it was not sent again.
// Before, the first 429 was returned at once.
func TestTooManyRequestsIsRetried(t *testing.T) {
	get := func(ctx context.Context, c *client.Client) error { _, err := c.Get(ctx, "t-1"); return err }
	list := func(ctx context.Context, c *client.Client) error {
		_, err := c.List(ctx, client.ListOptions{})
		return err
	}
	submit := func(id string) func(ctx context.Context, c *client.Client) error {
		return func(ctx context.Context, c *client.Client) error {
			_, _, err := c.Submit(ctx, "default", []byte(taskDoc("x")), client.SubmitOptions{ID: id})
			return err
		}
	}
	for name, tc := range map[string]struct {
		busy       int // 429s before the answer; -1: always
		retryAfter string
		ok         int
		opts       []client.Option
		call       func(context.Context, *client.Client) error
		requests   int
		waits      []time.Duration // exact waits; nil: checked by count only
		want429    bool
		wantErr    string // in the error when want429
	}{
		"get waits Retry-After": {
			busy: 2, retryAfter: "3", ok: 200, call: get, requests: 3, waits: []time.Duration{3 * time.Second, 3 * time.Second},
		},
		"list": {busy: 1, retryAfter: "1", ok: 200, call: list, requests: 2, waits: []time.Duration{time.Second}},
		"submit with an ID": {
			busy: 1, retryAfter: "2", ok: 201, call: submit("t-1"), requests: 2, waits: []time.Duration{2 * time.Second},
		},
		"no Retry-After: the backoff": {busy: 2, ok: 200, call: get, requests: 3},
		"submit without an ID is not sent again": {
			busy: 1, retryAfter: "1", ok: 201, call: submit(""), requests: 1, want429: true,
			wantErr: "not sent again",
		},
		"tries bounded": {
			busy: -1, retryAfter: "1", ok: 200, call: get, requests: 4, want429: true,
			opts: []client.Option{client.WithBusyRetry(3, time.Minute)}, wantErr: "sent 4 times",
		},
		"Retry-After beyond the bound": {
			busy: -1, retryAfter: "120", ok: 200, call: get, requests: 1, want429: true,
			wantErr: "asks to wait 2m0s",
		},
		"waits bounded": {
			busy: -1, retryAfter: "10", ok: 200, call: get, requests: 3, want429: true,
			opts: []client.Option{client.WithBusyRetry(10, 25*time.Second)}, waits: []time.Duration{10 * time.Second, 10 * time.Second},
			wantErr: "asks to wait 10s",
		},
		"retries off": {
			busy: 1, retryAfter: "1", ok: 200, call: get, requests: 1, want429: true,
			opts: []client.Option{client.WithBusyRetry(0, 0)},
		},
	} {
		t.Run(name, func(t *testing.T) {
			b := &flaky{status: http.StatusTooManyRequests, n: tc.busy, retryAfter: tc.retryAfter, ok: answerTask(tc.ok)}
			ts := httptest.NewServer(b)
			t.Cleanup(ts.Close)
			c := newClient(t, ts.URL, tc.opts...)
			var waits []time.Duration
			client.SetWaiter(c, func(ctx context.Context, d time.Duration) error {
				waits = append(waits, d)
				return ctx.Err()
			})
			err := tc.call(testContext(t), c)
			if got := client.StatusCode(err) == http.StatusTooManyRequests; got != tc.want429 {
				t.Fatalf("error %v; want a 429: %v", err, tc.want429)
			}
			if !tc.want429 && err != nil {
				t.Fatal(err)
			}
			if tc.want429 && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q, want it to say %q", err, tc.wantErr)
			}
			if got := len(b.requests()); got != tc.requests {
				t.Errorf("%d requests, want %d", got, tc.requests)
			}
			if len(waits) != tc.requests-1 {
				t.Errorf("waited %d times (%v), want %d", len(waits), waits, tc.requests-1)
			}
			if tc.waits != nil && !equalDurations(waits, tc.waits) {
				t.Errorf("waited %v, want %v (Retry-After)", waits, tc.waits)
			}
		})
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTooManyRequestsWaitEndsWithTheContext: a context that ends while the
// client waits for Retry-After ends the call with the context's error and
// the 429, with the real timer.
func TestTooManyRequestsWaitEndsWithTheContext(t *testing.T) {
	ts := httptest.NewServer(&flaky{status: http.StatusTooManyRequests, n: -1, retryAfter: "30", ok: answerTask(200)})
	t.Cleanup(ts.Close)
	c := newClient(t, ts.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Get(ctx, "t-1")
	if !errors.Is(err, context.DeadlineExceeded) || client.StatusCode(err) != http.StatusTooManyRequests {
		t.Fatalf("got %v, want the context's error and the 429", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("returned after %s: the wait did not end with the context", d)
	}
}

// streamServer answers a watch or a log request in turn with each of its
// answers: a 429 with Retry-After, or a body (an event stream, a log).
type streamServer struct {
	answers []func(w http.ResponseWriter)

	mu       sync.Mutex
	requests int
}

func (s *streamServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	n := s.requests
	s.requests++
	s.mu.Unlock()
	if n >= len(s.answers) {
		w.WriteHeader(http.StatusGone)
		return
	}
	s.answers[n](w)
}

func (s *streamServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

func tooManyStreams(retryAfter string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", retryAfter)
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"title":"Too Many Requests","status":429,"detail":"too many streams at once: 50 open watches and log follows for admin is reached"}`))
	}
}

func events(cursors ...string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, c := range cursors {
			_, _ = fmt.Fprintf(w, "id: %s\nevent: State\ndata: {\"cursor\":%q,\"type\":\"State\",\"taskId\":\"t-1\",\"attempt\":0,\"time\":\"2026-12-03T10:00:00Z\"}\n\n", c, c)
		}
	}
}

// TestStreamsWaitRetryAfter: a watch or a log whose first request the
// server refuses with 429 (too many streams) waits Retry-After and tries
// again (WithBusyRetry) instead of failing at once, and a watch
// reconnecting after a 429 waits its Retry-After, not only the backoff.
// Before, the first 429 failed the call and reconnections ignored
// Retry-After.
func TestStreamsWaitRetryAfter(t *testing.T) {
	type result struct {
		requests int
		waits    []time.Duration
		err      error
	}
	run := func(t *testing.T, s *streamServer, call func(context.Context, *client.Client) error) result {
		ts := httptest.NewServer(s)
		t.Cleanup(ts.Close)
		c := newClient(t, ts.URL)
		var (
			mu    sync.Mutex
			waits []time.Duration
		)
		client.SetWaiter(c, func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			waits = append(waits, d)
			mu.Unlock()
			return ctx.Err()
		})
		err := call(testContext(t), c)
		mu.Lock()
		defer mu.Unlock()
		return result{requests: s.count(), waits: waits, err: err}
	}
	watchUntil := func(cursor string) func(context.Context, *client.Client) error {
		return func(ctx context.Context, c *client.Client) error {
			_, err := c.Watch(ctx, client.WatchOptions{}, func(ev api.Event) error {
				if ev.Cursor == cursor {
					return client.ErrStopWatch
				}
				return nil
			})
			return err
		}
	}

	t.Run("watch, first connection", func(t *testing.T) {
		r := run(t, &streamServer{answers: []func(http.ResponseWriter){tooManyStreams("10"), tooManyStreams("10"), events("1")}}, watchUntil("1"))
		if r.err != nil || r.requests != 3 || !equalDurations(r.waits, []time.Duration{10 * time.Second, 10 * time.Second}) {
			t.Errorf("err %v, %d requests, waits %v; want the event after 3 requests and two waits of 10s", r.err, r.requests, r.waits)
		}
	})
	t.Run("watch, first connection, tries bounded", func(t *testing.T) {
		answers := make([]func(http.ResponseWriter), 10)
		for i := range answers {
			answers[i] = tooManyStreams("1")
		}
		r := run(t, &streamServer{answers: answers}, watchUntil("1"))
		if client.StatusCode(r.err) != http.StatusTooManyRequests || r.requests != client.DefaultBusyRetries+1 || !strings.Contains(r.err.Error(), "sent 6 times") {
			t.Errorf("err %v after %d requests; want the 429 after %d", r.err, r.requests, client.DefaultBusyRetries+1)
		}
	})
	t.Run("watch, reconnection", func(t *testing.T) {
		r := run(t, &streamServer{answers: []func(http.ResponseWriter){events("1"), tooManyStreams("10"), events("2")}}, watchUntil("2"))
		if r.err != nil || r.requests != 3 || len(r.waits) != 2 || r.waits[1] != 10*time.Second {
			t.Errorf("err %v, %d requests, waits %v; want the second event after 3 requests, waiting 10s after the 429", r.err, r.requests, r.waits)
		}
	})
	t.Run("log, first request", func(t *testing.T) {
		logBody := func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set(api.HeaderLogComplete, "true")
			_, _ = w.Write([]byte("hello\n"))
		}
		attempt := 0
		r := run(t, &streamServer{answers: []func(http.ResponseWriter){tooManyStreams("3"), logBody}}, func(ctx context.Context, c *client.Client) error {
			lr, err := c.Logs(ctx, "t-1", client.LogOptions{Attempt: &attempt})
			if err != nil {
				return err
			}
			defer lr.Close()
			b, err := io.ReadAll(lr)
			if err == nil && string(b) != "hello\n" {
				err = fmt.Errorf("log %q", b)
			}
			return err
		})
		if r.err != nil || r.requests != 2 || !equalDurations(r.waits, []time.Duration{3 * time.Second}) {
			t.Errorf("err %v, %d requests, waits %v; want the log after 2 requests and a wait of 3s", r.err, r.requests, r.waits)
		}
	})
}
