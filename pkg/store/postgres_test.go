package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

// openPostgres opens a store on a new database of the shared test server.
func openPostgres(t *testing.T, opts store.Options) store.Store {
	t.Helper()
	s, err := store.OpenPostgres(context.Background(), pgtest.Database(t), opts)
	if err != nil {
		t.Fatalf("OpenPostgres: %v", err)
	}
	return s
}

// openPostgresURL opens a store on the database at url; the test closes it.
func openPostgresURL(t *testing.T, url string) store.Store {
	t.Helper()
	s, err := store.OpenPostgres(context.Background(), url, store.Options{})
	if err != nil {
		t.Fatalf("OpenPostgres: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// rawPostgres connects to the database at url, bypassing the store.
func rawPostgres(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TestPostgres runs the conformance suite against the PostgreSQL store, each
// case on a database of its own.
func TestPostgres(t *testing.T) {
	t.Parallel()
	storetest.RunWithOptions(t, openPostgres)
}

// TestPostgresClusters runs the conformance suite of many clusters against
// the PostgreSQL store, each case on a database of its own.
func TestPostgresClusters(t *testing.T) {
	t.Parallel()
	storetest.RunClusters(t, func(t *testing.T) store.Store { return openPostgres(t, store.Options{}) })
}

// postgresSchema returns the applied migrations, in order.
func postgresSchema(t *testing.T, c *pgx.Conn) []int {
	t.Helper()
	rows, err := c.Query(context.Background(), `SELECT version FROM kubetask_schema_version ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return versions
}

func allVersions() []int {
	var out []int
	for v := 1; v <= store.PostgresSchemaVersion; v++ {
		out = append(out, v)
	}
	return out
}

// TestPostgresConcurrentOpens opens eight stores at once on a fresh
// database, as replicas starting together do: the advisory lock lets one
// migrate and the others find the schema current, so every open succeeds,
// each migration is applied once, and the stores share the records.
func TestPostgresConcurrentOpens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	const n = 8
	stores := make([]store.Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = store.OpenPostgres(ctx, url, store.Options{})
		})
	}
	close(start)
	wg.Wait()
	for i, s := range stores {
		if errs[i] != nil {
			t.Errorf("open %d: %v", i, errs[i])
			continue
		}
		defer s.Close()
	}
	if t.Failed() {
		return
	}
	if diff := cmp.Diff(allVersions(), postgresSchema(t, rawPostgres(t, url))); diff != "" {
		t.Errorf("applied migrations (-want +got):\n%s", diff)
	}
	created := mustCreate(t, stores[0], storetest.Sample("a"))
	for i, s := range stores {
		if diff := cmp.Diff(created, mustGet(t, s, "a")); diff != "" {
			t.Errorf("store %d: (-created +got):\n%s", i, diff)
		}
	}
}

// TestPostgresMigrationForward opens a database as each older binary would
// (the first k migrations), then as this one: the rest are applied, once,
// and records written before stay.
func TestPostgresMigrationForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for k := range store.PostgresSchemaVersion {
		t.Run(fmt.Sprintf("from %d", k), func(t *testing.T) {
			url := pgtest.Database(t)
			old, err := store.OpenPostgresMigrations(ctx, url, k)
			if err != nil {
				t.Fatal(err)
			}
			var before store.Record
			c := rawPostgres(t, url)
			if k > 0 {
				// What a binary of that schema wrote: no cluster (in the
				// record or its attempts), before 4 no actors, and before
				// 3 no fence columns. (The old store's own statements are
				// this binary's, which name the newer columns.)
				before = storetest.Sample("old")
				if k < 6 {
					before.Cluster = ""
					for i := range before.Attempts {
						before.Attempts[i].Cluster = ""
					}
				}
				if k < 4 {
					before.SubmittedBy, before.CancelledBy = store.Actor{}, store.Actor{}
				}
				if k < 3 {
					before.Nonce, before.PodUID, before.PodEpoch = "", "", 0
					before.Attempts[0].PodUID = ""
				}
				before.Version = 1
				before.CreatedAt, before.UpdatedAt = before.CancelledAt.UTC(), before.CancelledAt.UTC()
				if err := store.PostgresInsertAtSchema(ctx, c, before, k); err != nil {
					t.Fatal(err)
				}
			}
			old.Close()
			if diff := cmp.Diff(allVersions()[:k], postgresSchema(t, c), cmp.Comparer(func(a, b []int) bool { return fmt.Sprint(a) == fmt.Sprint(b) })); diff != "" {
				t.Fatalf("applied by the older binary (-want +got):\n%s", diff)
			}
			s := openPostgresURL(t, url)
			if diff := cmp.Diff(allVersions(), postgresSchema(t, c)); diff != "" {
				t.Errorf("applied migrations (-want +got):\n%s", diff)
			}
			if k > 0 {
				if diff := cmp.Diff(before, mustGet(t, s, "old")); diff != "" {
					t.Errorf("record of the older binary (-before +after):\n%s", diff)
				}
			}
			if k >= 4 {
				// An older binary still running beside this one writes
				// as it did, naming no cluster before 6: its record is
				// on cluster "".
				after := before
				after.ID = "old-after"
				if err := store.PostgresInsertAtSchema(ctx, c, after, k); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(after, mustGet(t, s, "old-after")); diff != "" {
					t.Errorf("record of the older binary, written after the migration (-written +read):\n%s", diff)
				}
			}
			mustCreate(t, s, storetest.Sample("new"))
		})
	}
}

// TestPostgresNewerSchemaRefused: a database migrated by a later release is
// refused with an error that names both versions, and is not changed.
func TestPostgresNewerSchemaRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	s := openPostgresURL(t, url)
	mustCreate(t, s, storetest.Sample("a"))
	s.Close()
	c := rawPostgres(t, url)
	newer := store.PostgresSchemaVersion + 1
	if _, err := c.Exec(ctx, `INSERT INTO kubetask_schema_version (version) VALUES ($1)`, newer); err != nil {
		t.Fatal(err)
	}
	s, err := store.OpenPostgres(ctx, url, store.Options{})
	if err == nil {
		s.Close()
		t.Fatal("OpenPostgres of a newer schema: err = nil")
	}
	t.Logf("error: %v", err)
	for _, want := range []string{"newer", fmt.Sprintf("version %d", newer), fmt.Sprintf("binary's %d", store.PostgresSchemaVersion)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	if diff := cmp.Diff(append(allVersions(), newer), postgresSchema(t, c)); diff != "" {
		t.Errorf("schema versions changed (-want +got):\n%s", diff)
	}
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM tasks`).Scan(&n); err != nil || n != 1 {
		t.Errorf("tasks: %d, err %v; want the 1 record", n, err)
	}
}

// TestPostgresBadURL: a URL that does not parse, and a server that does not
// answer, are errors that name the server but not the password.
func TestPostgresBadURL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, url := range map[string]string{
		"not a URL":    "postgres://user:secret@[::1",
		"no server":    "postgres://user:secret@127.0.0.1:1/tasks?connect_timeout=5",
		"unknown host": "postgres://user:secret@nonexistent.invalid/tasks?connect_timeout=5",
	} {
		t.Run(name, func(t *testing.T) {
			s, err := store.OpenPostgres(ctx, url, store.Options{})
			if err == nil {
				s.Close()
				t.Fatal("err = nil")
			}
			t.Logf("error: %v", err)
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("the error shows the password: %v", err)
			}
			if !strings.Contains(err.Error(), "postgres") {
				t.Errorf("the error does not say which store: %v", err)
			}
		})
	}
}

func TestPostgresClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	clk := clocktesting.NewFakePassiveClock(t0)
	s, err := store.OpenPostgres(ctx, pgtest.Database(t), store.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec := mustCreate(t, s, storetest.Sample("a"))
	t1 := t0.Add(time.Minute + time.Nanosecond)
	clk.SetTime(t1)
	if rec, err = s.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	for _, r := range []store.Record{rec, mustGet(t, s, "a")} {
		if !r.CreatedAt.Equal(t0) || !r.UpdatedAt.Equal(t1) {
			t.Errorf("CreatedAt %v UpdatedAt %v, want %v and %v", r.CreatedAt, r.UpdatedAt, t0, t1)
		}
	}
}

// TestPostgresReopen: what one store wrote, the next one reads.
func TestPostgresReopen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	s := openPostgresURL(t, url)
	rec := mustCreate(t, s, storetest.Sample("a"))
	rec.Terminal, rec.Phase = true, "Succeeded"
	rec, err := s.Update(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	key := store.LogKey{TaskID: "a", Attempt: 2, Container: "main"}
	info, err := s.(store.Logs).AppendLog(ctx, key, store.LogAppend{Data: []byte("line\n"), Cursor: []byte("cursor"), Complete: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openPostgresURL(t, url)
	if diff := cmp.Diff(rec, mustGet(t, s, "a")); diff != "" {
		t.Errorf("record after reopen (-before +after):\n%s", diff)
	}
	if _, created, err := s.Create(ctx, storetest.Sample("a")); err != nil || created {
		t.Errorf("Create after reopen: created %v, err %v; want false, nil", created, err)
	}
	data, got, err := s.(store.Logs).ReadLog(ctx, key, 0, 100)
	if err != nil || string(data) != "line\n" {
		t.Fatalf("log after reopen: %q, err %v", data, err)
	}
	if diff := cmp.Diff(info, got); diff != "" {
		t.Errorf("log info after reopen (-before +after):\n%s", diff)
	}
}

// TestPostgresUnstorableIDs: an ID that PostgreSQL's text cannot hold (NUL,
// invalid UTF-8) is refused by Create, and no record or log has it.
func TestPostgresUnstorableIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openPostgres(t, store.Options{})
	defer s.Close()
	l := s.(store.Logs)
	for _, id := range []string{"a\x00b", "a\xffb"} {
		if _, _, err := s.Create(ctx, storetest.Sample(id)); err == nil {
			t.Errorf("Create(%q): err = nil", id)
		}
		if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get(%q): err = %v, want ErrNotFound", id, err)
		}
		rec := storetest.Sample(id)
		rec.Version = 1
		if _, err := s.Update(ctx, rec); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Update(%q): err = %v, want ErrNotFound", id, err)
		}
		key := store.LogKey{TaskID: id, Container: "main"}
		if _, err := l.AppendLog(ctx, key, store.LogAppend{Data: []byte("x")}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("AppendLog(%q): err = %v, want ErrNotFound", id, err)
		}
		if _, _, err := l.ReadLog(ctx, key, 0, 1); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("ReadLog(%q): err = %v, want ErrNotFound", id, err)
		}
		if keys, err := l.LogKeys(ctx, id); err != nil || len(keys) != 0 {
			t.Errorf("LogKeys(%q) = %v, %v", id, keys, err)
		}
	}
}

