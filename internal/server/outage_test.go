package server_test

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/store"
)

// outageServer starts a PostgreSQL server of the test's own (one it may
// stop), or skips the test when the tests must not start one.
func outageServer(t *testing.T) *pgtest.Server {
	t.Helper()
	if os.Getenv(pgtest.SkipEnv) == "1" {
		t.Skip(pgtest.SkipEnv + "=1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	return srv
}

// TestStoreOutageIs503: while PostgreSQL is stopped, every call that needs
// the store is answered 503 with Retry-After (problem+json), not 500; once
// it is back, the same calls succeed without a restart of the server.
func TestStoreOutageIs503(t *testing.T) {
	srv := outageServer(t)
	st, err := store.OpenPostgres(context.Background(), srv.Database(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h := newHarnessOn(t, st, func(c *server.Config) { c.Registry = reg })
	h.mustSubmit("default", taskDoc("before"), "Idempotency-Key", "before")

	if err := srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	yaml := []string{"Content-Type", "application/yaml"}
	calls := map[string]struct {
		method, path string
		body         string
		hdr          []string
	}{
		"submit with an ID":    {http.MethodPost, api.Prefix + "/namespaces/default/tasks?id=during", taskDoc("during"), yaml},
		"submit without an ID": {http.MethodPost, api.Prefix + "/namespaces/default/tasks", taskDoc("during"), yaml},
		"get":                  {method: http.MethodGet, path: api.Prefix + "/tasks/before"},
		"list":                 {method: http.MethodGet, path: api.Prefix + "/tasks"},
		"cancel":               {method: http.MethodPost, path: api.Prefix + "/tasks/before/cancel"},
		"rerun":                {method: http.MethodPost, path: api.Prefix + "/tasks/before/rerun"},
		"logs":                 {method: http.MethodGet, path: api.Prefix + "/tasks/before/logs"},
		"watch of a task":      {method: http.MethodGet, path: api.Prefix + "/tasks/before/watch"},
	}
	for name, c := range calls {
		t.Run(name, func(t *testing.T) {
			var body []byte
			if c.body != "" {
				body = []byte(c.body)
			}
			resp, b := h.do(c.method, c.path, body, c.hdr...)
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("%s, want 503: %s", resp.Status, b)
			}
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 {
				t.Errorf("Retry-After %q, want a number of seconds", resp.Header.Get("Retry-After"))
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q", ct)
			}
			if p := problemOf(t, b); p.Status != http.StatusServiceUnavailable {
				t.Errorf("problem %+v", p)
			}
		})
	}

	// pkg/client tries again after each 503's Retry-After: a submission
	// made during the outage succeeds once PostgreSQL is back.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.New(h.ts.URL, client.WithUnavailableRetry(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		created bool
		err     error
	}
	done := make(chan result, 1)
	before := served503(t, reg)
	go func() {
		_, created, err := c.Submit(ctx, "default", []byte(taskDoc("during")), client.SubmitOptions{ID: "during"})
		done <- result{created, err}
	}()
	for served503(t, reg) < before+2 { // answered 503 and tried again
		select {
		case r := <-done:
			t.Fatalf("the submission ended during the outage: %+v", r)
		case <-ctx.Done():
			t.Fatal("the client did not try again")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || !r.created {
		t.Fatalf("submission during the outage: created %v, %v", r.created, r.err)
	}
	// The pool connects again on its own: the next calls succeed.
	if resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/before", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("get after the restart: %s %s", resp.Status, b)
	}
	if resp, _ := h.submit("default", taskDoc("after"), "Idempotency-Key", "after"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("submit after the restart: %s", resp.Status)
	}
}

// served503 is the number of 503 answers the server counted.
func served503(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "kubetask_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "code" && l.GetValue() == "503" {
					n += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return n
}
