package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/client/clienttest"
)

func taskDoc(name string, labels ...string) string {
	var l string
	if len(labels) > 0 {
		l = "\n  labels:"
		for i := 0; i+1 < len(labels); i += 2 {
			l += fmt.Sprintf("\n    %s: %s", labels[i], labels[i+1])
		}
	}
	return fmt.Sprintf(`apiVersion: kubetask.dev/v1alpha1
kind: Task
metadata:
  name: %s%s
spec:
  template:
    spec:
      containers:
      - name: main
        image: busybox:1.37
        command: [echo, hi]
`, name, l)
}

// fast is the backoff of tests: reconnections within milliseconds.
var fast = client.WithRetryBackoff(time.Millisecond, 5*time.Millisecond)

func newClient(t *testing.T, url string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, append([]client.Option{fast}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func submit(t *testing.T, c *client.Client, ns, doc string, opts client.SubmitOptions) *api.Task {
	t.Helper()
	tk, created, err := c.Submit(testContext(t), ns, []byte(doc), opts)
	if err != nil || !created {
		t.Fatalf("submit: created %v, %v", created, err)
	}
	return tk
}

func TestSubmitIsIdempotent(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	ctx := testContext(t)

	first, created, err := c.Submit(ctx, "default", []byte(taskDoc("hello", "team", "data")), client.SubmitOptions{ID: "run-1"})
	if err != nil || !created || first.ID != "run-1" || first.Namespace != "default" || first.Labels["team"] != "data" || first.Phase != "Pending" {
		t.Fatalf("first submission: created %v, %+v, %v", created, first, err)
	}
	// The same document as JSON (detected), with the ID as Idempotency-Key:
	// the existing task.
	asJSON := `{"apiVersion":"kubetask.dev/v1alpha1","kind":"Task","metadata":{"name":"hello","labels":{"team":"data"}},
		"spec":{"template":{"spec":{"containers":[{"name":"main","image":"busybox:1.37","command":["echo","hi"]}]}}}}`
	again, created, err := c.Submit(ctx, "default", []byte(asJSON), client.SubmitOptions{IdempotencyKey: "run-1"})
	if err != nil || created || again.ID != "run-1" || !again.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("same document again: created %v, %+v, %v", created, again, err)
	}
	// Another document under the same ID: a conflict.
	_, _, err = c.Submit(ctx, "default", []byte(taskDoc("other")), client.SubmitOptions{ID: "run-1"})
	if !client.IsConflict(err) {
		t.Fatalf("another document under a taken ID: %v, want a 409", err)
	}
	// Without an ID: a new task each time.
	a := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	b := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	if a.ID == b.ID || a.ID == "" {
		t.Fatalf("server IDs %q and %q", a.ID, b.ID)
	}
}

// TestErrorsAreTyped: each refusal is an *Error with its status, the
// server's problem details and the matching helper.
func TestErrorsAreTyped(t *testing.T) {
	auth, err := server.NewTokenAuth([]server.Token{
		{Token: "root", Subject: "admin", Namespaces: server.Namespaces{"*"}},
		{Token: "alice", Subject: "alice", Namespaces: server.Namespaces{"team-a"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := clienttest.New(t, clienttest.Options{Configure: func(c *server.Config) { c.Auth = auth }})
	root := newClient(t, srv.URL, client.WithToken("root"))
	running := submit(t, root, "team-b", taskDoc("hello"), client.SubmitOptions{ID: "running"})
	invalid := strings.Replace(taskDoc("hello"), "image: busybox:1.37", "image: ''", 1)

	for name, tc := range map[string]struct {
		token  string
		call   func(ctx context.Context, c *client.Client) error
		status int
		is     func(error) bool
		// detail is a substring of the problem's detail; location that of
		// one of its errors.
		detail, location string
	}{
		"unknown task": {
			token: "root", status: 404, is: client.IsNotFound, detail: `no task "nope"`,
			call: func(ctx context.Context, c *client.Client) error { _, err := c.Get(ctx, "nope"); return err },
		},
		"taken ID": {
			token: "root", status: 409, is: client.IsConflict, location: "query.id",
			call: func(ctx context.Context, c *client.Client) error {
				_, _, err := c.Submit(ctx, "team-b", []byte(taskDoc("other")), client.SubmitOptions{ID: running.ID})
				return err
			},
		},
		"rerun of an unfinished task": {
			token: "root", status: 409, is: client.IsConflict, detail: "is not finished",
			call: func(ctx context.Context, c *client.Client) error {
				_, _, err := c.Rerun(ctx, running.ID, client.RerunOptions{})
				return err
			},
		},
		"no token": {
			status: 401, is: client.IsUnauthorized, detail: "missing bearer token",
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.List(ctx, client.ListOptions{})
				return err
			},
		},
		"unknown token": {
			token: "mallory", status: 401, is: client.IsUnauthorized, detail: "unknown or expired bearer token",
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.Watch(ctx, client.WatchOptions{}, func(api.Event) error { return nil })
				return err
			},
		},
		"another namespace": {
			token: "alice", status: 403, is: client.IsForbidden, detail: `alice may not submit tasks in namespace "team-b"`,
			call: func(ctx context.Context, c *client.Client) error {
				_, _, err := c.Submit(ctx, "team-b", []byte(taskDoc("x")), client.SubmitOptions{})
				return err
			},
		},
		"invalid task": {
			token: "root", status: 422, is: client.IsInvalid, location: "body.spec.template.spec.containers[0].image",
			call: func(ctx context.Context, c *client.Client) error {
				_, _, err := c.Submit(ctx, "team-a", []byte(invalid), client.SubmitOptions{})
				return err
			},
		},
		"bad filter": {
			token: "root", status: 400, is: func(err error) bool { return client.StatusCode(err) == 400 }, location: "query.phase",
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.List(ctx, client.ListOptions{Phase: "Sleeping"})
				return err
			},
		},
		"log of an unknown container": {
			token: "root", status: 404, is: client.IsNotFound, location: "query.container",
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.Logs(ctx, running.ID, client.LogOptions{Container: "sidecar"})
				return err
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, srv.URL, client.WithToken(tc.token))
			err := tc.call(testContext(t), c)
			var e *client.Error
			if !asError(err, &e) {
				t.Fatalf("got %v (%T), want an *Error", err, err)
			}
			if e.StatusCode != tc.status || e.Problem.Status != tc.status || !tc.is(err) {
				t.Fatalf("status %d, problem %+v; want %d", e.StatusCode, e.Problem, tc.status)
			}
			if !strings.Contains(e.Problem.Detail, tc.detail) {
				t.Errorf("detail %q, want it to contain %q", e.Problem.Detail, tc.detail)
			}
			if tc.location != "" && !hasLocation(e.Problem, tc.location) {
				t.Errorf("errors %+v, want one at %s", e.Problem.Errors, tc.location)
			}
			if !strings.Contains(err.Error(), fmt.Sprint(tc.status)) {
				t.Errorf("message %q does not say the status", err)
			}
		})
	}
}

