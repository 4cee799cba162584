package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	_ "modernc.org/sqlite"

	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

// TestSQLitePagePlans checks with EXPLAIN QUERY PLAN that the first page and
// a continued page of every filter, alone and combined, read a range of the
// index meant for it, in page order: no statement scans the table, and only
// the name prefix sorts (its range's rows).
func TestSQLitePagePlans(t *testing.T) {
	s := openSQLite(t, filepath.Join(t.TempDir(), "tasks.db"))
	defer s.Close()
	yes := true
	day := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := map[string]struct {
		opts store.PageOptions
		// index is the index the page's first loop reads, and search the
		// constraints it is searched by on the first page.
		index, search string
		// lookups are further plan lines (the task by ID, more labels).
		lookups []string
		sorted  bool
	}{
		"no filter":        {opts: store.PageOptions{}, index: "tasks_by_created"},
		"namespace":        {opts: store.PageOptions{Namespace: "a"}, index: "tasks_by_namespace", search: "namespace=?"},
		"cluster":          {opts: store.PageOptions{Cluster: "a"}, index: "tasks_by_cluster_created", search: "cluster=?"},
		"phase":            {opts: store.PageOptions{Phase: "a"}, index: "tasks_by_phase", search: "phase=?"},
		"reason":           {opts: store.PageOptions{Reason: "a"}, index: "tasks_by_reason", search: "reason=?"},
		"name prefix":      {opts: store.PageOptions{NamePrefix: "etl-"}, index: "tasks_by_name", search: "name>? AND name<?", sorted: true},
		"terminal":         {opts: store.PageOptions{Terminal: &yes}, index: "tasks_by_terminal_created", search: "terminal=?"},
		"created after":    {opts: store.PageOptions{CreatedAfter: day}, index: "tasks_by_created", search: "created_at>?"},
		"created before":   {opts: store.PageOptions{CreatedBefore: day}, index: "tasks_by_created", search: "created_at<?"},
		"created between":  {opts: store.PageOptions{CreatedAfter: day, CreatedBefore: day.Add(time.Hour)}, index: "tasks_by_created", search: "created_at>? AND created_at<?"},
		"namespace, phase": {opts: store.PageOptions{Namespace: "a", Phase: "b"}, index: "tasks_by_namespace_phase", search: "namespace=? AND phase=?"},
		"label": {opts: store.PageOptions{Labels: map[string]string{"app": "web"}}, index: "task_labels_by_value", search: "key=? AND value=?",
			lookups: []string{"SEARCH t USING INDEX sqlite_autoindex_tasks_1 (id=?)"}},
		"two labels, namespace, created after": {
			opts:  store.PageOptions{Labels: map[string]string{"app": "web", "env": "prod"}, Namespace: "a", CreatedAfter: day},
			index: "task_labels_by_value", search: "key=? AND value=? AND created_at>?",
			lookups: []string{"SEARCH t USING INDEX sqlite_autoindex_tasks_1 (id=?)", "SEARCH l1 EXISTS USING PRIMARY KEY (task_id=? AND key=?)"}},
		"namespace, phase, label": {opts: store.PageOptions{Namespace: "a", Phase: "b", Labels: map[string]string{"app": "web"}},
			index: "tasks_by_namespace_phase", search: "namespace=? AND phase=?",
			lookups: []string{"SEARCH l1 EXISTS USING PRIMARY KEY (task_id=? AND key=?)"}},
		"namespace, reason":     {opts: store.PageOptions{Namespace: "a", Reason: "b"}, index: "tasks_by_reason", search: "reason=?"},
		"namespace, cluster":    {opts: store.PageOptions{Namespace: "a", Cluster: "b"}, index: "tasks_by_namespace", search: "namespace=?"},
		"cluster, phase":        {opts: store.PageOptions{Cluster: "a", Phase: "b"}, index: "tasks_by_cluster_created", search: "cluster=?"},
		"phase, terminal":       {opts: store.PageOptions{Phase: "a", Terminal: &yes}, index: "tasks_by_phase", search: "phase=?"},
		"namespace, terminal":   {opts: store.PageOptions{Namespace: "a", Terminal: &yes}, index: "tasks_by_namespace", search: "namespace=?"},
		"reason, name prefix":   {opts: store.PageOptions{Reason: "a", NamePrefix: "b"}, index: "tasks_by_reason", search: "reason=?"},
		"name prefix all 0xff":  {opts: store.PageOptions{NamePrefix: "\xff\xff"}, index: "tasks_by_name", search: "name>?", sorted: true},
		"namespace, name, time": {opts: store.PageOptions{Namespace: "a", NamePrefix: "b", CreatedBefore: day}, index: "tasks_by_name", search: "name>? AND name<?", sorted: true},
		"every filter": {opts: store.PageOptions{Namespace: "a", Phase: "b", Reason: "c", NamePrefix: "d", Labels: map[string]string{"e": "f"},
			CreatedAfter: day, CreatedBefore: day.Add(time.Hour), Terminal: &yes},
			index: "tasks_by_namespace_phase", search: "namespace=? AND phase=? AND created_at>? AND created_at<?",
			lookups: []string{"SEARCH l1 EXISTS USING PRIMARY KEY (task_id=? AND key=?)"}},
	}
	last := store.Record{ID: "last", CreatedAt: day}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tok, err := store.ContinueToken(tc.opts, last)
			if err != nil {
				t.Fatal(err)
			}
			next := tc.opts
			next.Continue = tok
			for _, page := range []struct {
				name string
				opts store.PageOptions
			}{{"first page", tc.opts}, {"continued", next}} {
				query, args, err := store.SQLitePageSQL(page.opts)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(strings.ToUpper(query), "COUNT(") || strings.Contains(strings.ToUpper(query), " LIKE ") {
					t.Errorf("%s: the statement counts or uses LIKE: %s", page.name, query)
				}
				plan, err := store.SQLitePlan(s, query, args...)
				if err != nil {
					t.Fatalf("%s: %v", page.name, err)
				}
				t.Logf("%s: %q", page.name, plan)
				table := "t"
				if tc.index == "task_labels_by_value" {
					table = "l"
				}
				first := fmt.Sprintf("SEARCH %s USING INDEX %s (", table, tc.index)
				firstCovering := fmt.Sprintf("SEARCH %s USING COVERING INDEX %s (", table, tc.index)
				search := tc.search
				if page.opts.Continue != "" {
					key := "(created_at,id)<(?,?)"
					if table == "l" {
						key = "(created_at,task_id)<(?,?)"
					}
					// The continue position replaces CreatedBefore's bound.
					search = strings.TrimPrefix(strings.TrimPrefix(strings.ReplaceAll(search, " AND created_at<?", ""), "created_at<?")+" AND "+key, " AND ")
					if tc.sorted { // the range is on the name, the key checked per row
						search = tc.search
					}
				}
				driver := first + search + ")"
				if slices.Contains(plan, firstCovering+search+")") {
					driver = firstCovering + search + ")"
				}
				if search == "" {
					driver = fmt.Sprintf("SCAN %s USING INDEX %s", table, tc.index)
				}
				want := append([]string{driver}, tc.lookups...)
				if tc.sorted {
					// The keys are sorted, then the page's rows read by rowid.
					want = append([]string{"SEARCH p USING INTEGER PRIMARY KEY (rowid=?)", "LIST SUBQUERY 1"}, want...)
					want = append(want, "USE TEMP B-TREE FOR ORDER BY", "USE TEMP B-TREE FOR ORDER BY")
				}
				if diff := cmp.Diff(want, plan); diff != "" {
					t.Errorf("%s: plan (-want +got):\n%s", page.name, diff)
				}
			}
		})
	}
}

