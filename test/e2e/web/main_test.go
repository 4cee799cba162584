// Package web drives kubetask serve's web page in a real browser:
// Debian's Chromium, headless, driven by chromedp, against the built
// `kubetask serve` on the local cluster. Tasks are submitted through the
// API; the tests watch what the page shows and use it as a person would
// (clicks, keys, the sign-in form).
//
// KUBETASK_CHROMIUM names another Chromium; KUBETASK_UPDATE_SCREENSHOTS=1
// writes the screenshots of docs/images.
//
// In short: proves that the web page shows and does what docs/web.md says,
// in a real browser, and passes Lighthouse; about 4.5 min in `go test ./...`
// on the 2-core CI machine.
package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
)

func TestMain(m *testing.M) { clustertest.MainWith(m, clustertest.Options{}) }

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// kubetaskBin builds the binary under test once, beside the shared
// cluster's directory (removed with it).
func kubetaskBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		dir := filepath.Join(filepath.Dir(clustertest.Cluster().Dir()), "e2eweb")
		binPath, binErr = clustertest.BuildKubetask(ctx, dir)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// taskDoc is a task named name whose template spec is podSpec (indented six
// spaces), with extra spec fields (indented two spaces). Pods get a short
// grace period; the test cluster's only untainted node is the local
// process node, which runs each container's command on the host.
func taskDoc(name, specExtra, podSpec string) []byte {
	return fmt.Appendf(nil, "apiVersion: kubetask.dev/v1alpha1\nkind: Task\nmetadata: {name: %s}\nspec:\n%s\n  template:\n    spec:\n      terminationGracePeriodSeconds: 5\n%s\n",
		name, specExtra, podSpec)
}

// shTask is a task whose main container runs script with sh.
func shTask(name, specExtra, script string) []byte {
	return taskDoc(name, specExtra, fmt.Sprintf("      containers:\n        - {name: main, image: busybox, command: [sh, -c, %q]}", script))
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

// service is a running `kubetask serve` for one test's namespace.
type service struct {
	t              *testing.T
	env            *clustertest.Env
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
// and stops it when the test ends.
func startService(t *testing.T, env *clustertest.Env, args ...string) *service {
	t.Helper()
	s := &service{t: t, env: env, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	args = append([]string{"serve", "--kubeconfig", env.Kubeconfig, "--namespaces", env.Namespace, "-n", env.Namespace,
		"--listen", "127.0.0.1:0", "--instance-id", "web-" + env.Namespace, "--state-dir", t.TempDir()}, args...)
	s.cmd = exec.Command(kubetaskBin(t), args...)
	s.cmd.Stdout, s.cmd.Stderr = s.stdout, s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(s.stop)
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
	return s
}

// stop stops the process (SIGTERM, SIGKILL after 30 s) and waits for it.
func (s *service) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	if s.t.Failed() {
		s.t.Logf("kubetask serve stderr:\n%s", s.stderr)
	}
}

// do sends an API request with token (none when empty) and returns the
// response and its body.
func (s *service) do(token, method, path, contentType string, body []byte) (*http.Response, []byte) {
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

// submit submits a YAML task document to the service's namespace with the
// service's token.
func (s *service) submit(doc []byte) api.Task {
	s.t.Helper()
	return s.submitAs(s.Token, doc)
}

func (s *service) submitAs(token string, doc []byte) api.Task {
	s.t.Helper()
	resp, b := s.do(token, http.MethodPost, api.Prefix+"/namespaces/"+s.env.Namespace+"/tasks", "application/yaml", doc)
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
	resp, b := s.do(s.Token, http.MethodGet, api.Prefix+"/tasks/"+id, "", nil)
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

// log returns the archived log of the task's attempt and whether it is
// complete.
func (s *service) log(id string, attempt int) ([]byte, bool) {
	s.t.Helper()
	resp, b := s.do(s.Token, http.MethodGet, fmt.Sprintf("%s/tasks/%s/logs?attempt=%d", api.Prefix, id, attempt), "", nil)
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("logs of %s attempt %d: %s\n%s", id, attempt, resp.Status, b)
	}
	return b, resp.Header.Get(api.HeaderLogComplete) == "true" || resp.Trailer.Get(api.HeaderLogComplete) == "true"
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

// tab is one headless Chromium with one tab, for one test.
type tab struct {
	t       *testing.T
	ctx     context.Context
	base    string
	console *syncBuffer
	errs    *syncBuffer // uncaught exceptions and console errors
}

// newBrowser starts Chromium (stopped when the test ends) with a tab of
// width x height, the page's base URL base.
// chromiumPath is the Chromium the tests drive: $KUBETASK_CHROMIUM, or
// Debian's.
func chromiumPath(t *testing.T) string {
	t.Helper()
	path := os.Getenv("KUBETASK_CHROMIUM")
	if path == "" {
		path = "/usr/bin/chromium"
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("no Chromium at %s (%v): install Debian's chromium (apt-get install chromium, as .ci/run does) or set KUBETASK_CHROMIUM", path, err)
	}
	return path
}

func newBrowser(t *testing.T, base string, width, height int) *tab {
	t.Helper()
	path := chromiumPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(width, height), chromedp.DisableGPU,
		// A closed network: no connection of the browser's own.
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("no-pings", true), chromedp.Flag("dns-prefetch-disable", true))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	own := newBrowserNet(t, base)
	opts = append(opts, chromedp.ModifyCmdFunc(func(cmd *exec.Cmd) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // as chromedp's own
		own.enter(cmd)
	}))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	b := &tab{t: t, ctx: ctx, base: base, console: &syncBuffer{}, errs: &syncBuffer{}}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			fmt.Fprintln(b.console, m.String())
			if m.IsException() || m.Type == "error" && !strings.Contains(m.Text, "Failed to load resource") {
				fmt.Fprintln(b.errs, m.String())
			}
		}
	}()
	t.Cleanup(func() {
		if e := b.errs.String(); e != "" {
			t.Errorf("the page reported errors:\n%s", e)
		}
		if t.Failed() {
			t.Logf("browser console:\n%s", b.console)
		}
	})
	return b
}

