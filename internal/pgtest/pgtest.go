// Package pgtest gives tests a real PostgreSQL server and each test a database
// of its own on it.
//
// Use it from TestMain, so the server stops when the tests end:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
//
// and in a test:
//
//	url := pgtest.Database(t) // a new, empty database, dropped when t ends
//
// The shared server starts on first use (tests that need none pay nothing):
// initdb in a temporary directory (on /dev/shm when there is one), then
// postgres on a free loopback port with its unix socket in that directory and
// fsync off. Each database is a CREATE DATABASE ... TEMPLATE copy, which takes
// milliseconds. The server is stopped and its directory removed when Run
// returns; if the test binary dies instead (a panic, a timeout, SIGKILL), the
// kernel kills the server with it (parent-death signal, Linux), and the next
// Start removes what it left behind.
//
// Run as root, initdb and postgres run as the "postgres" user (or "nobody"
// when there is none), since postgres refuses to run as root.
//
// Environment:
//   - KUBETASK_TEST_POSTGRES_URL: use this server instead of starting one (a
//     role that may CREATE DATABASE; databases are created and dropped there).
//   - KUBETASK_SKIP_POSTGRES=1: skip the tests that need PostgreSQL. Without
//     it, a machine without the PostgreSQL server binaries fails those tests
//     with a message that says how to install them.
//   - KUBETASK_POSTGRES_BIN: the directory of initdb and postgres, when they
//     are neither on PATH nor in /usr/lib/postgresql/<version>/bin.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// Environment variables that change where the tests get PostgreSQL.
const (
	// URLEnv names an existing server to create the test databases on.
	URLEnv = "KUBETASK_TEST_POSTGRES_URL"
	// SkipEnv, set to 1, skips the tests that need PostgreSQL.
	SkipEnv = "KUBETASK_SKIP_POSTGRES"
	// BinEnv names the directory of initdb and postgres.
	BinEnv = "KUBETASK_POSTGRES_BIN"
)

// startTimeout bounds the start of the shared server (initdb included) on a
// loaded machine.
const startTimeout = 2 * time.Minute

var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Run runs the tests and then stops the shared server, if a test started it,
// and removes its directory. It returns m.Run's exit code, or 1 if the
// server failed to stop.
func Run(m *testing.M) int {
	code := m.Run()
	if err := stopShared(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// StopShared stops the shared server, if a test started it, and removes its
// directory: for a TestMain that runs the tests otherwise than with Run.
// No test may start it afterwards.
func StopShared() error { return stopShared() }

func stopShared() error {
	var err error
	shared.once.Do(func() { err = nil }) // no later start
	if shared.srv != nil {
		err = shared.srv.Stop()
	}
	return err
}

// Shared returns the server of this test binary, starting it on first use:
// the one KUBETASK_TEST_POSTGRES_URL names, else one of its own. It skips tb
// when KUBETASK_SKIP_POSTGRES=1 and fails it when no server can be had (the
// error says how to install PostgreSQL).
func Shared(tb testing.TB) *Server {
	tb.Helper()
	if os.Getenv(SkipEnv) == "1" {
		tb.Skip(SkipEnv + "=1: skipping a test that needs PostgreSQL")
	}
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		if url := os.Getenv(URLEnv); url != "" {
			shared.srv, shared.err = Connect(ctx, url)
			return
		}
		start := time.Now()
		shared.srv, shared.err = Start(ctx, Options{})
		if shared.err == nil {
			fmt.Fprintf(os.Stderr, "pgtest: PostgreSQL %s ready in %s (%s)\n", shared.srv.Version(), time.Since(start).Round(10*time.Millisecond), shared.srv.dir)
		}
	})
	if shared.err != nil {
		tb.Fatalf("pgtest: %v", shared.err)
	}
	if shared.srv == nil {
		tb.Fatal("pgtest: the shared server was stopped (Run has returned)")
	}
	return shared.srv
}

// Database creates a new, empty database on the shared server (see Shared)
// and returns its URL; the database is dropped when tb ends.
func Database(tb testing.TB) string {
	tb.Helper()
	return Shared(tb).Database(tb)
}
