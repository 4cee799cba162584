// Package serve drives the built `kubetask serve` and the CLI client on
// the local cluster as a user would: tasks submitted over HTTP, logs that
// outlive their pods (force deletion, eviction, the service SIGKILLed), tasks
// that never start, and both authentication modes.
//
// In short: proves what docs/serve.md promises of `kubetask serve` and its
// CLI client, from the built binary; about 3.5 min in `go test ./...` on the
// 2-core CI machine.
package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
)

func TestMain(m *testing.M) {
	code := clustertest.Run(m, clustertest.Options{})
	if err := pgtest.StopShared(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// binEnv names a kubetask binary to test instead of building this tree's:
// an attack test is checked to fail on the code before its fix by running
// it against that code's binary (go build -o ... ./cmd/kubetask in a
// worktree of the older commit).
const binEnv = "KUBETASK_E2E_BIN"

// kubetaskBin builds the binary under test once, beside the shared
// cluster's directory (removed with it), or takes $KUBETASK_E2E_BIN.
func kubetaskBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if p := os.Getenv(binEnv); p != "" {
			binPath, binErr = filepath.Abs(p)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		dir := filepath.Join(filepath.Dir(clustertest.Cluster().Dir()), "e2eserve")
		binPath, binErr = clustertest.BuildKubetask(ctx, dir)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// localPlacement is what every test pod gets: a short grace period. The
// test cluster's only untainted node is the local process node.
const localPlacement = `
      terminationGracePeriodSeconds: 5`

// taskDoc is a task named name whose template spec is podSpec (indented six
// spaces), with extra spec fields (indented two spaces).
func taskDoc(name, specExtra, podSpec string) []byte {
	return fmt.Appendf(nil, "apiVersion: kubetask.dev/v1alpha1\nkind: Task\nmetadata: {name: %s}\nspec:\n%s\n  template:\n    spec:%s\n%s\n",
		name, specExtra, localPlacement, podSpec)
}

// syncBuffer is a bytes.Buffer safe for a writer and a concurrent reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// service is a running `kubetask serve`, as seen by one test (t): subtests
// get copies (with) that share the process.
type service struct {
	t *testing.T
	*process
}

// process is the service's process, restarted by start.
type process struct {
	env            *clustertest.Env
	args           []string
	environ        []string // beside the test's own environment
	stateDir       string
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	URL, Token     string
}

var (
	addrLine  = regexp.MustCompile(`kubetask serve: (https?://[^ ]+)/api/v1`)
	tokenLine = regexp.MustCompile(`generated (\S+) with a token for every namespace`)
)

// startService starts `kubetask serve` for env's namespace on a free
// loopback port with a state directory of its own, waits until it is ready
// and stops it (SIGTERM, then SIGKILL) when the test ends.
func startService(t *testing.T, env *clustertest.Env, args ...string) *service {
	t.Helper()
	s := &service{t: t, process: &process{env: env, stateDir: t.TempDir()}}
	s.args = append([]string{"serve", "--kubeconfig", env.Kubeconfig, "--namespaces", env.Namespace, "-n", env.Namespace,
		"--listen", "127.0.0.1:0", "--instance-id", "serve-" + env.Namespace}, args...)
	s.start()
	t.Cleanup(func() { s.stop(syscall.SIGTERM) })
	return s
}

// with returns a copy of s whose requests report to t (a subtest).
func (s *service) with(t *testing.T) *service {
	c := *s
	c.t = t
	return &c
}

// start starts the process (again) and waits until /readyz answers 200.
func (s *service) start() {
	t := s.t
	t.Helper()
	s.stdout, s.stderr, s.done = &syncBuffer{}, &syncBuffer{}, make(chan struct{})
	s.cmd = exec.Command(kubetaskBin(t), append(s.args, "--state-dir", s.stateDir)...)
	if len(s.environ) > 0 {
		s.cmd.Env = append(os.Environ(), s.environ...)
	}
	s.cmd.Stdout, s.cmd.Stderr = s.stdout, s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	eventually(t, time.Minute, "kubetask serve to print its address", func() bool {
		select {
		case <-s.done:
			t.Fatalf("kubetask serve exited: %v\nstdout:\n%s\nstderr:\n%s", s.cmd.ProcessState, s.stdout, s.stderr)
		default:
		}
		m := addrLine.FindStringSubmatch(s.stdout.String())
		if m == nil {
			return false
		}
		s.URL = m[1]
		if m := tokenLine.FindStringSubmatch(s.stdout.String()); m != nil {
			s.Token = generatedToken(t, m[1])
		}
		return true
	})
	eventually(t, time.Minute, "kubetask serve to be ready", func() bool {
		resp, err := http.Get(s.URL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// stop stops the process with sig (SIGKILL after 30 s) and waits for it.
func (s *service) stop(sig syscall.Signal) {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.t.Errorf("kubetask serve did not stop on %v within 30 s; killing it", sig)
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	if s.t.Failed() {
		s.t.Logf("kubetask serve stderr:\n%s", s.stderr)
	}
}

// do sends an API request with the service's token and returns the response
// and its body.
func (s *service) do(method, path, contentType string, body []byte) (*http.Response, []byte) {
	s.t.Helper()
	return s.doAs(s.Token, method, path, contentType, body)
}

// doAs is do with another bearer token (none when empty).
func (s *service) doAs(token, method, path, contentType string, body []byte) (*http.Response, []byte) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.URL+path, bytes.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return resp, b
}

// submit submits a YAML task document to the service's namespace.
func (s *service) submit(doc []byte) api.Task {
	s.t.Helper()
	resp, b := s.do(http.MethodPost, api.Prefix+"/namespaces/"+s.env.Namespace+"/tasks", "application/yaml", doc)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		s.t.Fatalf("submit: %s\n%s", resp.Status, b)
	}
	var tk api.Task
	if err := json.Unmarshal(b, &tk); err != nil {
		s.t.Fatal(err)
	}
	return tk
}

// get returns a task.
func (s *service) get(id string) api.Task {
	s.t.Helper()
	resp, b := s.do(http.MethodGet, api.Prefix+"/tasks/"+url.PathEscape(id), "", nil)
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("get %s: %s\n%s", id, resp.Status, b)
	}
	var tk api.Task
	if err := json.Unmarshal(b, &tk); err != nil {
		s.t.Fatal(err)
	}
	return tk
}

// waitTask waits until cond holds for the task, and returns it.
func (s *service) waitTask(id string, d time.Duration, what string, cond func(api.Task) bool) api.Task {
	s.t.Helper()
	var tk api.Task
	eventually(s.t, d, what, func() bool { tk = s.get(id); return cond(tk) })
	return tk
}

// archivedLog returns the whole log of the task's attempt n (main
// container) and whether the service says it is complete.
func (s *service) log(id string, attempt int) ([]byte, bool) {
	s.t.Helper()
	resp, b := s.do(http.MethodGet, fmt.Sprintf("%s/tasks/%s/logs?attempt=%d", api.Prefix, url.PathEscape(id), attempt), "", nil)
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("logs of %s attempt %d: %s\n%s", id, attempt, resp.Status, b)
	}
	complete := resp.Header.Get(api.HeaderLogComplete) == "true" || resp.Trailer.Get(api.HeaderLogComplete) == "true"
	return b, complete
}

// cursor returns a watch cursor of now (from a list's response).
func (s *service) cursor() string {
	s.t.Helper()
	resp, b := s.do(http.MethodGet, api.Prefix+"/tasks?limit=1", "", nil)
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("list: %s\n%s", resp.Status, b)
	}
	var l api.TaskList
	if err := json.Unmarshal(b, &l); err != nil || l.Cursor == "" {
		s.t.Fatalf("list: no cursor (%v): %s", err, b)
	}
	return l.Cursor
}

// events reads the task's watch stream from cursor until the task's
// terminal event and then until the stream is drained (its next Bookmark,
// or 3 s without events), or until d passes, and returns the task's events.
func (s *service) events(id, cursor string, d time.Duration) []api.Event {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+api.Prefix+"/tasks/"+url.PathEscape(id)+"/watch?cursor="+url.QueryEscape(cursor), nil)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	var out []api.Event
	terminal := false
	for {
		var quiet <-chan time.Time
		if terminal {
			quiet = time.After(3 * time.Second)
		}
		var line string
		var ok bool
		select {
		case line, ok = <-lines:
		case <-quiet:
			return out
		}
		if !ok {
			return out
		}
		data, isData := strings.CutPrefix(line, "data: ")
		if !isData {
			continue
		}
		var ev api.Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			s.t.Fatalf("watch event %q: %v", data, err)
		}
		switch {
		case ev.Type == api.EventExpired:
			s.t.Fatalf("watch from %s expired: %s", cursor, ev.Message)
		case ev.Type == api.EventBookmark && terminal:
			return out
		case ev.TaskID == id:
			out = append(out, ev)
			terminal = terminal || ev.Terminal
		}
	}
}

// eventually polls cond every 100 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// generatedToken is the token of the file kubetask serve generated (it says
// where, never the token).
func generatedToken(tb testing.TB, path string) string {
	tb.Helper()
	toks, err := server.LoadTokenFile(path)
	if err != nil || len(toks) == 0 {
		tb.Fatalf("the generated token file %s: %v", path, err)
	}
	return toks[0].Token
}