func asError(err error, target **client.Error) bool { return errors.As(err, target) }

func hasLocation(p api.Problem, loc string) bool {
	for _, d := range p.Errors {
		if d.Location == loc {
			return true
		}
	}
	return false
}

func TestNonProblemAnswersAreErrorsToo(t *testing.T) {
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, "<html>upstream down</html>")
	}))
	defer proxy.Close()
	_, err := newClient(t, proxy.URL).Get(testContext(t), "x")
	var e *client.Error
	if !asError(err, &e) || e.StatusCode != 502 || e.Problem.Title != "Bad Gateway" || !strings.Contains(e.Problem.Detail, "upstream down") {
		t.Fatalf("got %#v", err)
	}
}

func TestListPagesToTheEnd(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	ctx := testContext(t)
	want := map[string]bool{}
	for i := range 7 {
		tk := submit(t, c, "default", taskDoc(fmt.Sprintf("job-%d", i), "team", "data"), client.SubmitOptions{})
		want[tk.ID] = true
	}
	submit(t, c, "default", taskDoc("other"), client.SubmitOptions{})
	submit(t, c, "elsewhere", taskDoc("job-x", "team", "data"), client.SubmitOptions{})

	opts := client.ListOptions{Namespace: "default", Labels: map[string]string{"team": "data"}, NamePrefix: "job-", Limit: 3}
	var pages int
	var prev *api.Task
	seen := map[string]bool{}
	for {
		page, err := c.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(page.Items) > 3 || page.Cursor == "" {
			t.Fatalf("page %d: %d items, cursor %q", pages, len(page.Items), page.Cursor)
		}
		for i := range page.Items {
			tk := &page.Items[i]
			if seen[tk.ID] || !want[tk.ID] {
				t.Fatalf("page %d: task %s (%s/%s) seen before or not wanted", pages, tk.ID, tk.Namespace, tk.Name)
			}
			if prev != nil && tk.CreatedAt.After(prev.CreatedAt) {
				t.Fatalf("not newest first: %s after %s", tk.ID, prev.ID)
			}
			seen[tk.ID], prev = true, tk
		}
		if page.Continue == "" {
			break
		}
		opts.Continue = page.Continue
	}
	if len(seen) != len(want) || pages < 3 {
		t.Fatalf("%d tasks in %d pages, want %d in at least 3", len(seen), pages, len(want))
	}

	// ListAll walks the same pages; a selector string works as the map.
	var all []string
	opts.Continue, opts.Labels, opts.LabelSelector = "", nil, "team=data"
	for tk, err := range c.ListAll(ctx, opts) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, tk.ID)
	}
	if len(all) != len(want) {
		t.Fatalf("ListAll: %d tasks, want %d", len(all), len(want))
	}
	// Stopping early stops the paging.
	for range c.ListAll(ctx, opts) {
		break
	}
	// A failing page ends the iteration with its error.
	for _, err := range c.ListAll(ctx, client.ListOptions{Continue: "garbage"}) {
		if client.StatusCode(err) != 400 {
			t.Fatalf("bad continue token: %v", err)
		}
	}
}

