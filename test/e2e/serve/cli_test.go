package serve

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// cliResult is what one CLI command printed and its exit code.
type cliResult struct {
	stdout, stderr string
	code           int
}

// cli runs the kubetask CLI client against server with the service's token
// (from the environment, as a user would set it).
func (s *service) cli(server string, args ...string) cliResult {
	s.t.Helper()
	cmd := exec.Command(kubetaskBin(s.t), args...)
	cmd.Env = append(os.Environ(), "KUBETASK_SERVER="+server, "KUBETASK_TOKEN="+s.Token, "XDG_CONFIG_HOME="+s.t.TempDir())
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		s.t.Fatalf("kubetask %v did not end within 3 minutes\nstdout:\n%s\nstderr:\n%s", args, &stdout, &stderr)
	}
	res := cliResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		res.code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatal(err)
	}
	return res
}

// ok runs a command that must succeed and returns its stdout.
func (s *service) ok(args ...string) string {
	s.t.Helper()
	r := s.cli(s.URL, args...)
	if r.code != 0 {
		s.t.Fatalf("kubetask %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// getJSON is `kubetask get ID -o json`.
func (s *service) getJSON(id string) api.Task {
	s.t.Helper()
	var tk api.Task
	if err := json.Unmarshal([]byte(s.ok("get", id, "-o", "json")), &tk); err != nil {
		s.t.Fatal(err)
	}
	return tk
}

// writeDoc writes a task document into a temporary file.
func writeDoc(t *testing.T, doc string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "task.yaml")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const stepsLog = "step 1 of 3\nstep 2 of 3\nstep 3 of 3\n"

// stepsTask prints stepsLog, writes a JSON result and exits with code.
func stepsTask(name, team string, code int) string {
	return fmt.Sprintf(`apiVersion: kubetask.dev/v1alpha1
kind: Task
metadata:
  name: %s
  labels: {team: %s}
spec:
  result: {from: TerminationMessage}
  retries: {limit: 0}
  template:
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: main
          image: busybox
          command: [sh, -c, 'for i in 1 2 3; do echo "step $i of 3"; sleep 0.2; done; echo "{\"rows\": 3}" > /dev/termination-log; exit %d']
`, name, team, code)
}

// The CLI client end to end against kubetask serve: submit and follow,
// get the result, read the archived log, idempotent submission, cancel,
// rerun, list with filters and paging, and a watch that resumes after its
// connection is cut, missing nothing and repeating nothing.
func TestServeCLI(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env)
	ns := env.Namespace

	// submit --follow prints the log while the task runs and exits with
	// the main container's code.
	doc := writeDoc(t, stepsTask("steps", "a", 0))
	if out := s.ok("submit", "-f", doc, "-n", ns, "--id", "steps-1", "--follow", "-q"); out != stepsLog {
		t.Errorf("submit --follow printed %q, want the log %q", out, stepsLog)
	}
	tk := s.getJSON("steps-1")
	if tk.Phase != "Succeeded" || tk.Result != `{"rows": 3}`+"\n" && tk.Result != `{"rows": 3}` {
		t.Errorf("get steps-1: %s/%s, result %q", tk.Phase, tk.Reason, tk.Result)
	}
	if human := s.ok("get", "steps-1"); !strings.Contains(human, "Succeeded") || !strings.Contains(human, "rows") {
		t.Errorf("get steps-1 (table) does not show the outcome and result:\n%s", human)
	}
	if out := s.ok("logs", "steps-1"); out != stepsLog {
		t.Errorf("logs steps-1: %q, want %q", out, stepsLog)
	}

	// The same ID and document: the same task; another document: refused.
	if out := s.ok("submit", "-f", doc, "-n", ns, "--id", "steps-1"); strings.TrimSpace(out) != "steps-1" {
		t.Errorf("resubmission printed %q, want the task's ID", out)
	}
	if r := s.cli(s.URL, "submit", "-f", writeDoc(t, stepsTask("steps", "b", 0)), "-n", ns, "--id", "steps-1"); r.code == 0 || !strings.Contains(r.stderr, "409") {
		t.Errorf("a different document with a used ID: exit %d, stderr %q; want a 409 error", r.code, r.stderr)
	}

	// --wait exits with the main container's code.
	if r := s.cli(s.URL, "submit", "-f", writeDoc(t, stepsTask("fails", "b", 3)), "-n", ns, "--id", "fails-1", "--wait", "-q"); r.code != 3 {
		t.Errorf("submit --wait of a task exiting 3: exit %d\n%s", r.code, r.stderr)
	}

	// cancel stops a running task.
	long := writeDoc(t, strings.Replace(stepsTask("long", "b", 0), "for i in 1 2 3;", "sleep 300; for i in 1 2 3;", 1))
	s.ok("submit", "-f", long, "-n", ns, "--id", "long-1")
	eventually(t, time.Minute, "long-1 to run", func() bool { return s.getJSON("long-1").Phase == "Running" })
	s.ok("cancel", "long-1")
	s.ok("cancel", "long-1") // idempotent
	eventually(t, time.Minute, "long-1 to end", func() bool { return s.getJSON("long-1").Terminal })
	if tk := s.getJSON("long-1"); tk.Phase != "Failed" || tk.Reason != "Cancelled" {
		t.Errorf("cancelled task: %s/%s %s", tk.Phase, tk.Reason, tk.Message)
	}

	// rerun makes a new task that says where it came from.
	s.ok("rerun", "steps-1", "--id", "steps-2", "--wait", "-q")
	if tk := s.getJSON("steps-2"); tk.Origin != "steps-1" || tk.Phase != "Succeeded" {
		t.Errorf("rerun: origin %q, %s/%s", tk.Origin, tk.Phase, tk.Reason)
	}

	// list: filters, and pages that together list every task once.
	listIDs := func(args ...string) []string {
		t.Helper()
		var l api.TaskList
		if err := json.Unmarshal([]byte(s.ok(append([]string{"list", "-n", ns, "-o", "json"}, args...)...)), &l); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, tk := range l.Items {
			ids = append(ids, tk.ID)
		}
		return ids
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "steps-2 long-1 fails-1 steps-1"},
		{[]string{"--phase", "Succeeded"}, "steps-2 steps-1"},
		{[]string{"--reason", "Cancelled"}, "long-1"},
		{[]string{"-l", "team=a"}, "steps-2 steps-1"},
		{[]string{"--name-prefix", "fa"}, "fails-1"},
	} {
		if got := strings.Join(listIDs(tc.args...), " "); got != tc.want {
			t.Errorf("list %v: %s, want %s", tc.args, got, tc.want)
		}
	}
	table := s.ok("list", "-n", ns)
	for _, w := range []string{"ID", "STATE", "steps-1", "Succeeded", "Cancelled"} {
		if !strings.Contains(table, w) {
			t.Errorf("list table lacks %q:\n%s", w, table)
		}
	}
	var paged []string
	token := regexp.MustCompile(`--continue[= ]+(\S+)`)
	args := []string{"list", "-n", ns, "--limit", "1"}
	for range 10 {
		r := s.cli(s.URL, args...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d %s", args, r.code, r.stderr)
		}
		for _, l := range strings.Split(r.stdout, "\n")[1:] {
			if f := strings.Fields(l); len(f) > 0 {
				paged = append(paged, f[0])
			}
		}
		m := token.FindStringSubmatch(r.stderr + r.stdout)
		if m == nil {
			break
		}
		args = []string{"list", "-n", ns, "--limit", "1", "--continue", strings.Trim(m[1], `"'`)}
	}
	if got := strings.Join(paged, " "); got != "steps-2 long-1 fails-1 steps-1" {
		t.Errorf("pages of one: %s", got)
	}

	// Health, readiness and metrics (the log archive's included).
	for _, path := range []string{"/healthz", "/readyz"} {
		if resp, b := s.doAs("", http.MethodGet, path, "", nil); resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %s %s", path, resp.Status, b)
		}
	}
	if resp, b := s.do(http.MethodGet, "/metrics", "", nil); resp.StatusCode != http.StatusOK || !regexp.MustCompile(`(?m)^kubetask_log_archived_bytes_total [1-9]`).Match(b) {
		t.Errorf("/metrics: %s, archived bytes not counted", resp.Status)
	}

	t.Run("watch resumes after a cut", func(t *testing.T) { testWatchResumes(t, s.with(t)) })
}

