package store_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/internal/pgtest"
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
	storetest.RunWithOptions(t, func(t *testing.T, opts store.Options) store.Store {
		s, err := store.OpenSQLiteWithOptions(context.Background(), filepath.Join(t.TempDir(), "tasks.db"), opts)
		if err != nil {
			t.Fatalf("OpenSQLite: %v", err)
		}
		return s
	})
}

func TestSQLiteClusters(t *testing.T) {
	storetest.RunClusters(t, func(t *testing.T) store.Store {
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

// durabilityWriters is how many goroutines of the durability child write at
// once, so that its writes are committed in groups.
const durabilityWriters = 8

func durabilityID(i int) string { return fmt.Sprintf("w%d", i) }

// TestMain lets the test binary double as the child process of
// TestSQLiteDurability, and stops the PostgreSQL servers of the PostgreSQL
// tests (pgtest) and benchmarks when they end.
func TestMain(m *testing.M) {
	if path := os.Getenv(durabilityEnv); path != "" {
		durabilityChild(path)
	}
	code := pgtest.Run(m)
	stopBenchServer()
	os.Exit(code)
}

// durabilityChild updates the records w0..w7 in a loop, one goroutine each,
// and prints "<id> version <n>" right after each Update returns, until it is
// killed.
func durabilityChild(path string) {
	ctx := context.Background()
	s, err := store.OpenSQLite(ctx, path)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	var mu sync.Mutex // one whole line per write
	var wg sync.WaitGroup
	for i := range durabilityWriters {
		wg.Go(func() {
			rec, err := s.Get(ctx, durabilityID(i))
			for err == nil {
				rec.Attempt++
				rec.Message = fmt.Sprintf("write %d", rec.Attempt)
				if rec, err = s.Update(ctx, rec); err == nil {
					mu.Lock()
					fmt.Printf("%s version %d\n", rec.ID, rec.Version)
					mu.Unlock()
				}
			}
			mu.Lock()
			fmt.Println("error", err)
			mu.Unlock()
		})
	}
	wg.Wait()
	os.Exit(2)
}

// TestSQLiteDurability kills a process whose goroutines are writing at once
// (so their writes share group commits) with SIGKILL right after some of its
// Updates returned, and checks that the reopened database holds, for every
// record, the last acknowledged write or a later one: nothing acknowledged is
// lost, no record is torn, and the file is not left unreadable. A process
// kill leaves the OS page cache intact, so this checks that an acknowledged
// write is committed, not fsync on power loss (synchronous=FULL covers that).
func TestSQLiteDurability(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openSQLite(t, path)
	for i := range durabilityWriters {
		if _, _, err := s.Create(ctx, storetest.Sample(durabilityID(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for _, killAfter := range []int{2, 200} {
		t.Run(fmt.Sprintf("kill after %d writes", killAfter), func(t *testing.T) {
			before := openSQLite(t, path)
			start := map[string]store.Record{}
			for i := range durabilityWriters {
				rec, err := before.Get(ctx, durabilityID(i))
				if err != nil {
					t.Fatal(err)
				}
				start[rec.ID] = rec
			}
			before.Close()

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
			// arbitrary point of later writes.
			type ack struct {
				id      string
				version int64
			}
			acked := make(chan ack)
			go func() {
				defer close(acked)
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					line := sc.Text()
					var a ack
					if _, err := fmt.Sscanf(line, "%s version %d", &a.id, &a.version); err != nil {
						t.Errorf("child: %s", line)
						return
					}
					acked <- a
				}
			}()
			last := map[string]int64{}
			deadline := time.After(time.Minute)
			for n := 0; n < killAfter; n++ {
				select {
				case a, ok := <-acked:
					if !ok {
						t.Fatalf("child exited after acknowledging %d writes", n)
					}
					if a.version <= last[a.id] {
						t.Fatalf("child acknowledged %s version %d after version %d", a.id, a.version, last[a.id])
					}
					last[a.id] = a.version
				case <-deadline:
					t.Fatalf("child acknowledged only %d writes within a minute", n)
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
			for id, first := range start {
				got, err := after.Get(ctx, id)
				if err != nil {
					t.Fatalf("Get(%s) after SIGKILL: %v", id, err)
				}
				if got.Version < last[id] {
					t.Errorf("%s: stored version %d after SIGKILL, but the child acknowledged %d", id, got.Version, last[id])
				}
				if want := fmt.Sprintf("write %d", got.Attempt); got.Version != first.Version && got.Message != want ||
					got.Version-first.Version != int64(got.Attempt-first.Attempt) {
					t.Errorf("%s: torn record after SIGKILL: version %d attempt %d message %q", id, got.Version, got.Attempt, got.Message)
				}
				t.Logf("%s: acknowledged version %d, stored version %d", id, last[id], got.Version)
			}
		})
	}
}

// heldStore is a SQLite store whose writer, while hold is set, stops before
// each commit until the test lets it go: the test decides which writes
// share a group.
type heldStore struct {
	store.Store
	hold atomic.Bool
	// arrived receives the number of writes applied in each held group.
	arrived chan int
	// proceed lets one held group commit.
	proceed chan struct{}
	// released lets every group commit, when the test ends.
	released chan struct{}
}

// openHeld opens a heldStore; the test's cleanup releases and closes it.
func openHeld(t *testing.T, path string) *heldStore {
	t.Helper()
	h := &heldStore{arrived: make(chan int), proceed: make(chan struct{}), released: make(chan struct{})}
	s, err := store.OpenSQLiteBeforeCommit(context.Background(), path, func(applied int) {
		if !h.hold.Load() {
			return
		}
		select {
		case h.arrived <- applied:
		case <-h.released:
			return
		}
		select {
		case <-h.proceed:
		case <-h.released:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Store = s
	t.Cleanup(func() {
		close(h.released)
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

// nextGroup waits until the writer holds a group and returns its size.
func (h *heldStore) nextGroup(t *testing.T) int {
	t.Helper()
	select {
	case n := <-h.arrived:
		return n
	case <-time.After(time.Minute):
		t.Fatal("no group reached its commit within a minute")
		return 0
	}
}

// waitQueued waits until n writes wait in the writer's queue.
func waitQueued(t *testing.T, s store.Store, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); store.SQLiteQueued(s) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued after a minute, want %d", store.SQLiteQueued(s), n)
		}
	}
}

type writeResult struct {
	rec     store.Record
	created bool
	err     error
}

// goUpdate and goCreate start a call and return where its result arrives.
func goUpdate(ctx context.Context, s store.Store, rec store.Record) <-chan writeResult {
	c := make(chan writeResult, 1)
	go func() {
		out, err := s.Update(ctx, rec)
		c <- writeResult{rec: out, err: err}
	}()
	return c
}

func goCreate(ctx context.Context, s store.Store, rec store.Record) <-chan writeResult {
	c := make(chan writeResult, 1)
	go func() {
		out, created, err := s.Create(ctx, rec)
		c <- writeResult{out, created, err}
	}()
	return c
}

// plugWriter starts an update of plug and waits until the writer holds it
// in a group of its own, so writes submitted next queue up behind it.
func plugWriter(t *testing.T, h *heldStore, plug store.Record) <-chan writeResult {
	t.Helper()
	h.hold.Store(true)
	done := goUpdate(context.Background(), h, plug)
	if n := h.nextGroup(t); n != 1 {
		t.Fatalf("plug group of %d writes, want 1", n)
	}
	return done
}

// TestSQLiteGroupMixedOutcomes queues writes with different outcomes behind
// a held group and checks that the writer commits them in one transaction in
// queue order, each with its own outcome.
func TestSQLiteGroupMixedOutcomes(t *testing.T) {
	ctx := context.Background()
	h := openHeld(t, filepath.Join(t.TempDir(), "tasks.db"))
	plug := mustCreate(t, h, storetest.Sample("plug"))
	stale := mustCreate(t, h, storetest.Sample("a"))
	cur, err := h.Update(ctx, stale)
	if err != nil {
		t.Fatal(err)
	}
	existing := mustCreate(t, h, storetest.Sample("existing"))
	plugDone := plugWriter(t, h, plug)

	first, second := storetest.Sample("new"), storetest.Sample("new")
	first.Message, second.Message = "first", "second"
	good, again := cur.DeepCopy(), cur.DeepCopy()
	good.Message, again.Message = "good", "again"
	missing := storetest.Sample("missing")
	missing.Version = 1
	calls := []struct {
		name  string
		start func() <-chan writeResult
	}{
		{"create new (first)", func() <-chan writeResult { return goCreate(ctx, h, first) }},
		{"update a", func() <-chan writeResult { return goUpdate(ctx, h, good) }},
		{"update a from a stale version", func() <-chan writeResult { return goUpdate(ctx, h, stale) }},
		{"create new (second)", func() <-chan writeResult { return goCreate(ctx, h, second) }},
		{"update missing", func() <-chan writeResult { return goUpdate(ctx, h, missing) }},
		{"update a from the version the first update had", func() <-chan writeResult { return goUpdate(ctx, h, again) }},
		{"create existing", func() <-chan writeResult { return goCreate(ctx, h, storetest.Sample("existing")) }},
	}
	results := make([]<-chan writeResult, len(calls))
	for i, c := range calls {
		results[i] = c.start()
		waitQueued(t, h.Store, i+1) // one at a time: the queue order is the list's
	}
	commits := store.SQLiteCommits(h.Store)
	h.proceed <- struct{}{} // the plug commits
	if n := h.nextGroup(t); n != len(calls) {
		t.Fatalf("group of %d writes, want all %d queued", n, len(calls))
	}
	h.proceed <- struct{}{}
	h.hold.Store(false)
	if r := <-plugDone; r.err != nil {
		t.Fatalf("plug: %v", r.err)
	}
	got := make([]writeResult, len(calls))
	for i := range calls {
		got[i] = <-results[i]
	}
	if n := store.SQLiteCommits(h.Store) - commits; n != 2 {
		t.Errorf("%d commits for the plug and the queued writes, want 2", n)
	}

	check := func(i int, ok bool, format string, args ...any) {
		t.Helper()
		if !ok {
			t.Errorf("%s: "+format, append([]any{calls[i].name}, args...)...)
		}
	}
	check(0, got[0].err == nil && got[0].created && got[0].rec.Message == "first", "created %v message %q err %v; want true, first, nil", got[0].created, got[0].rec.Message, got[0].err)
	check(1, got[1].err == nil && got[1].rec.Version == 3, "version %d err %v; want 3, nil", got[1].rec.Version, got[1].err)
	check(2, errors.Is(got[2].err, store.ErrConflict), "err %v, want ErrConflict", got[2].err)
	check(3, got[3].err == nil && !got[3].created && got[3].rec.Message == "first", "created %v message %q err %v; want false, first, nil", got[3].created, got[3].rec.Message, got[3].err)
	check(4, errors.Is(got[4].err, store.ErrNotFound), "err %v, want ErrNotFound", got[4].err)
	check(5, errors.Is(got[5].err, store.ErrConflict), "err %v, want ErrConflict", got[5].err)
	check(6, got[6].err == nil && !got[6].created && cmp.Equal(got[6].rec, existing), "created %v err %v, record differs: %v", got[6].created, got[6].err, cmp.Diff(existing, got[6].rec))
	if diff := cmp.Diff(got[1].rec, mustGet(t, h, "a")); diff != "" {
		t.Errorf("stored a is not the successful update's (-update +stored):\n%s", diff)
	}
	if diff := cmp.Diff(got[0].rec, mustGet(t, h, "new")); diff != "" {
		t.Errorf("stored new is not the first create's (-create +stored):\n%s", diff)
	}
	if diff := cmp.Diff(got[0].rec, got[3].rec); diff != "" {
		t.Errorf("the second create returned other than the first's record (-first +second):\n%s", diff)
	}
}

// TestSQLiteCancelQueuedWrite cancels a write that waits in the queue while
// the writer is busy: the call returns at once with the context's error, the
// writer skips the write, and it never takes a version.
func TestSQLiteCancelQueuedWrite(t *testing.T) {
	ctx := context.Background()
	h := openHeld(t, filepath.Join(t.TempDir(), "tasks.db"))
	plug := mustCreate(t, h, storetest.Sample("plug"))
	a := mustCreate(t, h, storetest.Sample("a"))
	plugDone := plugWriter(t, h, plug)

	callCtx, cancel := context.WithCancel(ctx)
	cancelled := a.DeepCopy()
	cancelled.Message = "cancelled"
	res := goUpdate(callCtx, h, cancelled)
	waitQueued(t, h.Store, 1)
	cancel()
	// The writer is still held: the call returns without waiting for it.
	if r := <-res; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled update: err = %v, want context.Canceled", r.err)
	}
	after := a.DeepCopy()
	after.Message = "after"
	afterRes := goUpdate(ctx, h, after)
	waitQueued(t, h.Store, 2)
	h.proceed <- struct{}{} // the plug commits
	if n := h.nextGroup(t); n != 1 {
		t.Errorf("group applied %d writes, want 1 (the cancelled one skipped)", n)
	}
	h.proceed <- struct{}{}
	h.hold.Store(false)
	if r := <-plugDone; r.err != nil {
		t.Fatalf("plug: %v", r.err)
	}
	r := <-afterRes
	if r.err != nil || r.rec.Version != a.Version+1 {
		t.Fatalf("update after the cancelled one: version %d err %v; want %d, nil", r.rec.Version, r.err, a.Version+1)
	}
	if diff := cmp.Diff(r.rec, mustGet(t, h, "a")); diff != "" {
		t.Errorf("stored record (-want +got):\n%s", diff)
	}
}

// TestSQLiteCancelTakenWrite cancels a write after the writer applied it in
// a transaction that is about to commit: the call waits for that commit and
// reports the write as done, so a cancelled call never leaves its caller
// guessing.
func TestSQLiteCancelTakenWrite(t *testing.T) {
	h := openHeld(t, filepath.Join(t.TempDir(), "tasks.db"))
	a := mustCreate(t, h, storetest.Sample("a"))
	h.hold.Store(true)
	callCtx, cancel := context.WithCancel(context.Background())
	a.Message = "taken"
	res := goUpdate(callCtx, h, a)
	if n := h.nextGroup(t); n != 1 {
		t.Fatalf("group of %d writes, want 1", n)
	}
	cancel()
	h.proceed <- struct{}{}
	h.hold.Store(false)
	r := <-res
	if r.err != nil || r.rec.Version != a.Version+1 {
		t.Fatalf("update cancelled after it was taken: version %d err %v; want %d, nil", r.rec.Version, r.err, a.Version+1)
	}
	if diff := cmp.Diff(r.rec, mustGet(t, h, "a")); diff != "" {
		t.Errorf("stored record (-returned +stored):\n%s", diff)
	}
}

// TestSQLiteCloseDrainsQueue closes the store while writes wait in the queue
// behind a held group: Close waits until they are committed and answered,
// and they are in the file when it is opened again.
func TestSQLiteCloseDrainsQueue(t *testing.T) {
	const queued = 5
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tasks.db")
	h := openHeld(t, path)
	plug := mustCreate(t, h, storetest.Sample("plug"))
	recs := make([]store.Record, queued)
	for i := range recs {
		recs[i] = mustCreate(t, h, storetest.Sample(fmt.Sprintf("q%d", i)))
	}
	plugDone := plugWriter(t, h, plug)
	results := make([]<-chan writeResult, queued)
	for i, rec := range recs {
		rec.Message = "queued before Close"
		results[i] = goUpdate(ctx, h, rec)
	}
	waitQueued(t, h.Store, queued)
	closed := make(chan error, 1)
	go func() { closed <- h.Close() }()
	h.proceed <- struct{}{} // the plug commits
	if n := h.nextGroup(t); n != queued {
		t.Errorf("group of %d writes, want the %d queued", n, queued)
	}
	h.proceed <- struct{}{}
	if r := <-plugDone; r.err != nil {
		t.Fatalf("plug: %v", r.err)
	}
	for i := range results {
		if r := <-results[i]; r.err != nil {
			t.Errorf("queued write %d: %v", i, r.err)
		}
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := h.Update(ctx, recs[0]); err == nil {
		t.Errorf("Update after Close: err = nil")
	}

	s := openSQLite(t, path)
	defer s.Close()
	for _, rec := range recs {
		if got := mustGet(t, s, rec.ID); got.Message != "queued before Close" || got.Version != rec.Version+1 {
			t.Errorf("%s after reopen: version %d message %q; want %d, the queued write", rec.ID, got.Version, got.Message, rec.Version+1)
		}
	}
}

func mustCreate(t *testing.T, s store.Store, rec store.Record) store.Record {
	t.Helper()
	out, created, err := s.Create(context.Background(), rec)
	if err != nil || !created {
		t.Fatalf("Create(%s): created %v, err %v", rec.ID, created, err)
	}
	return out
}

func mustGet(t *testing.T, s store.Store, id string) store.Record {
	t.Helper()
	out, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return out
}

// TestSQLiteUpdateKeepsEveryIndex: an Update that changes a task's
// namespace, name, executor, cluster or terminal flag (the columns the
// progress statement leaves out and requires as stored) is written in full,
// one that keeps them by the progress statement; either way Get, the lists
// served from those indexes and SQLite's own integrity check (every index
// entry matches its row) agree with the record written.
func TestSQLiteUpdateKeepsEveryIndex(t *testing.T) {
	for name, change := range map[string]func(*store.Record){
		"progress only": func(r *store.Record) { r.Phase, r.Reason = "Running", "ContainerRunning" },
		"namespace":     func(r *store.Record) { r.Namespace = "other" },
		"name":          func(r *store.Record) { r.Name = "renamed" },
		"executor":      func(r *store.Record) { r.Executor = "exec-b" },
		"cluster":       func(r *store.Record) { r.Cluster = "west" },
		"terminal":      func(r *store.Record) { r.Phase, r.Terminal = "Succeeded", true },
		"all of them": func(r *store.Record) {
			r.Namespace, r.Name, r.Executor, r.Cluster, r.Phase, r.Terminal = "other", "renamed", "exec-b", "west", "Failed", true
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "tasks.db")
			s := openSQLite(t, path)
			defer s.Close()
			for _, id := range []string{"a", "b", "c"} {
				rec := storetest.Sample(id)
				rec.Namespace, rec.Name, rec.Executor, rec.Cluster, rec.Phase, rec.Terminal = "ns", "task-"+id, "exec-a", "east", "Pending", false
				mustCreate(t, s, rec)
			}
			rec := mustGet(t, s, "b")
			change(&rec)
			want, err := s.Update(ctx, rec)
			if err != nil {
				t.Fatal(err)
			}
			if got := mustGet(t, s, "b"); got.Namespace != want.Namespace || got.Name != want.Name || got.Executor != want.Executor ||
				got.Cluster != want.Cluster || got.Phase != want.Phase || got.Terminal != want.Terminal || got.Version != want.Version {
				t.Errorf("Get: %s/%s %s %s %s terminal=%v v%d, want %s/%s %s %s %s terminal=%v v%d",
					got.Namespace, got.Name, got.Executor, got.Cluster, got.Phase, got.Terminal, got.Version,
					want.Namespace, want.Name, want.Executor, want.Cluster, want.Phase, want.Terminal, want.Version)
			}
			has := func(recs []store.Record) bool {
				return slices.ContainsFunc(recs, func(r store.Record) bool { return r.ID == "b" })
			}
			page, err := s.(store.Pager).Page(ctx, store.PageOptions{Namespace: want.Namespace, NamePrefix: want.Name, Phase: want.Phase, Terminal: &want.Terminal})
			if err != nil {
				t.Fatal(err)
			}
			if !has(page.Records) {
				t.Errorf("a page of namespace %q, name %q, phase %s, terminal=%v misses the task", want.Namespace, want.Name, want.Phase, want.Terminal)
			}
			list, err := s.List(ctx, store.ListOptions{Executor: want.Executor, NonTerminal: !want.Terminal})
			if err != nil {
				t.Fatal(err)
			}
			if !has(list) {
				t.Errorf("the list of executor %s (non-terminal %v) misses the task", want.Executor, !want.Terminal)
			}
			if list, err = s.List(ctx, store.ListOptions{Cluster: want.Cluster, NonTerminal: !want.Terminal}); err != nil {
				t.Fatal(err)
			}
			if !has(list) {
				t.Errorf("the list of cluster %s (non-terminal %v) misses the task", want.Cluster, !want.Terminal)
			}
			if page, err = s.(store.Pager).Page(ctx, store.PageOptions{Cluster: want.Cluster, Terminal: &want.Terminal}); err != nil {
				t.Fatal(err)
			}
			if !has(page.Records) {
				t.Errorf("a page of cluster %q, terminal=%v misses the task", want.Cluster, want.Terminal)
			}
			if want.Cluster != "east" {
				list, err := s.List(ctx, store.ListOptions{Cluster: "east"})
				if err != nil {
					t.Fatal(err)
				}
				if has(list) {
					t.Error("the list of cluster east still has the task")
				}
			}
			if want.Executor != "exec-a" || want.Terminal {
				list, err := s.List(ctx, store.ListOptions{Executor: "exec-a", NonTerminal: true})
				if err != nil {
					t.Fatal(err)
				}
				if has(list) {
					t.Error("the list of executor exec-a's unfinished tasks still has the task")
				}
			}
			if problems := integrityCheck(t, path); problems != "ok" {
				t.Errorf("integrity check: %s", problems)
			}
		})
	}
}

// TestSQLiteProgressUpdateWritesFewerPages: an Update that keeps a task's
// namespace, name, executor, cluster and terminal flag (the executor's pod
// created, running, log progress) leaves the seven indexes that hold only
// them alone:
// in this small database 4 WAL pages per update, where writing every column
// took 9.
func TestSQLiteProgressUpdateWritesFewerPages(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openSQLite(t, path)
	defer s.Close()
	const n = 40
	recs := make([]store.Record, n)
	for i := range recs {
		rec := storetest.Sample(fmt.Sprintf("t%03d", i))
		rec.Namespace, rec.Phase, rec.Terminal = "ns", "Pending", false
		recs[i] = mustCreate(t, s, rec)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	for i := range recs { // one commit each: nothing else is queued
		recs[i].Phase, recs[i].Reason = "Running", "ContainerRunning"
		if _, err := s.Update(ctx, recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	st, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	const walHeader, frame = 32, 24 + 4096
	perUpdate := float64(st.Size()-walHeader) / frame / n
	if perUpdate > 6 {
		t.Errorf("%.1f WAL pages per update, want at most 6", perUpdate)
	}
	t.Logf("%.1f WAL pages per update", perUpdate)
}

// integrityCheck is SQLite's integrity check of the database at path: "ok",
// or what is wrong (an index entry without its row, or the reverse).
func integrityCheck(t *testing.T, path string) string {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=query_only(1)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`PRAGMA integrity_check`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		out = append(out, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, "; ")
}
