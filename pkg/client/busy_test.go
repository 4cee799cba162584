package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubetask/kubetask/pkg/client"
)

// busy answers the first n requests 429 with Retry-After retryAfter (none
// when empty; n < 0: every request), as kubetask serve does when a limit on
// requests in flight is reached, then a task.
type busy struct {
	n          int
	retryAfter string
	ok         int

	mu       sync.Mutex
	requests int
}

func (b *busy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	b.requests++
	n := b.requests
	b.mu.Unlock()
	if b.n < 0 || n <= b.n {
		if b.retryAfter != "" {
			w.Header().Set("Retry-After", b.retryAfter)
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"title":"Too Many Requests","status":429,"detail":"too many requests at once: 4 requests in flight for admin is reached; retry after Retry-After seconds"}`))
		return
	}
	answerTask(b.ok)(w, r)
}

func (b *busy) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.requests
}

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
			b := &busy{n: tc.busy, retryAfter: tc.retryAfter, ok: tc.ok}
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
			if got := b.count(); got != tc.requests {
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
	ts := httptest.NewServer(&busy{n: -1, retryAfter: "30", ok: 200})
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
