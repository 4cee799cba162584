package components

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Environment variables that override where the builder looks and writes.
const (
	// EnvCacheDir overrides the cache directory (default: the user's cache dir + "/kubetask").
	EnvCacheDir = "KUBETASK_CACHE_DIR"
	// EnvToolsDir points at the repository's tools/ directory when kubetask runs
	// outside a checkout.
	EnvToolsDir = "KUBETASK_TOOLS_DIR"
	// EnvGo names the go command to build with (default: go on PATH).
	EnvGo = "KUBETASK_GO"
)

// ErrToolchain reports that no usable Go toolchain was found.
var ErrToolchain = errors.New("go toolchain unavailable")

// ErrModuleProxy reports that modules could not be downloaded.
var ErrModuleProxy = errors.New("go module proxy unreachable")

// Builder builds components into a cache and reuses what is there.
// Builds are serialised across processes by a lock file in the cache, so
// concurrent callers never compile two components at once on a small machine.
type Builder struct {
	// CacheDir holds built binaries; see DefaultCacheDir.
	CacheDir string
	// ToolsDir is the repository's tools/ directory; see FindToolsDir.
	ToolsDir string
	// Progress receives one line when a build starts, then one every
	// ProgressInterval until it ends. Nil discards progress.
	Progress io.Writer
	// ProgressInterval defaults to 30s.
	ProgressInterval time.Duration
	// GoBin is the go command; default $KUBETASK_GO or "go" on PATH.
	GoBin string
	// Env is appended to the environment of go (tests use it to point GOPROXY elsewhere).
	Env []string
}

// NewBuilder returns a Builder with the default cache and tools directories.
func NewBuilder(progress io.Writer) (*Builder, error) {
	cache, err := DefaultCacheDir()
	if err != nil {
		return nil, err
	}
	tools, err := FindToolsDir()
	if err != nil {
		return nil, err
	}
	return &Builder{CacheDir: cache, ToolsDir: tools, Progress: progress}, nil
}

// DefaultCacheDir returns $KUBETASK_CACHE_DIR, or the user's cache directory + "/kubetask".
func DefaultCacheDir() (string, error) {
	if d := os.Getenv(EnvCacheDir); d != "" {
		return filepath.Abs(d)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("locating the user cache directory (set %s): %w", EnvCacheDir, err)
	}
	return filepath.Join(d, "kubetask"), nil
}