// TestPostgresTwoStores runs two stores on one database, as two replicas of
// kubetask serve do: a compare-and-swap race between them has one winner, a
// Create of one ID from both creates it once, and of two appends of one
// chunk one is refused.
func TestPostgresTwoStores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	a, b := openPostgresURL(t, url), openPostgresURL(t, url)
	cur := mustCreate(t, a, storetest.Sample("shared"))
	for round := range 20 {
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			wins      []store.Record
			conflicts int
		)
		for i, s := range []store.Store{a, b, a, b} {
			wg.Go(func() {
				rec := cur.DeepCopy()
				rec.Message = fmt.Sprintf("round %d writer %d", round, i)
				out, err := s.Update(ctx, rec)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins = append(wins, out)
				case errors.Is(err, store.ErrConflict):
					conflicts++
				default:
					t.Errorf("round %d writer %d: %v", round, i, err)
				}
			})
		}
		wg.Wait()
		if len(wins) != 1 || conflicts != 3 {
			t.Fatalf("round %d: %d wins, %d conflicts; want 1 and 3", round, len(wins), conflicts)
		}
		cur = wins[0]
	}
	if diff := cmp.Diff(cur, mustGet(t, b, "shared")); diff != "" {
		t.Errorf("stored record (-last winner +stored):\n%s", diff)
	}

	var created [2]bool
	var wg sync.WaitGroup
	for i, s := range []store.Store{a, b} {
		wg.Go(func() {
			_, c, err := s.Create(ctx, storetest.Sample("once"))
			if err != nil {
				t.Error(err)
			}
			created[i] = c
		})
	}
	wg.Wait()
	if created[0] == created[1] {
		t.Errorf("Create from both stores: created %v, want exactly one", created)
	}

	key := store.LogKey{TaskID: "shared", Container: "main"}
	errs := make([]error, 2)
	for i, s := range []store.Store{a, b} {
		wg.Go(func() {
			_, errs[i] = s.(store.Logs).AppendLog(ctx, key, store.LogAppend{Data: fmt.Appendf(nil, "from %d\n", i)})
		})
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) || !errors.Is(errors.Join(errs...), store.ErrLogOffset) {
		t.Errorf("appends of one chunk from both stores: %v; want one applied and one ErrLogOffset", errs)
	}
	if data, info, err := b.(store.Logs).ReadLog(ctx, key, 0, 100); err != nil || info.Size != 7 || len(data) != 7 {
		t.Errorf("log: %q, %+v, %v", data, info, err)
	}
}

