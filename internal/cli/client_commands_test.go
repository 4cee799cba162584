package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client/clienttest"
)

// isolate keeps the commands from the user's client config and environment.
func isolate(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("HOME", dir)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	for _, env := range []string{EnvServer, EnvToken, EnvCAFile, EnvClientConfig} {
		t.Setenv(env, "")
	}
}

// lockedBuffer is written by a command and read by the test meanwhile.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// cliRun is a kubetask command line running (or done).
type cliRun struct {
	stdout, stderr lockedBuffer
	done           chan struct{}
	code           int
}

// start runs kubetask with args (stdin as its input) until it ends or ctx
// does.
func start(ctx context.Context, stdin string, args ...string) *cliRun {
	r := &cliRun{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		root := NewRootCommand(&r.stdout, &r.stderr)
		root.SetIn(strings.NewReader(stdin))
		root.SetArgs(args)
		err := root.ExecuteContext(ctx)
		// As Execute does.
		var ee *ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			if ee.Err != nil {
				fmt.Fprintln(&r.stderr, "error:", ee.Err)
			}
			r.code = ee.Code
		default:
			fmt.Fprintln(&r.stderr, "error:", err)
			r.code = 1
		}
	}()
	return r
}

// wait waits for the command's end (the test fails after 20s).
func (r *cliRun) wait(t *testing.T) *cliRun {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the command did not end; stdout %q, stderr %q", r.stdout.String(), r.stderr.String())
	}
	return r
}

func (r *cliRun) expect(t *testing.T, code int, stdout string, stderr ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d; stderr:\n%s", r.code, code, r.stderr.String())
	}
	if stdout != "*" && r.stdout.String() != stdout {
		t.Errorf("stdout %q, want %q", r.stdout.String(), stdout)
	}
	for _, s := range stderr {
		if !strings.Contains(r.stderr.String(), s) {
			t.Errorf("stderr %q does not contain %q", r.stderr.String(), s)
		}
	}
}

func kubetask(t *testing.T, stdin string, args ...string) *cliRun {
	t.Helper()
	return start(context.Background(), stdin, args...).wait(t)
}

