package store_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

func openSQLite(t *testing.T, path string) store.Store {
	t.Helper()
	s, err := store.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatalf("OpenSQLite: %v", err)
	}
	return s
}

func TestSQLite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return openSQLite(t, filepath.Join(t.TempDir(), "tasks.db"))
	})
}

func TestSQLiteClock(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	clk := clocktesting.NewFakePassiveClock(t0)
	s, err := store.OpenSQLiteWithClock(ctx, filepath.Join(t.TempDir(), "tasks.db"), clk)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec, _, err := s.Create(ctx, storetest.Sample("a"))
	if err != nil {
		t.Fatal(err)
	}
	t1 := t0.Add(time.Minute + time.Nanosecond)
	clk.SetTime(t1)
	if rec, err = s.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []store.Record{rec, got} {
		if !r.CreatedAt.Equal(t0) || !r.UpdatedAt.Equal(t1) {
			t.Errorf("CreatedAt %v UpdatedAt %v, want %v and %v", r.CreatedAt, r.UpdatedAt, t0, t1)
		}
	}
}

func TestSQLiteReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openSQLite(t, path)
	rec, _, err := s.Create(ctx, storetest.Sample("a"))
	if err != nil {
		t.Fatal(err)
	}
	rec.Terminal, rec.Phase = true, "Succeeded"
	if rec, err = s.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openSQLite(t, path)
	defer s.Close()
	got, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatalf("Get after reopen: %v", err)
	}
	if diff := cmp.Diff(rec, got); diff != "" {
		t.Errorf("record after reopen (-before +after):\n%s", diff)
	}
	if _, created, err := s.Create(ctx, storetest.Sample("a")); err != nil || created {
		t.Errorf("Create after reopen: created %v, err %v; want false, nil", created, err)
	}
}

func TestSQLiteNotADatabase(t *testing.T) {
	dir := t.TempDir()
	tests := map[string]func(t *testing.T) string{
		"text file": func(t *testing.T) string {
			p := filepath.Join(dir, "garbage.db")
			if err := os.WriteFile(p, []byte(strings.Repeat("this is not a database\n", 200)), 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		},
		"missing directory": func(t *testing.T) string { return filepath.Join(dir, "no", "such", "dir", "tasks.db") },
		"directory":         func(t *testing.T) string { return dir },
		"query in path":     func(t *testing.T) string { return filepath.Join(dir, "a?b.db") },
	}
	for name, path := range tests {
		t.Run(name, func(t *testing.T) {
			p := path(t)
			s, err := store.OpenSQLite(context.Background(), p)
			if err == nil {
				s.Close()
				t.Fatalf("OpenSQLite(%s): err = nil", p)
			}
			if !strings.Contains(err.Error(), p) {
				t.Errorf("error does not name the path %s: %v", p, err)
			}
			t.Logf("error: %v", err)
		})
	}
}

const durabilityEnv = "KUBETASK_STORE_DURABILITY_CHILD"

// TestMain lets the test binary double as the child process of
// TestSQLiteDurability.
func TestMain(m *testing.M) {
	if path := os.Getenv(durabilityEnv); path != "" {
		durabilityChild(path)
	}
	os.Exit(m.Run())
}

// durabilityChild updates record "a" in a loop and prints each version right
// after Update returns, until it is killed.
func durabilityChild(path string) {
	ctx := context.Background()
	s, err := store.OpenSQLite(ctx, path)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	rec, err := s.Get(ctx, "a")
	for err == nil {
		rec.Attempt++
		rec.Message = fmt.Sprintf("write %d", rec.Attempt)
		if rec, err = s.Update(ctx, rec); err == nil {
			fmt.Printf("version %d\n", rec.Version)
		}
	}
	fmt.Println("error", err)
	os.Exit(2)
}

// TestSQLiteDurability kills a process that is writing with SIGKILL right
// after one of its Updates returned and checks that the reopened database
// holds that write (or a later one): nothing acknowledged is lost, and the
// file is not left unreadable. A process kill leaves the OS page cache
// intact, so this checks that an acknowledged write is committed, not fsync
// on power loss (synchronous=FULL covers that).
func TestSQLiteDurability(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openSQLite(t, path)
	if _, _, err := s.Create(ctx, storetest.Sample("a")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for _, killAfter := range []int64{2, 25} {
		t.Run(fmt.Sprintf("kill after %d writes", killAfter), func(t *testing.T) {
			before := openSQLite(t, path)
			start, err := before.Get(ctx, "a")
			before.Close()
			if err != nil {
				t.Fatal(err)
			}

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), durabilityEnv+"="+path)
			cmd.Stderr = os.Stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			killed := false
			t.Cleanup(func() {
				if !killed {
					cmd.Process.Kill()
					cmd.Wait()
				}
			})

			// Read acknowledged versions until killAfter of them, then kill at
			// once; the child keeps writing meanwhile, so the kill lands at an
			// arbitrary point of a later write.
			acked := make(chan int64)
			go func() {
				defer close(acked)
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					line := sc.Text()
					v, ok := strings.CutPrefix(line, "version ")
					if !ok {
						t.Errorf("child: %s", line)
						return
					}
					n, err := strconv.ParseInt(v, 10, 64)
					if err != nil {
						t.Errorf("child: %s", line)
						return
					}
					acked <- n
				}
			}()
			var last int64
			deadline := time.After(time.Minute)
			for last < start.Version+killAfter {
				select {
				case v, ok := <-acked:
					if !ok {
						t.Fatalf("child exited after acknowledging version %d", last)
					}
					last = v
				case <-deadline:
					t.Fatalf("child acknowledged only version %d within a minute", last)
				}
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
			go func() {
				for range acked { // drain, so the reader can finish
				}
			}()
			err = cmd.Wait()
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child did not die of SIGKILL: %v", err)
			}

			after := openSQLite(t, path)
			defer after.Close()
			got, err := after.Get(ctx, "a")
			if err != nil {
				t.Fatalf("Get after SIGKILL: %v", err)
			}
			if got.Version < last {
				t.Fatalf("stored version %d after SIGKILL, but the child acknowledged %d", got.Version, last)
			}
			if want := fmt.Sprintf("write %d", got.Attempt); got.Message != want || got.Version-start.Version != int64(got.Attempt-start.Attempt) {
				t.Fatalf("torn record after SIGKILL: version %d attempt %d message %q", got.Version, got.Attempt, got.Message)
			}
			t.Logf("acknowledged version %d, stored version %d", last, got.Version)
		})
	}
}