// testWatchResumes runs `kubetask list --watch -o json` through a proxy,
// cuts its connection while tasks change, and checks that it printed every
// event once: the service runs one namespace, so its events' cursors
// follow each other without a gap.
func testWatchResumes(t *testing.T, s *service) {
	p := newProxy(t, strings.TrimPrefix(s.URL, "http://"))
	cmd := exec.Command(kubetaskBin(t), "list", "--watch", "-o", "json", "-n", s.env.Namespace)
	cmd.Env = append(os.Environ(), "KUBETASK_SERVER=http://"+p.addr(), "KUBETASK_TOKEN="+s.Token, "XDG_CONFIG_HOME="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	events := make(chan api.Event, 100)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev api.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Cursor != "" {
				events <- ev
			}
		}
	}()
	var seen []api.Event
	waitTerminal := func(id string) {
		t.Helper()
		deadline := time.After(2 * time.Minute)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("the watch ended; stderr:\n%s", &stderr)
				}
				seen = append(seen, ev)
				if ev.TaskID == id && ev.Terminal {
					return
				}
			case <-deadline:
				t.Fatalf("no outcome of %s in the watch; stderr:\n%s", id, &stderr)
			}
		}
	}
	eventually(t, time.Minute, "the watch to connect", func() bool { return p.conns() > 0 })
	s.ok("submit", "-f", writeDoc(t, stepsTask("watched", "w", 0)), "-n", s.env.Namespace, "--id", "watched-1")
	waitTerminal("watched-1")
	// Cut the watch's connection, and submit while it reconnects.
	p.cut()
	s.ok("submit", "-f", writeDoc(t, stepsTask("watched", "w", 0)), "-n", s.env.Namespace, "--id", "watched-2")
	waitTerminal("watched-2")
	if p.accepted() < 2 {
		t.Errorf("the watch connected %d times; the cut did not happen", p.accepted())
	}
	last := -1
	for _, ev := range seen {
		i := strings.LastIndexByte(ev.Cursor, '-')
		n, err := strconv.Atoi(ev.Cursor[i+1:])
		if err != nil {
			t.Fatalf("cursor %q", ev.Cursor)
		}
		if last >= 0 && n != last+1 {
			t.Errorf("event %s (%s of %s) follows event %d: missed or repeated events", ev.Cursor, ev.Type, ev.TaskID, last)
		}
		last = n
	}
}

// proxy forwards TCP connections to target until cut closes them.
type proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	open   []net.Conn
	total  int
}

func newProxy(t *testing.T, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target}
	t.Cleanup(func() { l.Close(); p.cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.open = append(p.open, c, u)
			p.total++
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

// cut closes every open connection.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.open {
		c.Close()
	}
	p.open = nil
}

func (p *proxy) conns() int { p.mu.Lock(); defer p.mu.Unlock(); return len(p.open) }

func (p *proxy) accepted() int { p.mu.Lock(); defer p.mu.Unlock(); return p.total }
