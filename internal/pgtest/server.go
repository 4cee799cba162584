package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options shape a server that Start starts.
type Options struct {
	// Fsync keeps fsync on and the data directory on disk (os.TempDir), for
	// benchmarks of durable writes; off by default: tests need no
	// durability across a machine crash, and the data goes to /dev/shm.
	Fsync bool
	// BinDir is the directory of initdb and postgres; empty means
	// FindBinaries.
	BinDir string
	// Settings are more postgres settings (-c name=value).
	Settings map[string]string
}

// Server is a PostgreSQL server for tests: one that Start started (and Stop
// stops), or an existing one that Connect reached.
type Server struct {
	// base is the URL of the server's maintenance database, "postgres" for
	// a started server.
	base *url.URL
	// prefix starts the names of the databases this process creates.
	prefix  string
	version string
	next    atomic.Int64

	// A started server: its directory, binaries, settings and process.
	dir, binDir string
	port        int
	args        []string
	cred        *syscall.Credential

	mu   sync.Mutex
	proc *process

	// Database's background work: databases created ahead, and drops.
	prefetchOnce sync.Once
	stopPrefetch context.CancelFunc
	ready        chan createdDB
	bg           sync.WaitGroup
}

// ErrNoBinaries reports that the PostgreSQL server binaries are not
// installed; its message says how to install them.
var ErrNoBinaries = errors.New("the PostgreSQL server binaries (initdb, postgres) were not found on PATH, in $" + BinEnv +
	" or in /usr/lib/postgresql/<version>/bin: install them (Debian, Ubuntu: apt-get install -y postgresql;" +
	" Fedora: dnf install postgresql-server; macOS: brew install postgresql), or set " + URLEnv +
	" to a server to use, or " + SkipEnv + "=1 to skip the tests that need PostgreSQL")

// FindBinaries returns the directory that holds initdb and postgres:
// $KUBETASK_POSTGRES_BIN, else initdb's directory on PATH (symbolic links
// resolved), else the newest /usr/lib/postgresql/<version>/bin (Debian's
// layout, not on PATH). It returns ErrNoBinaries when there is none.
func FindBinaries() (string, error) {
	has := func(dir string) bool {
		for _, name := range []string{"initdb", "postgres"} {
			st, err := os.Stat(filepath.Join(dir, name)) //nolint:gosec // a directory of the developer's own choosing
			if err != nil || st.IsDir() {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv(BinEnv); dir != "" {
		if !has(dir) {
			return "", fmt.Errorf("$%s=%s: no initdb and postgres there: %w", BinEnv, dir, ErrNoBinaries)
		}
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if resolved, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(resolved)) {
			return filepath.Dir(resolved), nil
		}
		if has(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { // by version number, newest first
		va, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(a)), 64)
		vb, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(b)), 64)
		return -cmpFloat(va, vb)
	})
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// dirPrefix names the temporary directories of started servers, so Start
// finds those a dead test binary left behind.
const dirPrefix = "kubetask-pgtest-"

// superuser is the role initdb creates (trust authentication, loopback only).
const superuser = "postgres"