func TestListFilters(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	ctx := testContext(t)
	a := submit(t, c, "default", taskDoc("a"), client.SubmitOptions{})
	b := submit(t, c, "default", taskDoc("b"), client.SubmitOptions{})
	srv.Finish(t, b.ID, "Failed", "ExitCode", "exit 3", 3, false)
	yes, no := true, false
	for name, tc := range map[string]struct {
		opts client.ListOptions
		want []string
	}{
		"all":            {client.ListOptions{}, []string{b.ID, a.ID}},
		"phase":          {client.ListOptions{Phase: "Failed"}, []string{b.ID}},
		"reason":         {client.ListOptions{Reason: "ExitCode"}, []string{b.ID}},
		"terminal":       {client.ListOptions{Terminal: &yes}, []string{b.ID}},
		"not terminal":   {client.ListOptions{Terminal: &no}, []string{a.ID}},
		"created after":  {client.ListOptions{CreatedAfter: b.CreatedAt}, []string{b.ID}},
		"created before": {client.ListOptions{CreatedBefore: b.CreatedAt}, []string{a.ID}},
		"name prefix":    {client.ListOptions{NamePrefix: "a"}, []string{a.ID}},
	} {
		t.Run(name, func(t *testing.T) {
			l, err := c.List(ctx, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, tk := range l.Items {
				got = append(got, tk.ID)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCancelAndRerun(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	ctx := testContext(t)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})

	got, err := c.Cancel(ctx, tk.ID)
	if err != nil || got.ID != tk.ID || got.CancelledAt == nil {
		t.Fatalf("cancel: %+v %v", got, err)
	}
	if _, err := c.Cancel(ctx, "nope"); !client.IsNotFound(err) {
		t.Fatalf("cancel of an unknown task: %v", err)
	}
	srv.Finish(t, tk.ID, "Failed", "Cancelled", "cancelled", 137, false)
	re, created, err := c.Rerun(ctx, tk.ID, client.RerunOptions{ID: "again"})
	if err != nil || !created || re.ID != "again" || re.Origin != tk.ID || re.Name != "hello" || re.Terminal {
		t.Fatalf("rerun: created %v %+v %v", created, re, err)
	}
	re2, created, err := c.Rerun(ctx, tk.ID, client.RerunOptions{IdempotencyKey: "again"})
	if err != nil || created || re2.ID != "again" {
		t.Fatalf("rerun retried: created %v %+v %v", created, re2, err)
	}
}

func TestGetReportsAttemptsAndDocument(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	tk := submit(t, c, "default", taskDoc("hello"), client.SubmitOptions{})
	srv.Finish(t, tk.ID, "Failed", "Evicted", "node pressure", 137, true)
	srv.SetState(t, tk.ID, "Running", "Running", "main is running", true)
	got, err := c.Get(testContext(t), tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempt != 1 || len(got.Attempts) != 2 || got.Attempts[0].Reason != "Evicted" || got.Attempts[0].FinishedAt == nil ||
		got.Attempts[1].FinishedAt != nil || got.Phase != "Running" || len(got.Document) == 0 {
		t.Fatalf("%+v", got)
	}
}

func TestNew(t *testing.T) {
	for addr, ok := range map[string]bool{
		"http://127.0.0.1:8080":         true,
		"https://kubetask.example/api/": true,
		"127.0.0.1:8080":                false,
		"ftp://host":                    false,
		"http://":                       false,
		"http://u:p@host":               false,
		"http://host/?q=1":              false,
	} {
		if _, err := client.New(addr); (err == nil) != ok {
			t.Errorf("New(%q): %v", addr, err)
		}
	}
	c, err := client.New("https://kubetask.example/prefix/")
	if err != nil || c.BaseURL() != "https://kubetask.example/prefix" {
		t.Fatalf("%v %v", c, err)
	}
	if _, err := client.New(client.DefaultServer, client.WithCAFile(filepath.Join(t.TempDir(), "missing.pem"))); err == nil {
		t.Error("a missing CA file was accepted")
	}
	if _, err := client.New(client.DefaultServer, client.WithCA([]byte("not PEM"))); err == nil {
		t.Error("a CA without certificates was accepted")
	}
	if _, err := client.New(client.DefaultServer, client.WithRetryBackoff(time.Second, time.Millisecond)); err == nil {
		t.Error("a backoff whose max is below its min was accepted")
	}
}

func TestHeadersTokenAndUserAgent(t *testing.T) {
	got := make(chan http.Header, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x"}`)
	}))
	defer ts.Close()
	c := newClient(t, ts.URL, client.WithToken(" s3cret\n"), client.WithUserAgent("scheduler/1.0"))
	if _, err := c.Get(testContext(t), "x"); err != nil {
		t.Fatal(err)
	}
	h := <-got
	if h.Get("Authorization") != "Bearer s3cret" || h.Get("User-Agent") != "scheduler/1.0" || h.Get("Accept") != "application/json" {
		t.Fatalf("headers %v", h)
	}
}

func TestTLS(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{TLS: true})
	ctx := testContext(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, srv.CAPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		opts []client.Option
		ok   bool
	}{
		"CA file":              {[]client.Option{client.WithCAFile(caFile)}, true},
		"CA":                   {[]client.Option{client.WithCA(srv.CAPEM())}, true},
		"insecure":             {[]client.Option{client.WithInsecureSkipVerify()}, true},
		"system roots only":    {nil, false},
		"CA on a given client": {[]client.Option{client.WithHTTPClient(&http.Client{}), client.WithCAFile(caFile)}, true},
	} {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, srv.URL, tc.opts...)
			_, err := c.List(ctx, client.ListOptions{})
			if (err == nil) != tc.ok {
				t.Fatalf("list: %v", err)
			}
			if err != nil && !strings.Contains(err.Error(), "certificate") {
				t.Errorf("error %q does not say it is the certificate", err)
			}
		})
	}
}
