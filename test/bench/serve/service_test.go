package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// kubetaskBin returns the binary under test: $KUBETASK_BENCH_BIN when set
// (another build, say), else the one clustertest.BuildKubetask built from
// this checkout. The shared cluster built one for its local node beside its
// directory (clustertest's layout); if it is not there, it is built once in
// a directory removed with the cluster's.
func kubetaskBin(tb testing.TB) string {
	tb.Helper()
	binOnce.Do(func() {
		if p := os.Getenv("KUBETASK_BENCH_BIN"); p != "" {
			binPath, binErr = executable(p)
			return
		}
		parent := filepath.Dir(clustertest.Cluster().Dir())
		if st, err := os.Stat(filepath.Join(parent, "kubetask")); err == nil && st.Mode().IsRegular() && st.Mode()&0o100 != 0 {
			binPath = filepath.Join(parent, "kubetask")
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		binPath, binErr = clustertest.BuildKubetask(ctx, filepath.Join(parent, "benchserve"))
	})
	if binErr != nil {
		tb.Fatal(binErr)
	}
	return binPath
}

// executable returns path made absolute, or an error when it is not an
// executable file.
func executable(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("the kubetask binary to benchmark: %w", err)
	}
	if !st.Mode().IsRegular() || st.Mode()&0o100 == 0 {
		return "", fmt.Errorf("the kubetask binary to benchmark: %s is not an executable file", abs)
	}
	return abs, nil
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

// service is a running `kubetask serve`.
type service struct {
	ns             string
	stateDir       string
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	url, token     string
	http           *http.Client
}

var (
	addrLine  = regexp.MustCompile(`kubetask serve: (https?://[^ ]+)/api/v1 \(store .*, auth ([a-z]+)\)`)
	tokenLine = regexp.MustCompile(`generated (\S+) with a token for every namespace`)
)

// startService starts `kubetask serve` for env's namespace on a free
// loopback port with a state directory of its own (the default SQLite
// store and a generated token) and extra flags, waits until /readyz answers
// 200, and stops it (SIGTERM, then SIGKILL) when tb ends.
func startService(tb testing.TB, env *clustertest.Env, extra ...string) *service {
	tb.Helper()
	return startServiceEnv(tb, env, nil, extra...)
}

// startServiceEnv is startService with environment variables added to the
// service's (KUBETASK_STORE_URL). With --auth none among the flags it needs
// no token.
func startServiceEnv(tb testing.TB, env *clustertest.Env, environ []string, extra ...string) *service {
	tb.Helper()
	return startServiceBin(tb, kubetaskBin(tb), env, environ, extra...)
}

// startServiceBin is startServiceEnv with the kubetask binary bin (an older
// build, for an A/B comparison): the flags given must be ones bin knows.
func startServiceBin(tb testing.TB, bin string, env *clustertest.Env, environ []string, extra ...string) *service {
	tb.Helper()
	stateDir := tb.TempDir()
	args := append([]string{"serve", "--kubeconfig", env.Kubeconfig, "--state-dir", stateDir,
		"--listen", "127.0.0.1:0", "--namespaces", env.Namespace, "-n", env.Namespace,
		"--instance-id", "bench-" + env.Namespace}, extra...)
	s := &service{ns: env.Namespace, stateDir: stateDir, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{}),
		// As many idle connections as clients: no client waits for a new connection.
		http: &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}}
	// KUBETASK_BENCH_CPU_PROFILE (a directory) has every service write
	// a CPU profile of its run there, named by its namespace and order.
	if dir := os.Getenv("KUBETASK_BENCH_CPU_PROFILE"); dir != "" {
		args = append(args, "--cpu-profile", filepath.Join(dir, fmt.Sprintf("%s-%03d.pprof", env.Namespace, profiles.Add(1))))
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.stdout, s.stderr
	// KUBETASK_BENCH_SERVE_GOGC runs the service with another GOGC than
	// serve's own default (cli.ServeGCPercent), e.g. 100 for the runtime's.
	if g := os.Getenv("KUBETASK_BENCH_SERVE_GOGC"); g != "" {
		environ = append(environ, "GOGC="+g)
	}
	if environ != nil {
		s.cmd.Env = append(os.Environ(), environ...)
	}
	if err := s.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	tb.Cleanup(func() { s.stop(tb) })
	tb.Logf("%s %s", bin, strings.Join(args, " "))

	poll(tb, time.Minute, "kubetask serve to print its address and token", func() bool {
		select {
		case <-s.done:
			tb.Fatalf("kubetask serve exited: %v\nstdout:\n%s\nstderr:\n%s", s.cmd.ProcessState, s.stdout, s.stderr)
		default:
		}
		out := s.stdout.String()
		a, t := addrLine.FindStringSubmatch(out), tokenLine.FindStringSubmatch(out)
		switch {
		case a != nil && a[2] == "none":
			s.url = a[1]
			return true
		case a == nil || t == nil:
			return false
		}
		s.url, s.token = a[1], generatedToken(tb, t[1])
		return true
	})
	poll(tb, time.Minute, "kubetask serve to be ready", func() bool {
		resp, err := s.http.Get(s.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return s
}

// profiles numbers the services' CPU profiles.
var profiles atomic.Int64

// cpu is the CPU time (user and system) the stopped service used.
func (s *service) cpu() time.Duration {
	<-s.done
	return s.cmd.ProcessState.UserTime() + s.cmd.ProcessState.SystemTime()
}

// stop sends SIGTERM, SIGKILL after 30 s, and waits for the process.
func (s *service) stop(tb testing.TB) {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		tb.Errorf("kubetask serve did not stop on SIGTERM within 30 s; killing it")
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	if tb.Failed() {
		tb.Logf("kubetask serve stderr (last 8 KiB):\n%s", tail(s.stderr.String(), 8<<10))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// request builds an API request with the service's token.
func (s *service) request(ctx context.Context, method, path, contentType string, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	return req, nil
}

// do sends an API request and returns the response and its whole body;
// a status other than want is an error that quotes the body.
func (s *service) do(ctx context.Context, method, path, contentType string, body []byte, want int) (*http.Response, []byte, error) {
	req, err := s.request(ctx, method, path, contentType, body)
	if err != nil {
		return nil, nil, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp, nil, fmt.Errorf("%s %s: reading the body: %w", method, path, err)
	}
	if resp.StatusCode != want {
		return resp, b, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	return resp, b, nil
}

// submit submits a JSON task document to the service's namespace and
// returns the new task's ID.
func (s *service) submit(ctx context.Context, doc []byte) (string, error) {
	_, b, err := s.do(ctx, http.MethodPost, api.Prefix+"/namespaces/"+s.ns+"/tasks", "application/json", doc, http.StatusCreated)
	if err != nil {
		return "", err
	}
	var tk api.Task
	if err := json.Unmarshal(b, &tk); err != nil {
		return "", fmt.Errorf("submit: decoding the answer: %w", err)
	}
	return tk.ID, nil
}

// cursor returns a watch cursor of now (from a list's response).
func (s *service) cursor(ctx context.Context) (string, error) {
	_, b, err := s.do(ctx, http.MethodGet, api.Prefix+"/tasks?limit=1", "", nil, http.StatusOK)
	if err != nil {
		return "", err
	}
	var l api.TaskList
	if err := json.Unmarshal(b, &l); err != nil {
		return "", err
	}
	if l.Cursor == "" {
		return "", errors.New("list: no cursor")
	}
	return l.Cursor, nil
}

// logInfo is what the headers of a log response say about the archive.
type logInfo struct {
	size      int64
	complete  bool
	truncated bool
}

// logHeaders reads only the headers of the task's main log (the body is
// closed unread: the server stops at its first failed write).
func (s *service) logHeaders(ctx context.Context, id string) (logInfo, error) {
	req, err := s.request(ctx, http.MethodGet, api.Prefix+"/tasks/"+id+"/logs", "", nil)
	if err != nil {
		return logInfo{}, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return logInfo{}, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return logInfo{}, fmt.Errorf("logs of %s: %s", id, resp.Status)
	}
	size, err := strconv.ParseInt(resp.Header.Get(api.HeaderLogSize), 10, 64)
	if err != nil {
		return logInfo{}, fmt.Errorf("logs of %s: %s: %w", id, api.HeaderLogSize, err)
	}
	return logInfo{size: size, complete: resp.Header.Get(api.HeaderLogComplete) == "true",
		truncated: resp.Header.Get(api.HeaderLogTruncated) == "true"}, nil
}

// log reads the task's whole main log.
func (s *service) log(ctx context.Context, id string) ([]byte, error) {
	_, b, err := s.do(ctx, http.MethodGet, api.Prefix+"/tasks/"+id+"/logs", "", nil, http.StatusOK)
	return b, err
}

// memory is the service's resident set size now and its peak, from
// /proc/PID/status (VmRSS, VmHWM), in bytes.
func (s *service) memory() (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0, 0, err
	}
	field := func(name string) (int64, error) {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				return kb << 10, err
			}
		}
		return 0, fmt.Errorf("/proc/%d/status: no %s", s.cmd.Process.Pid, name)
	}
	if rss, err = field("VmRSS"); err != nil {
		return 0, 0, err
	}
	hwm, err = field("VmHWM")
	return rss, hwm, err
}

// seen is an event of a task and when the watcher received it.
type seen struct {
	ev api.Event
	at time.Time
}

// watcher follows the service's watch stream (GET /api/v1/watch) of its
// namespace from a cursor, resuming from the last event after a broken
// stream, and keeps each task's terminal event and PodReleased event.
type watcher struct {
	changed chan struct{} // one pending signal after any kept event

	mu       sync.Mutex
	terminal map[string]seen
	released map[string]seen
	err      error // an Expired event: events were missed
}

// watch starts a watcher that runs until ctx ends.
func (s *service) watch(ctx context.Context, cursor string) *watcher {
	w := &watcher{changed: make(chan struct{}, 1), terminal: map[string]seen{}, released: map[string]seen{}}
	go func() {
		for ctx.Err() == nil {
			cursor = w.stream(ctx, s, cursor)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond): // back off before resuming a broken stream
			}
		}
	}()
	return w
}

// stream reads one watch response and returns the cursor to resume from.
func (w *watcher) stream(ctx context.Context, s *service, cursor string) string {
	req, err := s.request(ctx, http.MethodGet, api.Prefix+"/watch?namespace="+s.ns+"&cursor="+cursor, "", nil)
	if err != nil {
		return cursor
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return cursor
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return cursor
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev api.Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			w.fail(fmt.Errorf("watch event %q: %w", data, err))
			return cursor
		}
		cursor = ev.Cursor
		w.observe(ev, time.Now())
	}
	return cursor
}