// TestSQLiteNamespacesPagePlans checks that a page confined to several
// namespaces reads one range of tasks_by_namespace per namespace (or of the
// label's index, with a label filter), first page and continued, and never
// scans the table: the records of other namespaces are not read.
func TestSQLiteNamespacesPagePlans(t *testing.T) {
	s := openSQLite(t, filepath.Join(t.TempDir(), "tasks.db"))
	defer s.Close()
	day := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := map[string]struct {
		opts   store.PageOptions
		search string // what each namespace's range is searched by
	}{
		"namespaces":        {store.PageOptions{Namespaces: []string{"a", "b", "c"}}, "SEARCH t USING INDEX tasks_by_namespace (namespace=?"},
		"namespaces, phase": {store.PageOptions{Namespaces: []string{"a", "b", "c"}, Phase: "Running"}, "SEARCH t USING INDEX tasks_by_namespace_phase (namespace=? AND phase=?"},
		"namespaces, label": {store.PageOptions{Namespaces: []string{"a", "b", "c"}, Labels: map[string]string{"app": "web"}}, "SEARCH l USING INDEX task_labels_by_value (key=? AND value=?"},
	}
	last := store.Record{ID: "last", CreatedAt: day}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tok, err := store.ContinueToken(tc.opts, last)
			if err != nil {
				t.Fatal(err)
			}
			next := tc.opts
			next.Continue = tok
			for _, opts := range []store.PageOptions{tc.opts, next} {
				query, args, err := store.SQLitePageSQL(opts)
				if err != nil {
					t.Fatal(err)
				}
				plan, err := store.SQLitePlan(s, query, args...)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("continued %v: %q", opts.Continue != "", plan)
				ranges := 0
				for _, line := range plan {
					if strings.HasPrefix(line, "SCAN t") || strings.HasPrefix(line, "SCAN l") {
						t.Errorf("scans a table: %q", line)
					}
					// Each range yields at most limit+1 rows, which a
					// label's branch sorts by the task's columns for the
					// merge.
					if strings.HasPrefix(strings.Replace(line, "COVERING INDEX", "INDEX", 1), tc.search) {
						ranges++
					}
				}
				if ranges != len(tc.opts.Namespaces) {
					t.Errorf("%d ranges %q..., want one per namespace (%d): %q", ranges, tc.search, len(tc.opts.Namespaces), plan)
				}
			}
		})
	}
}

