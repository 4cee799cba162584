package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kubetask/kubetask/pkg/client"
)

// flaky answers the first n requests (n < 0: every request) with status
// (503 when 0: the store cannot be reached; 429: a limit on requests in
// flight is reached), with Retry-After when set, as kubetask serve does, then
// what ok writes; it records when each request arrived.
type flaky struct {
	status     int
	n          int
	retryAfter string
	ok         func(w http.ResponseWriter, r *http.Request)

	mu    sync.Mutex
	times []time.Time
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.times = append(f.times, time.Now())
	n := len(f.times)
	f.mu.Unlock()
	if f.n < 0 || n <= f.n {
		if f.retryAfter != "" {
			w.Header().Set("Retry-After", f.retryAfter)
		}
		w.Header().Set("Content-Type", "application/problem+json")
		if f.status == http.StatusTooManyRequests {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"title":"Too Many Requests","status":429,"detail":"too many requests at once: 4 requests in flight for admin is reached; retry after Retry-After seconds"}`))
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"title":"Service Unavailable","status":503,"detail":"the task store cannot be reached now; try again"}`))
		return
	}
	f.ok(w, r)
}

func (f *flaky) requests() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.times...)
}

func answerTask(status int) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"id":"t-1","namespace":"default","name":"x","phase":"Pending"}`))
	}
}

// TestUnavailableIsRetried: a call that is safe to repeat is sent again
// after a 503, after the answer's Retry-After (else the backoff), within
// the WithUnavailableRetry bound; one that is not (a submission without an
// ID) returns the 503.
func TestUnavailableIsRetried(t *testing.T) {
	submitWithID := func(ctx context.Context, c *client.Client) error {
		_, created, err := c.Submit(ctx, "default", []byte(taskDoc("x")), client.SubmitOptions{ID: "t-1"})
		if err == nil && !created {
			return errors.New("created = false for a 201")
		}
		return err
	}
	get := func(ctx context.Context, c *client.Client) error { _, err := c.Get(ctx, "t-1"); return err }
	for name, tc := range map[string]struct {
		unavailable int // 503s before the answer; -1: always
		retryAfter  string
		ok          int
		opts        []client.Option
		call        func(context.Context, *client.Client) error
		requests    int
		want503     bool
		// minGap is the least time between the first two requests.
		minGap time.Duration
	}{
		"get after Retry-After": {
			unavailable: 1, retryAfter: "1", ok: 200, call: get, requests: 2, minGap: time.Second,
		},
		"submit with an ID, backoff without Retry-After": {
			unavailable: 3, ok: 201, call: submitWithID, requests: 4,
		},
		"submit with an Idempotency-Key": {
			unavailable: 2, ok: 201, requests: 3,
			call: func(ctx context.Context, c *client.Client) error {
				_, _, err := c.Submit(ctx, "default", []byte(taskDoc("x")), client.SubmitOptions{IdempotencyKey: "t-1"})
				return err
			},
		},
		"cancel": {
			unavailable: 2, ok: 200, requests: 3,
			call: func(ctx context.Context, c *client.Client) error { _, err := c.Cancel(ctx, "t-1"); return err },
		},
		"list": {
			unavailable: 2, ok: 200, requests: 3,
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.List(ctx, client.ListOptions{})
				return err
			},
		},
		"submit without an ID is not repeated": {
			unavailable: 1, ok: 201, requests: 1, want503: true,
			call: func(ctx context.Context, c *client.Client) error {
				_, _, err := c.Submit(ctx, "default", []byte(taskDoc("x")), client.SubmitOptions{})
				return err
			},
		},
		"rerun without an ID is not repeated": {
			unavailable: 1, ok: 201, requests: 1, want503: true,
			call: func(ctx context.Context, c *client.Client) error {
				_, _, err := c.Rerun(ctx, "t-0", client.RerunOptions{})
				return err
			},
		},
		"retries off": {
			unavailable: 1, ok: 200, call: get, requests: 1, want503: true, opts: []client.Option{client.WithUnavailableRetry(0)},
		},
		"bound reached": {
			unavailable: -1, ok: 200, call: get, want503: true, opts: []client.Option{client.WithUnavailableRetry(30 * time.Millisecond)},
		},
		"Retry-After beyond the bound": {
			unavailable: -1, retryAfter: "5", ok: 200, call: get, requests: 1, want503: true,
			opts: []client.Option{client.WithUnavailableRetry(time.Second)},
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := &flaky{n: tc.unavailable, retryAfter: tc.retryAfter, ok: answerTask(tc.ok)}
			ts := httptest.NewServer(f)
			t.Cleanup(ts.Close)
			c := newClient(t, ts.URL, tc.opts...)
			err := tc.call(testContext(t), c)
			if got := client.IsUnavailable(err); got != tc.want503 {
				t.Fatalf("error %v; want a 503: %v", err, tc.want503)
			}
			if !tc.want503 && err != nil {
				t.Fatal(err)
			}
			times := f.requests()
			if tc.requests > 0 && len(times) != tc.requests {
				t.Errorf("%d requests, want %d", len(times), tc.requests)
			}
			if tc.requests == 0 && len(times) < 2 {
				t.Errorf("%d requests, want several within the bound", len(times))
			}
			if tc.minGap > 0 && len(times) > 1 && times[1].Sub(times[0]) < tc.minGap {
				t.Errorf("tried again after %s, before the Retry-After of %s", times[1].Sub(times[0]), tc.minGap)
			}
			var e *client.Error
			if tc.want503 && errors.As(err, &e) && tc.retryAfter != "" && e.RetryAfter.String() != tc.retryAfter+"s" {
				t.Errorf("Error.RetryAfter %s, want %ss", e.RetryAfter, tc.retryAfter)
			}
		})
	}
}

// TestUnavailableRetryEndsWithTheContext: a context that ends while the
// client waits to try again ends the call with the context's error.
func TestUnavailableRetryEndsWithTheContext(t *testing.T) {
	ts := httptest.NewServer(&flaky{n: -1, retryAfter: "30", ok: answerTask(200)})
	t.Cleanup(ts.Close)
	c := newClient(t, ts.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Get(ctx, "t-1")
	if !errors.Is(err, context.DeadlineExceeded) || !client.IsUnavailable(err) {
		t.Fatalf("got %v, want the context's error and the 503", err)
	}
}
