package client_test

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/client/clienttest"
)

// schedulerIDs are IDs as schedulers make them, none a label value.
var schedulerIDs = []string{
	"etl_dag.Extract_Users.scheduled__2026-12-01T00:00:00+00:00.1", // an Airflow task-instance key
	"manual__2026-12-01T00:00:00+00:00 with spaces, 100% & ?query#frag",
	"Ünïcödé ✓ 任务",
	strings.Repeat("long.", 100), // 500 bytes
}

// TestSchedulerIDsComeBackExact: an ID that is not a label value goes
// through every call of the client and comes back exact: submit (as id and
// as Idempotency-Key, and the retry), get, list, watch, logs, cancel and
// rerun (the new ID and its origin).
func TestSchedulerIDsComeBackExact(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL)
	ctx := testContext(t)
	for i, id := range schedulerIDs {
		opts := client.SubmitOptions{ID: id}
		if i%2 == 1 {
			opts = client.SubmitOptions{IdempotencyKey: id}
		}
		tk, created, err := c.Submit(ctx, "default", []byte(taskDoc("etl")), opts)
		if err != nil || !created || tk.ID != id {
			t.Fatalf("submit %q: %+v, created %v, %v", id, tk, created, err)
		}
		if again, created, err := c.Submit(ctx, "default", []byte(taskDoc("etl")), opts); err != nil || created || again.ID != id {
			t.Fatalf("submit %q again: %+v, created %v, %v", id, again, created, err)
		}
		got, cursor, err := c.GetWithCursor(ctx, id)
		if err != nil || got.ID != id {
			t.Fatalf("get %q: %+v, %v", id, got, err)
		}

		// A watch of the task sees its events under the exact ID.
		srv.SetState(t, id, "Running", "Running", "main container is running", true)
		var seen api.Event
		stop := errors.New("seen")
		if _, err := c.Watch(ctx, client.WatchOptions{TaskID: id, Cursor: cursor}, func(ev api.Event) error {
			seen = ev
			return stop
		}); !errors.Is(err, stop) {
			t.Fatalf("watch %q: %v", id, err)
		}
		if seen.TaskID != id || seen.Phase != "Running" {
			t.Fatalf("watch %q: event %+v", id, seen)
		}
		srv.AppendLog(t, id, 0, "main", "hello from "+id+"\n", true)
		r, err := c.Logs(ctx, id, client.LogOptions{})
		if err != nil {
			t.Fatalf("logs of %q: %v", id, err)
		}
		b, err := io.ReadAll(r)
		_ = r.Close()
		if err != nil || string(b) != "hello from "+id+"\n" {
			t.Fatalf("logs of %q: %q, %v", id, b, err)
		}
		if got, err := c.Cancel(ctx, id); err != nil || got.ID != id {
			t.Fatalf("cancel %q: %+v, %v", id, got, err)
		}
		srv.Finish(t, id, "Failed", "Cancelled", "cancelled", 137, false)
		rerunID := id + " (rerun)"
		re, created, err := c.Rerun(ctx, id, client.RerunOptions{ID: rerunID})
		if err != nil || !created || re.ID != rerunID || re.Origin != id {
			t.Fatalf("rerun %q: %+v, created %v, %v", id, re, created, err)
		}
	}
	listed := map[string]bool{}
	for tk, err := range c.ListAll(ctx, client.ListOptions{Limit: 3}) {
		if err != nil {
			t.Fatal(err)
		}
		listed[tk.ID] = true
	}
	for _, id := range schedulerIDs {
		if !listed[id] || !listed[id+" (rerun)"] {
			t.Errorf("list: %q or its rerun missing from %v", id, listed)
		}
	}
}