// TestPostgresRetentionLeavesNoRows checks in the tables themselves that a
// deleted task leaves no label, log or chunk row (the foreign keys cascade),
// and that one call stops once the deleted logs reach the budget.
func TestPostgresRetentionLeavesNoRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	s, err := store.OpenPostgresRetentionBudget(ctx, url, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, r := s.(store.Logs), s.(store.Retention)
	for i := range 5 {
		rec := storetest.Sample(fmt.Sprintf("done-%d", i))
		rec.Terminal = true
		mustCreate(t, s, rec)
		for c := range 2 {
			key := store.LogKey{TaskID: rec.ID, Container: fmt.Sprint(c)}
			for off := 0; off < 30; off += 10 { // 3 chunks of 10 bytes
				if _, err := l.AppendLog(ctx, key, store.LogAppend{Offset: int64(off), Data: []byte("0123456789")}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	mustCreate(t, s, storetest.Sample("running"))
	// 60 bytes of logs per task, a budget of 100: two tasks per call.
	var counts []int
	for {
		n, err := r.DeleteFinishedBefore(ctx, time.Now().Add(time.Hour), 10)
		if err != nil {
			t.Fatal(err)
		}
		counts = append(counts, n)
		if n == 0 {
			break
		}
	}
	if diff := cmp.Diff([]int{2, 2, 1, 0}, counts); diff != "" {
		t.Errorf("deleted per call (-want +got):\n%s", diff)
	}
	c := rawPostgres(t, url)
	for _, table := range []string{"task_labels", "logs", "log_chunks"} {
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE task_id <> 'running'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s: %d rows of deleted tasks left", table, n)
		}
	}
	var labels int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM task_labels WHERE task_id = 'running'`).Scan(&labels); err != nil || labels != 2 {
		t.Errorf("labels of the kept task: %d rows, err %v; want 2", labels, err)
	}
}

// TestPostgresLabelRows checks the label rows that serve the label filter
// after creates and updates: exactly the record's labels, with its
// created_at.
func TestPostgresLabelRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	s := openPostgresURL(t, url)
	c := rawPostgres(t, url)
	rows := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		r, err := c.Query(ctx, `SELECT l.key, l.value, l.created_at = t.created_at FROM task_labels AS l JOIN tasks AS t ON t.id = l.task_id WHERE l.task_id = 'a'`)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for r.Next() {
			var k, v []byte
			var sameTime bool
			if err := r.Scan(&k, &v, &sameTime); err != nil {
				t.Fatal(err)
			}
			if !sameTime {
				t.Errorf("label %s: created_at differs from the task's", k)
			}
			out[string(k)] = string(v)
		}
		return out
	}
	rec := storetest.Sample("a")
	rec.Labels = map[string]string{"app": "web", "env": "prod", "x\x00y": "\xff"}
	rec = mustCreate(t, s, rec)
	for _, labels := range []map[string]string{
		{"app": "web", "env": "prod", "x\x00y": "\xff"}, // unchanged
		{"app": "db", "env": "prod", "new": ""},         // one changed, one gone, one added
		{},
		nil,
		{"app": "web"},
	} {
		rec.Labels = labels
		var err error
		if rec, err = s.Update(ctx, rec); err != nil {
			t.Fatal(err)
		}
		want := labels
		if want == nil {
			want = map[string]string{}
		}
		if diff := cmp.Diff(want, rows()); diff != "" {
			t.Errorf("label rows for %v (-want +got):\n%s", labels, diff)
		}
	}
	stale := rec
	stale.Version--
	stale.Labels = map[string]string{"stale": "yes"}
	if _, err := s.Update(ctx, stale); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale update: %v", err)
	}
	if diff := cmp.Diff(map[string]string{"app": "web"}, rows()); diff != "" {
		t.Errorf("a conflicting update changed the label rows (-want +got):\n%s", diff)
	}
}

// TestPostgresDurableAcrossServerCrash runs writers against a server of its
// own whose database defaults to synchronous_commit=off, crashes the server
// (an immediate shutdown: what is not in the WAL is lost) right after some
// updates returned, restarts it, and checks that every acknowledged update
// is there: the store's sessions commit synchronously whatever the default,
// and a call returns only after its commit.
func TestPostgresDurableAcrossServerCrash(t *testing.T) {
	t.Parallel()
	if os.Getenv(pgtest.SkipEnv) == "1" {
		t.Skip(pgtest.SkipEnv + "=1")
	}
	if os.Getenv(pgtest.URLEnv) != "" {
		t.Skip("crashes a server of its own; " + pgtest.URLEnv + " names an existing one")
	}
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	name, url, err := srv.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rawPostgres(t, url).Exec(ctx, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET synchronous_commit = off`); err != nil {
		t.Fatal(err)
	}
	s, err := store.OpenPostgres(ctx, url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, err := store.PostgresSetting(ctx, s, "synchronous_commit"); err != nil || v != "on" {
		t.Fatalf("the store's sessions run with synchronous_commit %q (err %v), want on", v, err)
	}

	const writers = 8
	acked := make([]int64, writers) // the last version each writer's Update returned
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	enough := make(chan struct{})
	for w := range writers {
		rec := mustCreate(t, s, storetest.Sample(fmt.Sprintf("w-%d", w)))
		wg.Go(func() {
			for i := 0; ; i++ {
				rec.Message = fmt.Sprintf("write %d", i)
				out, err := s.Update(ctx, rec)
				if err != nil {
					return // the server crashed
				}
				rec = out
				mu.Lock()
				acked[w] = out.Version
				if total++; total == 500 {
					close(enough)
				}
				mu.Unlock()
			}
		})
	}
	select {
	case <-enough:
	case <-time.After(2 * time.Minute):
		t.Fatal("fewer than 500 updates in two minutes")
	}
	if err := srv.Crash(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	want := append([]int64(nil), acked...)
	mu.Unlock()
	wg.Wait()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	after := openPostgresURL(t, url)
	for w := range writers {
		got := mustGet(t, after, fmt.Sprintf("w-%d", w))
		if got.Version < want[w] {
			t.Errorf("w-%d: version %d after the crash, but version %d was acknowledged", w, got.Version, want[w])
		}
		t.Logf("w-%d: acknowledged %d, stored %d", w, want[w], got.Version)
	}
}