func (w *watcher) observe(ev api.Event, at time.Time) {
	w.mu.Lock()
	switch {
	case ev.Type == api.EventExpired:
		if w.err == nil {
			w.err = fmt.Errorf("the watch missed events: %s", ev.Message)
		}
	case ev.Terminal:
		if _, ok := w.terminal[ev.TaskID]; !ok {
			w.terminal[ev.TaskID] = seen{ev, at}
		}
	case ev.Type == "PodReleased":
		if _, ok := w.released[ev.TaskID]; !ok {
			w.released[ev.TaskID] = seen{ev, at}
		}
	default:
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *watcher) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// counts returns how many tasks have had their terminal event and their
// PodReleased event.
func (w *watcher) counts() (terminal, released int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.terminal), len(w.released)
}

// wait waits until cond(terminal, released) holds, the watch fails or d
// passes.
func (w *watcher) wait(d time.Duration, what string, cond func(terminal, released int) bool) error {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		err, t, r := w.err, len(w.terminal), len(w.released)
		w.mu.Unlock()
		switch {
		case err != nil:
			return err
		case cond(t, r):
			return nil
		}
		select {
		case <-w.changed:
		case <-deadline.C:
			return fmt.Errorf("timed out after %s waiting for %s: %d tasks terminal, %d released", d, what, t, r)
		}
	}
}

// last returns the latest receipt time among the kept events of ids (from
// terminal or released), and the events.
func (w *watcher) last(ids []string, released bool) (time.Time, []seen) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.terminal
	if released {
		m = w.released
	}
	var latest time.Time
	out := make([]seen, 0, len(ids))
	for _, id := range ids {
		e, ok := m[id]
		if !ok {
			continue
		}
		out = append(out, e)
		if e.at.After(latest) {
			latest = e.at
		}
	}
	return latest, out
}

// poll checks cond every 50 ms until it holds, or fails tb after d.
func poll(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
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