// FindToolsDir returns $KUBETASK_TOOLS_DIR, or the tools/ directory of the
// kubetask checkout that contains the working directory or the running executable.
func FindToolsDir() (string, error) {
	if d := os.Getenv(EnvToolsDir); d != "" {
		if !isToolsDir(d) {
			return "", fmt.Errorf("%s=%s does not contain kube/go.mod: point it at the tools/ directory of a kubetask checkout", EnvToolsDir, d)
		}
		return filepath.Abs(d)
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		if resolved, err := filepath.EvalSymlinks(exe); err == nil {
			exe = resolved
		}
		starts = append(starts, filepath.Dir(exe))
	}
	for _, dir := range starts {
		for {
			if cand := filepath.Join(dir, "tools"); isToolsDir(cand) {
				return cand, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("cannot find the kubetask tools modules (tools/kube/go.mod): run kubetask from inside a kubetask checkout, or set %s to its tools/ directory", EnvToolsDir)
}

func isToolsDir(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "kube", "go.mod")) //nolint:gosec // the user's own checkout
	return err == nil && bytes.Contains(data, []byte("module github.com/kubetask/kubetask/tools/kube"))
}

// Path is where c's binary lives in the cache, built or not.
func (b *Builder) Path(c Component) string {
	return filepath.Join(b.CacheDir, "bin", c.Name, c.Version, c.Name)
}

// Built reports whether c is already in the cache.
func (b *Builder) Built(c Component) bool {
	st, err := os.Stat(b.Path(c))
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// Ensure returns the path of c's binary, building it first if the cache does
// not have it. A binary appears in the cache only complete (built to a
// temporary name, then renamed).
func (b *Builder) Ensure(ctx context.Context, c Component) (string, error) {
	if b.Built(c) {
		return b.Path(c), nil
	}
	unlock, err := b.lock(ctx, c)
	if err != nil {
		return "", err
	}
	defer unlock()
	if b.Built(c) { // another process built it while we waited
		return b.Path(c), nil
	}
	if err := b.build(ctx, c); err != nil {
		return "", err
	}
	return b.Path(c), nil
}

// EnsureAll ensures every component, one at a time, and returns their paths by name.
func (b *Builder) EnsureAll(ctx context.Context, cs ...Component) (map[string]string, error) {
	paths := make(map[string]string, len(cs))
	for _, c := range cs {
		p, err := b.Ensure(ctx, c)
		if err != nil {
			return nil, err
		}
		paths[c.Name] = p
	}
	return paths, nil
}

func (b *Builder) lock(ctx context.Context, c Component) (func(), error) {
	dir := filepath.Join(b.CacheDir, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating cache directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening build lock: %w", err)
	}
	waiting := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("taking build lock: %w", err)
		}
		if !waiting {
			b.progressf("waiting for another kubetask process to finish building (before %s %s)", c.Name, c.Version)
			waiting = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (b *Builder) goBin() (string, error) {
	name := b.GoBin
	if name == "" {
		name = os.Getenv(EnvGo)
	}
	if name == "" {
		name = "go"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: %q not found (install Go 1.26 or later and put it on PATH, or set %s): %w", ErrToolchain, name, EnvGo, err)
	}
	return p, nil
}

func (b *Builder) build(ctx context.Context, c Component) error {
	goBin, err := b.goBin()
	if err != nil {
		return fmt.Errorf("building %s %s: %w", c.Name, c.Version, err)
	}
	modDir := filepath.Join(b.ToolsDir, c.Module)
	if _, err := os.Stat(filepath.Join(modDir, "go.mod")); err != nil {
		return fmt.Errorf("building %s %s: tools module %s is missing: %w", c.Name, c.Version, modDir, err)
	}
	outDir := filepath.Dir(b.Path(c))
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", outDir, err)
	}
	logPath := filepath.Join(outDir, "build.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("creating build log: %w", err)
	}
	defer logFile.Close()
	tmp := b.Path(c) + ".tmp"
	args := []string{"build", "-trimpath", "-o", tmp}
	if c.LDFlags != "" {
		args = append(args, "-ldflags", c.LDFlags)
	}
	args = append(args, c.Package)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = modDir
	cmd.Env = append(append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0"), b.Env...)
	var tail tailBuffer
	out := io.MultiWriter(logFile, &tail)
	cmd.Stdout = out // the same writer for both: exec then copies from one pipe
	cmd.Stderr = out

	start := time.Now()
	b.progressf("building %s %s with %s (a first build can take several minutes; later runs reuse %s)", c.Name, c.Version, goBin, b.Path(c))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("building %s %s: starting go: %w", c.Name, c.Version, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	interval := b.ProgressInterval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			b.progressf("still building %s %s: %s elapsed", c.Name, c.Version, time.Since(start).Round(time.Second))
		case err := <-done:
			if err != nil {
				_ = os.Remove(tmp)
				if ctx.Err() != nil {
					return fmt.Errorf("building %s %s: %w", c.Name, c.Version, ctx.Err())
				}
				return classifyBuildError(c, tail.String(), logPath, err)
			}
			if err := os.Rename(tmp, b.Path(c)); err != nil {
				return fmt.Errorf("installing %s: %w", c.Name, err)
			}
			b.progressf("built %s %s in %s", c.Name, c.Version, time.Since(start).Round(time.Second))
			return nil
		}
	}
}

// classifyBuildError turns go's output into an error that names what is missing.
func classifyBuildError(c Component, out, logPath string, err error) error {
	lower := strings.ToLower(out)
	what := fmt.Sprintf("building %s %s", c.Name, c.Version)
	switch {
	case strings.Contains(lower, "requires go >=") || strings.Contains(lower, "toolchain not available"):
		return fmt.Errorf("%s: %w: the tools module needs a newer Go (install Go 1.26 or later): %s", what, ErrToolchain, lastLines(out, 3))
	case containsAny(lower, "dial tcp", "no such host", "connection refused", "proxyconnect", "i/o timeout",
		"module lookup disabled", "goproxy=off", "tls handshake timeout", "unrecognized import path", "server misbehaving"):
		proxy := os.Getenv("GOPROXY")
		if proxy == "" {
			proxy = "the default"
		}
		return fmt.Errorf("%s: %w: modules could not be downloaded (GOPROXY is %s; check network access to the Go module proxy, or pre-fill the module cache): %s", what, ErrModuleProxy, proxy, lastLines(out, 3))
	default:
		return fmt.Errorf("%s failed (%w); full log in %s: %s", what, err, logPath, lastLines(out, 10))
	}
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (b *Builder) progressf(format string, args ...any) {
	if b.Progress != nil {
		fmt.Fprintf(b.Progress, format+"\n", args...)
	}
}

// tailBuffer keeps the last 64 KiB written to it.
type tailBuffer struct{ buf []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	const keep = 64 << 10
	t.buf = append(t.buf, p...)
	if len(t.buf) > keep {
		t.buf = t.buf[len(t.buf)-keep:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.buf) }