func writeTask(t *testing.T, name string, extra ...string) string {
	t.Helper()
	doc := fmt.Sprintf(`apiVersion: kubetask.dev/v1alpha1
kind: Task
metadata:
  name: %s
%sspec:
  template:
    spec:
      containers:
      - name: main
        image: busybox:1.37
        command: [echo, hi]
`, name, strings.Join(extra, ""))
	p := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSubmitGetListCancelRerun(t *testing.T) {
	isolate(t)
	srv := clienttest.New(t, clienttest.Options{})
	t.Setenv(EnvServer, srv.URL)
	file := writeTask(t, "hello", "  labels: {team: data}\n")

	kubetask(t, "", "submit", "-f", file, "--id", "job-1").expect(t, 0, "job-1\n", "task job-1 submitted: default/hello")
	kubetask(t, "", "submit", "-f", file, "--id", "job-1").expect(t, 0, "job-1\n", "task job-1 exists already with the same document (default/hello): Pending")
	kubetask(t, "", "submit", "-f", writeTask(t, "other"), "--id", "job-1").expect(t, ExitUsage, "", `409 Conflict: task ID "job-1" is taken by a different document`)
	kubetask(t, "", "submit", "-f", writeTask(t, "bad", "  namespace: jobs\n"), "-n", "other").expect(t, ExitUsage, "", `the task's metadata.namespace "jobs" does not match -n "other"`)
	kubetask(t, "", "submit").expect(t, ExitUsage, "", "-f FILE is required")
	kubetask(t, "", "submit", "-f", file, "--follow", "-o", "json").expect(t, ExitUsage, "", "--follow prints the log on stdout")

	// From stdin, the namespace from the document, JSON out.
	doc, _ := os.ReadFile(writeTask(t, "from-stdin", "  namespace: jobs\n"))
	r := kubetask(t, string(doc), "submit", "-f", "-", "-o", "json", "-q")
	r.expect(t, 0, "*")
	var tk api.Task
	if err := json.Unmarshal([]byte(r.stdout.String()), &tk); err != nil || tk.Namespace != "jobs" || tk.Name != "from-stdin" {
		t.Fatalf("submit -o json: %v %q", err, r.stdout.String())
	}
	if r.stderr.String() != "" {
		t.Errorf("-q printed %q", r.stderr.String())
	}

	r = kubetask(t, "", "get", "job-1")
	r.expect(t, 0, "*")
	for _, want := range []string{"ID:         job-1\n", "Namespace:  default\n", "Labels:     team=data\n", "State:      Pending/Submitted\n", "Pending: Submitted; no pod events yet\n"} {
		if !strings.Contains(r.stdout.String(), want) {
			t.Errorf("get: %q does not contain %q", r.stdout.String(), want)
		}
	}
	r = kubetask(t, "", "get", "job-1", "-o", "yaml")
	if r.expect(t, 0, "*"); !strings.Contains(r.stdout.String(), "id: job-1\n") || !strings.Contains(r.stdout.String(), "document:\n") {
		t.Errorf("get -o yaml: %q", r.stdout.String())
	}
	kubetask(t, "", "get", "nope").expect(t, 1, "", `404 Not Found: no task "nope"`)
	kubetask(t, "", "get", "job-1", "-o", "table").expect(t, ExitUsage, "", "-o must be json or yaml")

	r = kubetask(t, "", "list")
	r.expect(t, 0, "*")
	lines := strings.Split(strings.TrimSpace(r.stdout.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[0], "ATTEMPTS") || !strings.HasPrefix(lines[2], "job-1 ") {
		t.Errorf("list:\n%s", r.stdout.String())
	}
	r = kubetask(t, "", "list", "--limit", "1")
	r.expect(t, 0, "*", "more tasks: add --continue ")
	if n := strings.Count(r.stdout.String(), "\n"); n != 2 {
		t.Errorf("list --limit 1: %d lines:\n%s", n, r.stdout.String())
	}
	token := strings.TrimSpace(strings.TrimPrefix(r.stderr.String(), "more tasks: add --continue "))
	r = kubetask(t, "", "list", "--limit", "1", "--continue", token)
	if r.expect(t, 0, "*"); !strings.Contains(r.stdout.String(), "job-1") || strings.Contains(r.stderr.String(), "more tasks") {
		t.Errorf("the second page: %q %q", r.stdout.String(), r.stderr.String())
	}
	r = kubetask(t, "", "list", "-l", "team=data", "-o", "json")
	var l api.TaskList
	if err := json.Unmarshal([]byte(r.stdout.String()), &l); err != nil || len(l.Items) != 1 || l.Items[0].ID != "job-1" {
		t.Errorf("list -l team=data -o json: %v %q", err, r.stdout.String())
	}
	r = kubetask(t, "", "list", "-n", "jobs", "-o", "wide")
	if r.expect(t, 0, "*"); !strings.Contains(r.stdout.String(), "LABELS") || !strings.Contains(r.stdout.String(), "from-stdin") || strings.Contains(r.stdout.String(), "job-1") {
		t.Errorf("list -n jobs -o wide:\n%s", r.stdout.String())
	}
	kubetask(t, "", "list", "--phase", "Sleeping").expect(t, 1, "", "query.phase: must be one of Pending, Running, Succeeded, Failed")
	kubetask(t, "", "list", "--cluster", "East_1").expect(t, 1, "", "query.cluster: must be a cluster name")
	kubetask(t, "", "list", "-n", "empty").expect(t, 0, "", "no tasks")

	kubetask(t, "", "rerun", "job-1").expect(t, ExitUsage, "", `409 Conflict: task "job-1" is not finished`)
	kubetask(t, "", "cancel", "job-1").expect(t, 0, "task job-1: cancellation requested (Pending/Submitted); kubetask get job-1 shows the outcome\n")
	kubetask(t, "", "cancel", "job-1").expect(t, 0, "task job-1: cancellation was requested already (Pending/Submitted)\n")
	srv.Finish(t, "job-1", "Failed", "Cancelled", "cancelled", 137, false)
	kubetask(t, "", "cancel", "job-1").expect(t, 0, "task job-1 finished already (Failed/Cancelled): nothing to cancel\n")
	kubetask(t, "", "cancel", "nope").expect(t, 1, "", `404 Not Found`)
	kubetask(t, "", "rerun", "job-1", "--id", "job-2").expect(t, 0, "job-2\n", "task job-2 submitted as a rerun of job-1: default/hello")
	if r := kubetask(t, "", "get", "job-2"); !strings.Contains(r.stdout.String(), "Rerun of:   job-1\n") {
		t.Errorf("get of the rerun: %q", r.stdout.String())
	}
}

// TestSubmitWaitExitsWithTheOutcome: submit --wait exits as kubetask run
// does for the same outcome.
func TestSubmitWaitExitsWithTheOutcome(t *testing.T) {
	isolate(t)
	srv := clienttest.New(t, clienttest.Options{})
	file := writeTask(t, "hello")
	for name, tc := range map[string]struct {
		phase, reason string
		exit          int32
		code          int
		stderr        string
	}{
		"succeeded":        {"Succeeded", "Completed", 0, 0, "outcome: Succeeded/Completed: done (task"},
		"main exit code":   {"Failed", "ExitCode", 3, 3, "outcome: FAILED Failed/ExitCode: done (task"},
		"out of memory":    {"Failed", "OOMKilled", 137, ExitOOMKilled, "outcome: FAILED Failed/OOMKilled"},
		"never scheduled":  {"Failed", "ScheduleTimeout", 0, ExitSchedule, "outcome: FAILED Failed/ScheduleTimeout"},
		"cancelled by API": {"Failed", "Cancelled", 137, ExitCancelledSIGINT, "outcome: FAILED Failed/Cancelled"},
	} {
		t.Run(name, func(t *testing.T) {
			id := strings.ReplaceAll(name, " ", "-")
			r := start(context.Background(), "", "submit", "-f", file, "--id", id, "--wait", "--server", srv.URL)
			srv.WaitForRequest(t, "GET "+api.Prefix+"/tasks/"+id+"/watch")
			srv.SetState(t, id, "Running", "Running", "main is running", true)
			srv.Finish(t, id, tc.phase, tc.reason, "done", tc.exit, false)
			r.wait(t).expect(t, tc.code, "", tc.stderr)
		})
	}
	// -o json: the finished task on stdout.
	r := start(context.Background(), "", "submit", "-f", file, "--id", "json", "--wait", "-o", "json", "--server", srv.URL)
	srv.WaitForRequest(t, "GET "+api.Prefix+"/tasks/json/watch")
	srv.Finish(t, "json", "Succeeded", "Completed", "", 0, false)
	r.wait(t).expect(t, 0, "*")
	var tk api.Task
	if err := json.Unmarshal([]byte(r.stdout.String()), &tk); err != nil || !tk.Terminal {
		t.Fatalf("%v %q", err, r.stdout.String())
	}
}

func TestSubmitWaitStopsOnASignal(t *testing.T) {
	isolate(t)
	srv := clienttest.New(t, clienttest.Options{})
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	r := start(ctx, "", "submit", "-f", writeTask(t, "hello"), "--id", "long", "--wait", "--server", srv.URL)
	srv.WaitForRequest(t, "GET "+api.Prefix+"/tasks/long/watch")
	cancel(Signalled{Signal: syscall.SIGTERM})
	r.wait(t).expect(t, ExitCancelledTERM, "", "stopped waiting; task long goes on (kubetask get long, kubetask cancel long)")
}

// TestSubmitFollowPrintsEachAttemptsLogThenTheOutcome: the log of every
// attempt, byte for byte, then the outcome and its exit code.
func TestSubmitFollowPrintsEachAttemptsLogThenTheOutcome(t *testing.T) {
	isolate(t)
	srv := clienttest.New(t, clienttest.Options{})
	r := start(context.Background(), "", "submit", "-f", writeTask(t, "hello"), "--id", "f", "--follow", "--server", srv.URL)
	srv.WaitForRequest(t, "GET "+api.Prefix+"/tasks/f/logs")
	srv.SetState(t, "f", "Running", "Running", "", true)
	srv.AppendLog(t, "f", 0, "main", "fir", false)
	srv.AppendLog(t, "f", 0, "main", "st\n", true)
	srv.Finish(t, "f", "Failed", "Evicted", "node pressure", 137, true)
	srv.AppendLog(t, "f", 1, "main", "second\n\x00no newline", true)
	srv.Finish(t, "f", "Failed", "ExitCode", "exit 3", 3, false)
	r.wait(t).expect(t, 3, "first\nsecond\n\x00no newline",
		"--- log of attempt 1 ---", "outcome: FAILED Failed/ExitCode: exit 3 (task f, 2 attempts", "attempt 0 finished: Failed/Evicted: node pressure (another attempt follows)")
}

func TestSubmitFollowWithoutALogArchiveWaits(t *testing.T) {
	isolate(t)
	srv := clienttest.New(t, clienttest.Options{Configure: func(c *server.Config) { c.Logs = nil }})
	r := start(context.Background(), "", "submit", "-f", writeTask(t, "hello"), "--id", "f", "--follow", "--server", srv.URL)
	srv.WaitForRequest(t, "GET "+api.Prefix+"/tasks/f/watch")
	srv.Finish(t, "f", "Succeeded", "Completed", "", 0, false)
	r.wait(t).expect(t, 0, "", "the server keeps no logs", "outcome: Succeeded/Completed")
}

func TestLogsPrintsTheRawBytes(t *testing.T) {
	isolate(t)
	srv := clienttest.New(t, clienttest.Options{})
	t.Setenv(EnvServer, srv.URL)
	kubetask(t, "", "submit", "-f", writeTask(t, "hello"), "--id", "l").expect(t, 0, "l\n")
	raw := "line 1\n\xff\xfe binary\r\nno newline"
	srv.AppendLog(t, "l", 0, "main", raw, true)
	kubetask(t, "", "logs", "l").expect(t, 0, raw)
	kubetask(t, "", "logs", "l", "-f", "--attempt", "0", "-c", "main").expect(t, 0, raw)
	kubetask(t, "", "logs", "l", "-c", "envoy").expect(t, 1, "", `404 Not Found: task "l" keeps no log of container "envoy"`)
	kubetask(t, "", "logs", "l", "--attempt", "-1").expect(t, ExitUsage, "", "--attempt must be 0 or more")

	// -f goes on until the log is complete.
	srv.Finish(t, "l", "Failed", "Evicted", "", 137, true)
	srv.AppendLog(t, "l", 1, "main", "again\n", false)
	r := start(context.Background(), "", "logs", "l", "-f")
	srv.WaitForRequest(t, "GET "+api.Prefix+"/tasks/l/logs")
	srv.AppendLog(t, "l", 1, "main", "done\n", true)
	r.wait(t).expect(t, 0, "again\ndone\n")
}

func TestListWatchPrintsChanges(t *testing.T) {
	isolate(t)
	srv := clienttest.New(t, clienttest.Options{})
	t.Setenv(EnvServer, srv.URL)
	kubetask(t, "", "submit", "-f", writeTask(t, "old"), "--id", "old").expect(t, 0, "old\n")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	r := start(ctx, "", "list", "--watch", "-n", "default")
	srv.WaitForRequest(t, "GET "+api.Prefix+"/watch")
	kubetask(t, "", "submit", "-f", writeTask(t, "new"), "--id", "new").expect(t, 0, "new\n")
	srv.SetState(t, "new", "Running", "Running", "", true)
	srv.SetState(t, "new", "Running", "Running", "same state again", true)
	srv.Finish(t, "old", "Succeeded", "Completed", "", 0, false)
	want := []string{"old ", "new ", "new ", "old "}
	for deadline := time.Now().Add(10 * time.Second); strings.Count(r.stdout.String(), "\n") < 1+len(want); {
		if time.Now().After(deadline) {
			t.Fatalf("list --watch printed:\n%s", r.stdout.String())
		}
		time.Sleep(time.Millisecond)
	}
	cancel(Signalled{Signal: syscall.SIGINT})
	r.wait(t).expect(t, ExitCancelledSIGINT, "*")
	lines := strings.Split(strings.TrimSpace(r.stdout.String()), "\n")
	if len(lines) != 1+len(want) || !strings.HasPrefix(lines[0], "ID ") {
		t.Fatalf("list --watch printed:\n%s", r.stdout.String())
	}
	for i, prefix := range want {
		if !strings.HasPrefix(lines[i+1], prefix) {
			t.Errorf("line %d %q, want the row of %q", i+1, lines[i+1], prefix)
		}
	}
	if !strings.Contains(lines[3], "Running") || !strings.Contains(lines[4], "Succeeded") {
		t.Errorf("rows:\n%s", r.stdout.String())
	}
	if r.stderr.String() != "" {
		t.Errorf("stderr %q after Ctrl-C", r.stderr.String())
	}
}

func TestAuthenticationErrorsSayWhatToFix(t *testing.T) {
	isolate(t)
	auth, err := server.NewTokenAuth([]server.Token{{Token: "s3cret", Subject: "admin", Namespaces: server.Namespaces{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := clienttest.New(t, clienttest.Options{Configure: func(c *server.Config) { c.Auth = auth }})
	kubetask(t, "", "list", "--server", srv.URL).expect(t, 1, "",
		"401 Unauthorized: the server wants a bearer token: give the token printed by `kubetask serve` with --token or $KUBETASK_TOKEN")
	kubetask(t, "", "list", "--server", srv.URL, "--token", "wrong").expect(t, 1, "", "the server does not know the token from --token")

	t.Setenv(EnvToken, "s3cret")
	kubetask(t, "", "list", "--server", srv.URL).expect(t, 0, "", "no tasks")
	t.Setenv(EnvToken, "")

	// The client config file: server and token file.
	dir := filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "kubetask")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "client.yaml"), []byte("server: "+srv.URL+"\ntoken-file: token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kubetask(t, "", "list").expect(t, 0, "", "no tasks")
}

func TestConnectionErrorsSayWhatToFix(t *testing.T) {
	isolate(t)
	dead := httptest.NewServer(nil)
	dead.Close()
	kubetask(t, "", "get", "x", "--server", dead.URL).expect(t, 1, "",
		"cannot reach the kubetask server at "+dead.URL+" (from --server): start it with `kubetask serve`, or give its address with --server or $KUBETASK_SERVER")
	kubetask(t, "", "submit", "-f", writeTask(t, "x"), "--server", dead.URL).expect(t, ExitCluster, "", "cannot reach the kubetask server")
	kubetask(t, "", "get", "x", "--server", "127.0.0.1:8080").expect(t, ExitUsage, "", `server address "127.0.0.1:8080": want http://HOST:PORT`, "(from --server)")

	srv := clienttest.New(t, clienttest.Options{TLS: true})
	kubetask(t, "", "list", "--server", srv.URL).expect(t, 1, "", "cannot verify the certificate of the kubetask server at "+srv.URL+" (from --server): give its CA certificate with --ca-file")
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, srv.CAPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	kubetask(t, "", "list", "--server", srv.URL, "--ca-file", ca).expect(t, 0, "", "no tasks")
	kubetask(t, "", "list", "--server", strings.Replace(srv.URL, "https:", "http:", 1)).expect(t, 1, "")
}