// TestSQLiteStatementPlans checks that the other statements of the service
// paths (Get, the log archive, retention and the triggers that delete a
// task's labels and logs) and of the record writes (Update's and Move's
// conditional UPDATEs, which look the row up by its ID and check the
// version, nonce and fence on it) search an index.
func TestSQLiteStatementPlans(t *testing.T) {
	s := openSQLite(t, filepath.Join(t.TempDir(), "tasks.db"))
	defer s.Close()
	for name, query := range store.SQLiteStatements {
		t.Run(name, func(t *testing.T) {
			args := make([]any, strings.Count(query, "?"))
			for i := range args {
				args[i] = "x"
			}
			plan, err := store.SQLitePlan(s, query, args...)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%q", plan)
			if len(plan) == 0 {
				t.Fatal("no plan")
			}
			for _, line := range plan {
				if strings.HasPrefix(line, "SCAN") || strings.Contains(line, "TEMP B-TREE") {
					t.Errorf("plan line %q scans or sorts", line)
				}
			}
		})
	}
}

// sqliteV1Schema is the schema of the release before migration 2, exactly as
// that release created it (migration 1 and schema_version 1).
const sqliteV1Schema = `
	CREATE TABLE schema_version (version INTEGER NOT NULL);
	INSERT INTO schema_version (version) VALUES (1);
	CREATE TABLE tasks (
		id              TEXT    NOT NULL PRIMARY KEY,
		namespace       TEXT    NOT NULL,
		name            TEXT    NOT NULL,
		executor        TEXT    NOT NULL,
		task            BLOB,
		attempt         INTEGER NOT NULL,
		phase           TEXT    NOT NULL,
		reason          TEXT    NOT NULL,
		message         TEXT    NOT NULL,
		exit_code       INTEGER,
		retryable       INTEGER NOT NULL,
		result          BLOB,
		terminal        INTEGER NOT NULL,
		cancelled_at    INTEGER,
		next_attempt_at INTEGER,
		pod_created     INTEGER NOT NULL,
		attempts        TEXT,
		created_at      INTEGER NOT NULL,
		updated_at      INTEGER NOT NULL,
		version         INTEGER NOT NULL
	);
	CREATE INDEX tasks_by_executor ON tasks (executor, terminal, id);
	CREATE INDEX tasks_by_terminal ON tasks (terminal, id);`