// fatalf ends the test with what the page shows.
func (b *tab) fatalf(format string, args ...any) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText`))
	if len(text) > 4000 {
		text = text[:4000] + "…"
	}
	b.t.Fatalf(format+"\n--- the page shows:\n%s", append(args, text)...)
}

// do runs actions, within 30 s.
func (b *tab) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.fatalf("browser: %v", err)
	}
}

// wait waits until the JavaScript expression is truthy, for at most d.
func (b *tab) wait(d time.Duration, what, expr string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d+10*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool]("!!("+expr+")", chromedp.WithPollingTimeout(d), chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		b.fatalf("waited %s for %s: %v", d, what, err)
	}
}

// eval returns the value of a JavaScript expression.
func eval[T any](b *tab, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// open navigates to a path of the page.
func (b *tab) open(path string) {
	b.t.Helper()
	b.do(chromedp.Navigate(b.base + path))
}

// signIn signs in with token through the page's form and waits for the
// task list's heading.
func (b *tab) signIn(token string) {
	b.t.Helper()
	b.open("/")
	b.wait(10*time.Second, "the sign-in form", `document.querySelector("#token")`)
	b.do(chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("form.login button[type=submit]")))
	b.wait(20*time.Second, "the task list", `document.querySelector("h1")?.textContent === "Tasks"`)
	// Set once: a page loaded again would lose it.
	eval[bool](b, `window.kubetaskTestMarker = true`)
}

// notReloaded fails the test when the page was loaded again since signIn.
func (b *tab) notReloaded() {
	b.t.Helper()
	if !eval[bool](b, `window.kubetaskTestMarker === true`) {
		b.fatalf("the page was loaded again")
	}
}

// screenshot writes a PNG of the page to docs/images/name when
// KUBETASK_UPDATE_SCREENSHOTS is set.
func (b *tab) screenshot(name string) {
	b.t.Helper()
	if os.Getenv("KUBETASK_UPDATE_SCREENSHOTS") == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join("..", "..", "..", "docs", "images", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("wrote %s", path)
}

// jsString quotes s for JavaScript.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
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