// Start starts a PostgreSQL server of its own: initdb in a new temporary
// directory, then postgres on a free loopback port. The server runs until
// Stop, or until this process dies (Linux: the kernel kills it then). Before
// it starts, directories and processes that dead test processes left behind
// are removed.
func Start(ctx context.Context, opts Options) (_ *Server, err error) {
	binDir := opts.BinDir
	if binDir == "" {
		if binDir, err = FindBinaries(); err != nil {
			return nil, err
		}
	}
	base := os.TempDir()
	if !opts.Fsync {
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			base = "/dev/shm"
		}
	}
	sweep(base)
	dir, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("server directory: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, fmt.Errorf("server directory: %w", err)
	}
	s := &Server{dir: dir, binDir: binDir, prefix: "test_"}
	if s.cred, err = serverUser(); err != nil {
		return nil, err
	}
	if s.cred != nil {
		// The server's user owns the directory; root can still remove it.
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, fmt.Errorf("server directory: %w", err)
		}
	}
	if err := s.initdb(ctx); err != nil {
		return nil, err
	}
	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": dir,
		"max_connections":         "300",
		"fsync":                   "off",
		"full_page_writes":        "off",
		"wal_level":               "minimal",
		"max_wal_senders":         "0",
		"log_min_messages":        "warning",
		"lc_messages":             "C",
		"timezone":                "UTC",
	}
	if opts.Fsync {
		for _, k := range []string{"fsync", "full_page_writes", "wal_level", "max_wal_senders"} {
			delete(settings, k)
		}
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		s.args = append(s.args, "-c", k+"="+settings[k])
	}
	// A port can be taken between choosing it and the server binding it:
	// choose again then.
	for try := 1; ; try++ {
		if s.port, err = freePort(); err != nil {
			return nil, err
		}
		err = s.start(ctx)
		if err == nil || !errors.Is(err, errPortInUse) || try == 5 {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	s.base = &url.URL{
		Scheme:   "postgres",
		User:     url.User(superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}
	if err := s.readVersion(ctx); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// Connect returns a Server for the existing server at rawURL, whose role
// must be allowed to create databases. The databases Database creates there
// are named kubetask_test_<pid>_<n>.
func Connect(ctx context.Context, rawURL string) (*Server, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("$%s: want a postgres:// URL", URLEnv)
	}
	s := &Server{base: u, prefix: fmt.Sprintf("kubetask_test_%d_", os.Getpid())}
	if err := s.readVersion(ctx); err != nil {
		return nil, fmt.Errorf("$%s: %w", URLEnv, err)
	}
	return s, nil
}

// serverUser returns the credentials to run initdb and postgres with: nil
// (this process's) unless it runs as root, which postgres refuses; then
// the "postgres" user, or "nobody".
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			errs = append(errs, fmt.Errorf("user %s: uid %q gid %q", name, u.Uid, u.Gid))
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	}
	return nil, fmt.Errorf("running as root, and no unprivileged user to run postgres as: %w", errors.Join(errs...))
}

// env is the environment of initdb and postgres: no PG* variable of ours.
func env() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }

func (s *Server) initdb(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, "initdb"),
		"-D", s.dataDir(), "-U", superuser, "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	cmd.Env = env()
	cmd.Dir = s.dir
	cmd.SysProcAttr = sysProcAttr(s.cred)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

var errPortInUse = errors.New("port in use")

// start starts postgres on s.port and waits until it accepts connections.
func (s *Server) start(ctx context.Context) error {
	logPath := filepath.Join(s.dir, "postgres.log")
	args := append([]string{"-D", s.dataDir(), "-p", strconv.Itoa(s.port)}, s.args...)
	p, err := startProcess(filepath.Join(s.binDir, "postgres"), args, env(), s.dir, logPath, s.cred)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	for {
		c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&connect_timeout=5", superuser, addr))
		if err == nil {
			_ = c.Close(ctx)
			return nil
		}
		select {
		case <-p.done:
			log, _ := os.ReadFile(logPath)
			s.mu.Lock()
			s.proc = nil
			s.mu.Unlock()
			if bytes.Contains(log, []byte("could not bind")) || bytes.Contains(log, []byte("already in use")) {
				return fmt.Errorf("postgres on port %d: %w", s.port, errPortInUse)
			}
			return fmt.Errorf("postgres exited (%w): %s", p.err, lastLines(log, 20))
		case <-ctx.Done():
			log, _ := os.ReadFile(logPath)
			_ = s.Stop()
			return fmt.Errorf("postgres did not accept connections: %w: %s", ctx.Err(), lastLines(log, 20))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) readVersion(ctx context.Context) error {
	c, err := pgx.Connect(ctx, s.base.String())
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(ctx) }()
	return c.QueryRow(ctx, `SHOW server_version`).Scan(&s.version)
}

// Version is the server's version (SHOW server_version).
func (s *Server) Version() string { return s.version }

// URL returns the URL of database on the server.
func (s *Server) URL(database string) string {
	u := *s.base
	u.Path = "/" + database
	u.RawPath = ""
	return u.String()
}

// Dir is the directory of a started server ("" for an existing one).
func (s *Server) Dir() string { return s.dir }

// CreateDatabase creates a new, empty database (a copy of template1) and
// returns its name and URL.
func (s *Server) CreateDatabase(ctx context.Context) (name, dbURL string, err error) {
	name = fmt.Sprintf("%s%d", s.prefix, s.next.Add(1))
	if err := s.exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()+` TEMPLATE template1`); err != nil {
		return "", "", fmt.Errorf("create database %s: %w", name, err)
	}
	return name, s.URL(name), nil
}

