package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
)

// The tests of this file bound what one request may cost the service, an
// unauthenticated one included (issue 33, the Low items).

// A refusal before the body was read (here a POST without a token, its
// small body sent a byte every 2 s) is answered at once and its connection
// closed: it held the connection for BodyTimeout (30 s) before, as net/http
// read the rest of the body to reuse the connection.
func TestRefusalBeforeTheBodyClosesTheConnection(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Auth = isolationTokens(t) })
	c, err := net.Dial("tcp", h.ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, _ = io.WriteString(c, "POST "+api.Prefix+"/namespaces/team-a/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			if _, err := c.Write([]byte("a")); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("%s, Connection: close %v: want 401 with Connection: close", resp.Status, resp.Close)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	// Closed: an end of stream, or a reset when the server closed with body
	// bytes it had not read in its socket (the kernel answers them with a
	// RST; CI of f44a335). A connection left open ends the read at the
	// deadline instead, which fails.
	if _, err := r.ReadByte(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after the answer: %v, want the connection closed", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("answered and closed after %v, want at once", d)
	}

	// A request whose body was read keeps its connection.
	resp2, _ := h.do(http.MethodPost, api.Prefix+"/namespaces/team-a/tasks", []byte(taskDoc("x")), append(bearer("a"), "Content-Type", "application/yaml")...)
	if resp2.StatusCode != http.StatusCreated || resp2.Close {
		t.Fatalf("a submission: %s, Connection: close %v, want 201 keeping the connection", resp2.Status, resp2.Close)
	}
}

// An audit line keeps at most 32 bytes of a method and 2 KiB of a path (a
// path of the API is at most about 1.6 KB): an unauthenticated request with
// a 60 KB path wrote a 60 KB line before.
func TestAuditLinesAreBounded(t *testing.T) {
	var buf syncBuffer
	h := newHarness(t, func(c *server.Config) {
		c.Auth = isolationTokens(t)
		c.AuditLogger = slog.New(slog.NewJSONHandler(&buf, nil))
	})
	h.do(strings.Repeat("P", 200), "/"+strings.Repeat("x", 60000), nil)
	buf.mu.Lock()
	line := buf.b.String()
	buf.mu.Unlock()
	if len(line) > 3000 || !strings.Contains(line, "...(60001 bytes)") || !strings.Contains(line, "...(200 bytes)") {
		t.Fatalf("audit line of %d bytes: %.400s, want at most 3000 saying how long method and path were", len(line), line)
	}
}

// GETs of a Pending task list its pod's events once per PodEventsTTL, not
// once each: a tenant polling a task that never schedules spent the
// service's shared client (QPS 50) for every tenant before.
func TestPendingTaskEventsAreListedOncePerTTL(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Auth = isolationTokens(t) })
	tk := h.mustSubmit("team-a", taskDoc("stuck"), bearer("a")...)
	ctx := context.Background()
	rec, err := h.store.Get(ctx, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec.PodCreated = true
	if _, err := h.store.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	before := len(h.client.Actions())
	for range 300 {
		if resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID, nil, bearer("a")...); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s", resp.Status, b)
		}
	}
	lists := 0
	for _, a := range h.client.Actions()[before:] {
		if a.GetVerb() == "list" && a.GetResource().Resource == "events" {
			lists++
		}
	}
	if lists > 2 {
		t.Fatalf("300 GETs of a Pending task within the TTL: %d events LISTs, want 1", lists)
	}
}

// A labels filter has at most server.MaxLabelTerms terms: more is a 400
// that names the cap. 999 terms were a 500 on SQLite before (too many
// conditions in one query).
func TestLabelFilterTermsCapped(t *testing.T) {
	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessOn(t, st, func(c *server.Config) { c.Auth = isolationTokens(t) })
	h.mustSubmit("team-a", taskDoc("job", "k0", "v"), bearer("a")...)
	terms := func(n int) string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("k%d=v", i))
		}
		return strings.Join(out, ",")
	}
	for _, path := range []string{api.Prefix + "/tasks?namespace=team-a&labels=", api.Prefix + "/watch?namespace=team-a&labels="} {
		if resp, b := h.do(http.MethodGet, api.Prefix+"/tasks?namespace=team-a&labels="+terms(server.MaxLabelTerms), nil, bearer("a")...); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d terms: %s %s", server.MaxLabelTerms, resp.Status, b)
		}
		resp, b := h.do(http.MethodGet, path+terms(999), nil, bearer("a")...)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), fmt.Sprintf("at most %d", server.MaxLabelTerms)) {
			t.Fatalf("%s999 terms: %s %s, want 400 naming the cap", path, resp.Status, b)
		}
	}
}