func rawSQLite(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func schemaVersion(t *testing.T, path string) int {
	t.Helper()
	var v int
	if err := rawSQLite(t, path).QueryRow(`SELECT version FROM schema_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSQLiteMigrationFromV1 opens a database of the previous release (schema
// version 1, with records in it): the store migrates it at open, keeps its
// records (without labels or origin), and every new feature works on it.
func TestSQLiteMigrationFromV1(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tasks.db")
	db := rawSQLite(t, path)
	if _, err := db.Exec(sqliteV1Schema); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for i, id := range []string{"old-done", "old-running"} {
		if _, err := db.Exec(`INSERT INTO tasks VALUES (?, 'ns', ?, 'exec-a', '{}', 0, ?, 'r', 'm', NULL, 0, NULL, ?, NULL, NULL, 1, '[]', ?, ?, 3)`,
			id, "task-"+id, []string{"Succeeded", "Running"}[i], i == 0, t0.Add(time.Duration(i)*time.Second).UnixNano(), t0.Add(time.Minute).UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	s := openSQLite(t, path)
	defer s.Close()
	if v := schemaVersion(t, path); v != store.SQLiteSchemaVersion {
		t.Fatalf("schema version after open: %d, want %d", v, store.SQLiteSchemaVersion)
	}
	old := mustGet(t, s, "old-done")
	if old.Labels != nil || old.Origin != "" || !old.SubmittedBy.IsZero() || !old.CancelledBy.IsZero() || old.Cluster != "" ||
		old.Version != 3 || !old.Terminal || !old.CreatedAt.Equal(t0) || len(old.Attempts) != 0 || old.Attempts == nil {
		t.Errorf("migrated record: %+v", old)
	}
	p, l, r := s.(store.Pager), s.(store.Logs), s.(store.Retention)
	page, err := p.Page(ctx, store.PageOptions{Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"old-running", "old-done"}, recordIDs(page.Records)); diff != "" {
		t.Errorf("Page of migrated records (-want +got):\n%s", diff)
	}
	// Labels on an old record, a new record with labels and origin.
	running := mustGet(t, s, "old-running")
	running.Labels = map[string]string{"app": "web"}
	if _, err := s.Update(ctx, running); err != nil {
		t.Fatal(err)
	}
	rerun := storetest.Sample("rerun")
	rerun.Namespace, rerun.Origin, rerun.Labels = "ns", "old-done", map[string]string{"app": "web"}
	mustCreate(t, s, rerun)
	page, err = p.Page(ctx, store.PageOptions{Labels: map[string]string{"app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"rerun", "old-running"}, recordIDs(page.Records)); diff != "" {
		t.Errorf("Page by label after migration (-want +got):\n%s", diff)
	}
	if got := mustGet(t, s, "rerun"); got.Origin != "old-done" {
		t.Errorf("Origin = %q", got.Origin)
	}
	key := store.LogKey{TaskID: "old-done", Container: "main"}
	if _, err := l.AppendLog(ctx, key, store.LogAppend{Data: []byte("archived\n"), Cursor: []byte("c"), Complete: true}); err != nil {
		t.Fatal(err)
	}
	if data, info, err := l.ReadLog(ctx, key, 0, 100); err != nil || string(data) != "archived\n" || !info.Complete {
		t.Errorf("ReadLog = %q, %+v, %v", data, info, err)
	}
	if n, err := r.DeleteFinishedBefore(ctx, t0.Add(time.Hour), 10); err != nil || n != 1 {
		t.Errorf("DeleteFinishedBefore = %d, %v; want the old finished task", n, err)
	}
	if _, _, err := l.ReadLog(ctx, key, 0, 100); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("log of the deleted task: err = %v, want ErrNotFound", err)
	}
	s.Close()

	// Opening again migrates nothing and keeps everything.
	s = openSQLite(t, path)
	defer s.Close()
	if v := schemaVersion(t, path); v != store.SQLiteSchemaVersion {
		t.Errorf("schema version after the second open: %d, want %d", v, store.SQLiteSchemaVersion)
	}
	if got := mustGet(t, s, "old-running"); got.Labels["app"] != "web" {
		t.Errorf("labels after reopen: %v", got.Labels)
	}
}

// TestSQLiteMigrationFromV4 opens a database of schema version 4 (before
// clusters) with records in it, written as that release wrote them: the
// store migrates it at open, the records read back as they were, placed on
// cluster "" (theirs and their attempts'), and the clusters' features work
// on it: a record moves to a cluster, filters find it there, and a
// cluster's row is written.
func TestSQLiteMigrationFromV4(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tasks.db")
	if err := store.SQLiteMigrateTo(ctx, path, 4); err != nil {
		t.Fatal(err)
	}
	if v := schemaVersion(t, path); v != 4 {
		t.Fatalf("schema version of the old database: %d, want 4", v)
	}
	db := rawSQLite(t, path)
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var before []store.Record
	for i, id := range []string{"old-claimed", "old-placed"} {
		rec := storetest.Sample(id)
		rec.Cluster = "" // what version 4 wrote: no cluster, in the record or its attempts
		for j := range rec.Attempts {
			rec.Attempts[j].Cluster = ""
		}
		if id == "old-placed" {
			rec.PodCreated, rec.PodUID, rec.PodEpoch = false, "", 0
		}
		rec.Version = 2
		rec.CreatedAt, rec.UpdatedAt = t0.Add(time.Duration(i)*time.Second), t0.Add(time.Minute)
		if err := store.SQLiteInsertAtSchema(ctx, db, rec, 4); err != nil {
			t.Fatal(err)
		}
		before = append(before, rec)
	}
	db.Close()

	s := openSQLite(t, path)
	defer s.Close()
	if v := schemaVersion(t, path); v != store.SQLiteSchemaVersion {
		t.Fatalf("schema version after open: %d, want %d", v, store.SQLiteSchemaVersion)
	}
	for _, want := range before {
		got := mustGet(t, s, want.ID)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("record of the older binary (-before +after):\n%s", diff)
		}
		if got.Cluster != "" || got.Attempts[0].Cluster != "" {
			t.Errorf("%s: cluster %q, attempt's %q; want both empty", want.ID, got.Cluster, got.Attempts[0].Cluster)
		}
	}
	c := s.(store.Clusters)
	if _, err := c.Move(ctx, before[0], "exec-east", "east"); !errors.Is(err, store.ErrClaimed) {
		t.Errorf("Move of the old record with a pod: %v, want ErrClaimed", err)
	}
	moved, err := c.Move(ctx, before[1], "exec-east", "east")
	if err != nil {
		t.Fatalf("Move of the old record without a pod: %v", err)
	}
	if moved.Cluster != "east" || moved.Executor != "exec-east" || moved.Version != 3 {
		t.Errorf("moved: cluster %q executor %q version %d", moved.Cluster, moved.Executor, moved.Version)
	}
	list, err := s.List(ctx, store.ListOptions{Cluster: "east"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"old-placed"}, recordIDs(list)); diff != "" {
		t.Errorf("List of cluster east (-want +got):\n%s", diff)
	}
	page, err := s.(store.Pager).Page(ctx, store.PageOptions{Cluster: "east"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"old-placed"}, recordIDs(page.Records)); diff != "" {
		t.Errorf("Page of cluster east (-want +got):\n%s", diff)
	}
	if _, err := c.PutCluster(ctx, store.Cluster{Name: "east", State: store.ClusterReady}); err != nil {
		t.Errorf("PutCluster: %v", err)
	}
	if problems := integrityCheck(t, path); problems != "ok" {
		t.Errorf("integrity check: %s", problems)
	}
}

func recordIDs(recs []store.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

// TestSQLiteNewerSchemaRefused: a database of a later release is refused,
// not changed.
func TestSQLiteNewerSchemaRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.db")
	openSQLite(t, path).Close()
	newer := store.SQLiteSchemaVersion + 1
	if _, err := rawSQLite(t, path).Exec(`UPDATE schema_version SET version = ?`, newer); err != nil {
		t.Fatal(err)
	}
	s, err := store.OpenSQLite(context.Background(), path)
	if err == nil {
		s.Close()
		t.Fatal("OpenSQLite of a newer schema: err = nil")
	}
	if !strings.Contains(err.Error(), "newer") || !strings.Contains(err.Error(), path) {
		t.Errorf("error does not say the schema is newer, or does not name the file: %v", err)
	}
	if v := schemaVersion(t, path); v != newer {
		t.Errorf("schema version changed to %d", v)
	}
}

// TestSQLiteRetentionLeavesNoRows checks in the tables themselves that a
// deleted task leaves no label, log or chunk row, and that one call stops
// once the deleted logs reach the budget.
func TestSQLiteRetentionLeavesNoRows(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s, err := store.OpenSQLiteRetentionBudget(ctx, path, 100)
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
	db := rawSQLite(t, path)
	for _, table := range []string{"task_labels", "logs", "log_chunks"} {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM ` + table + ` WHERE task_id != 'running'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s: %d rows of deleted tasks left", table, n)
		}
	}
	var labels int
	if err := db.QueryRow(`SELECT count(*) FROM task_labels WHERE task_id = 'running'`).Scan(&labels); err != nil || labels != 2 {
		t.Errorf("labels of the kept task: %d rows, err %v; want 2", labels, err)
	}
}

// TestSQLiteLogsSurviveReopen: an acknowledged append is in the file.
func TestSQLiteLogsSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openSQLite(t, path)
	mustCreate(t, s, storetest.Sample("a"))
	key := store.LogKey{TaskID: "a", Attempt: 2, Container: "main"}
	want, err := s.(store.Logs).AppendLog(ctx, key, store.LogAppend{Data: []byte("line\n"), Cursor: []byte("cursor"), Complete: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openSQLite(t, path)
	defer s.Close()
	data, info, err := s.(store.Logs).ReadLog(ctx, key, 0, 100)
	if err != nil || string(data) != "line\n" {
		t.Fatalf("after reopen: %q, err %v", data, err)
	}
	if diff := cmp.Diff(want, info); diff != "" {
		t.Errorf("info after reopen (-before +after):\n%s", diff)
	}
}

// TestSQLiteLogAppendsShareGroups queues log appends with other writes
// behind a held group: the writer commits them in one transaction, each
// with its own outcome (a refused append fails alone).
func TestSQLiteLogAppendsShareGroups(t *testing.T) {
	ctx := context.Background()
	h := openHeld(t, filepath.Join(t.TempDir(), "tasks.db"))
	plug := mustCreate(t, h, storetest.Sample("plug"))
	a := mustCreate(t, h, storetest.Sample("a"))
	l := h.Store.(store.Logs)
	key := store.LogKey{TaskID: "a", Container: "main"}
	if _, err := l.AppendLog(ctx, key, store.LogAppend{Data: []byte("one\n")}); err != nil {
		t.Fatal(err)
	}
	plugDone := plugWriter(t, h, plug)

	type appendResult struct {
		info store.LogInfo
		err  error
	}
	goAppend := func(key store.LogKey, off int64, data string) <-chan appendResult {
		c := make(chan appendResult, 1)
		go func() {
			info, err := l.AppendLog(ctx, key, store.LogAppend{Offset: off, Data: []byte(data)})
			c <- appendResult{info, err}
		}()
		return c
	}
	first := goAppend(key, 4, "two\n")
	waitQueued(t, h.Store, 1)
	a.Message = "updated"
	upd := goUpdate(ctx, h, a)
	waitQueued(t, h.Store, 2)
	second := goAppend(key, 8, "three\n") // follows first in the same group
	waitQueued(t, h.Store, 3)
	dup := goAppend(key, 4, "two\n") // first's chunk again
	waitQueued(t, h.Store, 4)
	missing := goAppend(store.LogKey{TaskID: "missing", Container: "main"}, 0, "x")
	waitQueued(t, h.Store, 5)

	h.proceed <- struct{}{} // the plug commits
	if n := h.nextGroup(t); n != 5 {
		t.Errorf("group applied %d writes, want 5", n)
	}
	h.proceed <- struct{}{}
	h.hold.Store(false)
	if r := <-plugDone; r.err != nil {
		t.Fatal(r.err)
	}
	if r := <-first; r.err != nil || r.info.Size != 8 {
		t.Errorf("first append: %+v, %v", r.info, r.err)
	}
	if r := <-upd; r.err != nil {
		t.Errorf("update: %v", r.err)
	}
	if r := <-second; r.err != nil || r.info.Size != 14 {
		t.Errorf("second append: %+v, %v", r.info, r.err)
	}
	if r := <-dup; !errors.Is(r.err, store.ErrLogOffset) || r.info.Size != 14 {
		t.Errorf("duplicate append: %+v, err %v; want ErrLogOffset with size 14", r.info, r.err)
	}
	if r := <-missing; !errors.Is(r.err, store.ErrNotFound) {
		t.Errorf("append for a missing task: err %v, want ErrNotFound", r.err)
	}
	if data, _, err := l.ReadLog(ctx, key, 0, 100); err != nil || string(data) != "one\ntwo\nthree\n" {
		t.Errorf("log = %q, err %v", data, err)
	}
}
