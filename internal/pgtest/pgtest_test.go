package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// helperEnv makes the test binary a helper process of the tests below.
const helperEnv = "PGTEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "crash":
		helperCrash()
	}
	os.Exit(Run(m))
}

// helperCrash starts a server, prints its directory and postmaster PID and
// exits without stopping it, as a test binary that panics or times out does.
func helperCrash() {
	s, err := Start(context.Background(), Options{})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	fmt.Println(s.Dir(), s.proc.cmd.Process.Pid)
	os.Exit(3)
}

// TestDatabases creates databases on the shared server: each is empty and
// usable, and the one of a finished test is dropped (in the background).
func TestDatabases(t *testing.T) {
	ctx := context.Background()
	srv := Shared(t)
	var names []string
	for i := range 2 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			c, err := pgx.Connect(ctx, Database(t))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(ctx)
			var name string
			var tables int
			if err := c.QueryRow(ctx, `SELECT current_database(), (SELECT count(*) FROM pg_tables WHERE schemaname = 'public')`).Scan(&name, &tables); err != nil {
				t.Fatal(err)
			}
			if tables != 0 {
				t.Errorf("%d tables in a new database", tables)
			}
			if _, err := c.Exec(ctx, `CREATE TABLE t (x int)`); err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
		})
	}
	if len(names) != 2 || names[0] == names[1] {
		t.Fatalf("databases %v, want two distinct ones", names)
	}
	c, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	// Dropped in the background: soon.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = ANY($1)`, names).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d databases of finished tests left after 30s", n)
		}
	}
}

// TestServerUser checks that a server started as root runs as an
// unprivileged user, and that its settings apply.
func TestServerUser(t *testing.T) {
	srv := Shared(t)
	if srv.Dir() == "" {
		t.Skip("an existing server (" + URLEnv + ")")
	}
	srv.mu.Lock()
	pid := srv.proc.cmd.Process.Pid
	srv.mu.Unlock()
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skip("no /proc")
	}
	for _, line := range strings.Split(string(st), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			if f[1] == "0" {
				t.Errorf("postgres runs as root")
			}
			if os.Geteuid() != 0 && f[1] != strconv.Itoa(os.Geteuid()) {
				t.Errorf("postgres runs as uid %s, not as this process (%d)", f[1], os.Geteuid())
			}
		}
	}
	c, err := pgx.Connect(context.Background(), srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var fsync, sockets string
	if err := c.QueryRow(context.Background(), `SELECT current_setting('fsync'), current_setting('unix_socket_directories')`).Scan(&fsync, &sockets); err != nil {
		t.Fatal(err)
	}
	if fsync != "off" || sockets != srv.Dir() {
		t.Errorf("fsync %s, unix sockets in %s; want off and %s", fsync, sockets, srv.Dir())
	}
}

// TestCrashRestartStop crashes a server of its own, restarts it (the data
// survives) and stops it: the process is gone and the directory removed.
func TestCrashRestartStop(t *testing.T) {
	if os.Getenv(SkipEnv) == "1" {
		t.Skip(SkipEnv + "=1")
	}
	if os.Getenv(URLEnv) != "" {
		t.Skip("an existing server (" + URLEnv + ")")
	}
	ctx := context.Background()
	s, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	_, dbURL, err := s.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) error {
		c, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, sql)
		return err
	}
	if err := exec(`CREATE TABLE t AS SELECT 1 AS x`); err != nil {
		t.Fatal(err)
	}
	if err := s.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := exec(`SELECT 1`); err == nil {
		t.Fatal("a crashed server answers")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := exec(`SELECT x FROM t`); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	pid := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.proc.cmd.Process.Pid
	}()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("postmaster %d still runs after Stop", pid)
	}
	if _, err := os.Stat(s.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s after Stop: %v", s.Dir(), err)
	}
	if procs := processesIn(t, s.Dir()); len(procs) > 0 {
		t.Errorf("processes of the server left after Stop: %v", procs)
	}
}

// TestDeadTestBinaryLeavesNoProcess runs a test binary that starts a server
// and exits without stopping it: the server's processes die with it
// (parent-death signal), and the next Start's sweep removes its directory.
func TestDeadTestBinaryLeavesNoProcess(t *testing.T) {
	if os.Getenv(SkipEnv) == "1" {
		t.Skip(SkipEnv + "=1")
	}
	if _, err := os.Stat("/proc/self"); err != nil {
		t.Skip("needs Linux (/proc, parent-death signal)")
	}
	if _, err := FindBinaries(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=crash")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("helper: %v, output %q", err, out)
	}
	var dir string
	var pid int
	if _, err := fmt.Sscan(string(out), &dir, &pid); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	t.Logf("helper left %s, postmaster %d", dir, pid)
	deadline := time.Now().Add(30 * time.Second)
	for alive(pid) || len(processesIn(t, dir)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("30s after the test binary died: postmaster alive %v, processes %v", alive(pid), processesIn(t, dir))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Another test binary's Start may have swept it already.
	sweep(filepath.Dir(dir))
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s after the sweep: %v", dir, err)
	}
}

// processesIn lists the processes whose command line names dir.
func processesIn(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc")
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), dir) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// TestMissingBinaries runs a test that needs PostgreSQL in a test binary
// that cannot find the binaries: it fails with the install hint, or skips
// when KUBETASK_SKIP_POSTGRES=1.
func TestMissingBinaries(t *testing.T) {
	run := func(extra ...string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNeedsPostgres$", "-test.v")
		cmd.Env = append(filteredEnv(URLEnv, SkipEnv, BinEnv, "PATH"),
			append([]string{"PATH=/nonexistent", BinEnv + "=" + t.TempDir(), "PGTEST_NEEDS=1"}, extra...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run()
	if err == nil || !strings.Contains(out, "--- FAIL: TestNeedsPostgres") || !strings.Contains(out, "apt-get install -y postgresql") {
		t.Errorf("without binaries: err %v, output:\n%s\nwant a failure that says how to install PostgreSQL", err, out)
	}
	out, err = run(SkipEnv + "=1")
	if err != nil || !strings.Contains(out, "--- SKIP: TestNeedsPostgres") {
		t.Errorf("without binaries, %s=1: err %v, output:\n%s\nwant a skip", SkipEnv, err, out)
	}
}

// TestNeedsPostgres is TestMissingBinaries' helper.
func TestNeedsPostgres(t *testing.T) {
	if os.Getenv("PGTEST_NEEDS") == "" {
		t.Skip("a helper of TestMissingBinaries")
	}
	Database(t)
}

func filteredEnv(drop ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, d := range drop {
			keep = keep && k != d
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
