package server_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
)

// A body that trickles in is cut off after BodyTimeout: 408, connection
// closed.
func TestSlowBodyTimesOut(t *testing.T) {
	h := newHarness(t, func(c *server.Config) {
		c.Auth = exhaustTokens(t)
		c.BodyTimeout = 300 * time.Millisecond
		c.WriteTimeout = 300 * time.Millisecond
	})
	c, err := net.Dial("tcp", h.ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST %s/namespaces/team-a/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\nContent-Type: application/yaml\r\nContent-Length: 1000\r\n\r\n", api.Prefix)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // a byte every 50 ms, for ever
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				if _, err := c.Write([]byte("a")); err != nil {
					return
				}
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 4096)
	n, err := c.Read(b)
	if !strings.HasPrefix(string(b[:n]), "HTTP/1.1 408") {
		t.Fatalf("answer %q (%v), want 408 after the body timeout", b[:n], err)
	}
}

// streamsOpen is the kubetask_api_streams gauge of kind.
func streamsOpen(t *testing.T, reg *prometheus.Registry, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kubetask_api_streams" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == kind {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// A watch whose client never reads is dropped once a write waited
// WriteTimeout: its stream ends while the client still holds the
// connection.
func TestNonReadingWatchIsDropped(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, func(c *server.Config) { c.Registry = reg; c.WriteTimeout = 300 * time.Millisecond })
	tk := h.mustSubmit("default", taskDoc("noisy"))
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", h.ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET %s/watch HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", api.Prefix) // and never read
	waitFor(t, "the watch to open", func() bool { return streamsOpen(t, reg, "watch") == 1 })
	msg := strings.Repeat("x", 32<<10)
	for range 400 { // 12.8 MiB: more than the socket buffers hold
		h.publish(tk.ID, msg)
	}
	waitFor(t, "the stream of a client that does not read to end", func() bool { return streamsOpen(t, reg, "watch") == 0 })
}

// One caller's requests in flight are bounded: beyond the limit, 429 with
// Retry-After; another caller is still served.
func TestRequestsPerCallerLimited(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Auth = exhaustTokens(t); c.MaxRequestsPerCaller = 1 })
	// A trickling POST body holds a request slot. The first GET below may
	// reach the server before the POST does and hold alice's one slot:
	// then the POST is the one refused (429, its connection closed), and
	// no GET after it ever is (CI of 798bea1). A POST that was answered
	// is sent again, on a new connection, between two GETs.
	var c net.Conn
	hold := func() {
		if c != nil {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
			var ne net.Error
			if n, err := c.Read(make([]byte, 1)); n == 0 && errors.As(err, &ne) && ne.Timeout() {
				return // no answer: waiting for its body, it holds the slot
			}
			c.Close()
		}
		var err error
		if c, err = net.Dial("tcp", h.ts.Listener.Addr().String()); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST %s/namespaces/team-a/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\nContent-Type: application/yaml\r\nContent-Length: 1000\r\n\r\nabc", api.Prefix)
	}
	hold()
	defer func() { c.Close() }()
	var last *http.Response
	waitFor(t, "alice's second request to be refused", func() bool {
		hold()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.ts.URL+api.Prefix+"/tasks?namespace=team-a", nil)
		req.Header.Set("Authorization", "Bearer a")
		resp, err := h.ts.Client().Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		last = resp
		return resp.StatusCode == http.StatusTooManyRequests
	})
	if last.Header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	if r, b := h.do(http.MethodGet, api.Prefix+"/tasks?namespace=team-a", nil, bearer("b")...); r.StatusCode != 200 {
		t.Fatalf("bob: %s %s", r.Status, b)
	}
}

// waitFor polls cond every 20 ms until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The streams gauge counts a stream's slot until it is given back: a caller
// at its limit of one stream, who closes its watch and sees the gauge at 0,
// opens the next at once, never a 429 (e2eserve's exhaustion test was
// refused once when the gauge fell before the slot was given back).
func TestStreamsGaugeFallsWithTheSlot(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, func(c *server.Config) {
		c.Registry = reg
		c.Auth = exhaustTokens(t)
		c.MaxStreamsPerCaller = 1
	})
	for i := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.ts.URL+api.Prefix+"/watch?namespace=team-a", nil)
		req.Header.Set("Authorization", "Bearer a")
		resp, err := h.ts.Client().Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			cancel()
			t.Fatalf("watch %d, opened after the gauge read 0: %s", i, resp.Status)
		}
		if got := streamsOpen(t, reg, "watch"); got != 1 {
			t.Fatalf("watch %d open: gauge %v, want 1", i, got)
		}
		cancel()
		resp.Body.Close()
		waitFor(t, "the closed watch to leave the gauge", func() bool { return streamsOpen(t, reg, "watch") == 0 })
	}
}