// DropDatabase drops database name, closing its sessions first.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	if err := s.exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// prefetch is how many databases Database keeps created ahead, so that a
// test seldom waits for CREATE DATABASE.
const prefetch = 2

type createdDB struct {
	name, url string
	err       error
}

// Database returns the URL of a new, empty database for tb and drops it
// when tb ends. The databases are created ahead in the background (a few at
// a time) and dropped in the background; Stop waits for both.
func (s *Server) Database(tb testing.TB) string {
	tb.Helper()
	s.prefetchOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopPrefetch = cancel
		s.ready = make(chan createdDB, prefetch)
		s.bg.Go(func() {
			defer close(s.ready)
			for ctx.Err() == nil {
				name, dbURL, err := s.CreateDatabase(ctx)
				select {
				case s.ready <- createdDB{name, dbURL, err}:
				case <-ctx.Done():
					if err == nil {
						s.drop(name)
					}
					return
				}
			}
		})
	})
	var db createdDB
	select {
	case d, ok := <-s.ready:
		if !ok {
			tb.Fatal("pgtest: the server is stopping")
		}
		db = d
	case <-time.After(time.Minute):
		tb.Fatal("pgtest: no database created within a minute")
	}
	if db.err != nil {
		tb.Fatalf("pgtest: %v", db.err)
	}
	tb.Cleanup(func() { s.bg.Go(func() { s.drop(db.name) }) })
	return db.url
}

// drop drops a test's database in the background (an error is only
// logged: the server's directory goes with Stop anyway).
func (s *Server) drop(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.DropDatabase(ctx, name); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
	}
}

func (s *Server) exec(ctx context.Context, sql string) error {
	c, err := pgx.Connect(ctx, s.base.String())
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(ctx) }()
	_, err = c.Exec(ctx, sql)
	return err
}

// Crash stops a started server the way a crash would (an immediate
// shutdown: no checkpoint, the next start recovers from the WAL) and waits
// until it has exited. Restart starts it again.
func (s *Server) Crash() error { return s.signal(syscall.SIGQUIT, 30*time.Second) }

// Shutdown stops a started server as an administrator would (pg_ctl stop
// -m fast: its sessions are terminated, 57P01, and it checkpoints) and waits
// until it has exited; its data stays, and Restart starts it again.
func (s *Server) Shutdown() error { return s.signal(syscall.SIGINT, 30*time.Second) }

// Restart starts a server stopped by Crash or Shutdown (or Stop, while its
// directory still exists) again on the same port and data.
func (s *Server) Restart(ctx context.Context) error {
	if s.dir == "" {
		return errors.New("not a started server")
	}
	return s.start(ctx)
}

// Stop waits for Database's background work (the drops of the tests'
// databases), then stops a started server (a fast shutdown, then SIGKILL if
// it takes more than 30s) and removes its directory; for an existing server,
// it stops there. A second Stop does nothing.
func (s *Server) Stop() error {
	s.prefetchOnce.Do(func() {})
	if s.stopPrefetch != nil {
		s.stopPrefetch()
		for d := range s.ready { // created ahead, never used
			if d.err == nil {
				s.bg.Go(func() { s.drop(d.name) })
			}
		}
	}
	s.bg.Wait()
	if s.dir == "" {
		return nil
	}
	err := s.signal(syscall.SIGINT, 30*time.Second)
	if rmErr := os.RemoveAll(s.dir); rmErr != nil && err == nil {
		err = fmt.Errorf("server directory: %w", rmErr)
	}
	return err
}

// signal sends sig to the postmaster and waits until it has exited, sending
// SIGKILL after grace.
func (s *Server) signal(sig syscall.Signal, grace time.Duration) error {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("postgres did not stop within %s of %v: killed", grace, sig)
	}
}
