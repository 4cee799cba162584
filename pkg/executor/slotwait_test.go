package executor

import (
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/pkg/store"
)

// TestRecordSlotWait: a task waiting for a slot is written to its record
// when it starts waiting and when another limit holds it, never at a pass
// that finds it waiting for the same limit, and never once its pod is
// recorded or its outcome is.
func TestRecordSlotWait(t *testing.T) {
	const (
		nsLimit = "namespace team-a at its limit of 20"
		all     = "all 50 slots in use; namespaces with waiting tasks take free slots in turn"
	)
	rec := func(phase, reason, msg string, edit ...func(*store.Record)) store.Record {
		r := store.Record{ID: "t", Phase: phase, Reason: reason, Message: msg}
		for _, e := range edit {
			e(&r)
		}
		return r
	}
	for _, c := range []struct {
		name string
		rec  store.Record
		why  string
		want bool
	}{
		{"submitted, then waits: written", rec("Pending", "Submitted", "waiting to create the pod"), nsLimit, true},
		{"retry backoff over, then waits: written", rec("Pending", "RetryBackoff", "attempt 1 starts at ..."), all, true},
		{"a creation failed, then waits: written", rec("Pending", "CreateFailed", "creating pod p failed"), all, true},
		{"the same limit at a later pass: not written", rec("Pending", "WaitingForSlot", nsLimit), nsLimit, false},
		{"another limit holds it: written", rec("Pending", "WaitingForSlot", nsLimit), all, true},
		{"the same reason in another phase: written", rec("Running", "WaitingForSlot", nsLimit), nsLimit, true},
		{"a creation under way (no limit): not written", rec("Pending", "Submitted", ""), "", false},
		{"its pod is recorded: not written", rec("Pending", "Scheduling", "pod p created", func(r *store.Record) { r.PodCreated = true }), nsLimit, false},
		{"finished: not written", rec("Failed", "Cancelled", "", func(r *store.Record) { r.Terminal = true }), nsLimit, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := recordSlotWait(c.rec, c.why); got != c.want {
				t.Errorf("recordSlotWait(%s/%s %q, %q) = %v, want %v", c.rec.Phase, c.rec.Reason, c.rec.Message, c.why, got, c.want)
			}
		})
	}
}

// TestWaitingForSlotIsRecorded: the record of a task waiting for a slot says
// WaitingForSlot and which limit (so that lists and every replica show it):
// a task that waits from its submission is recorded so by the submission's
// own write, one that starts waiting later (after a retry's backoff) by its
// pass; a pass that finds it waiting for the same limit writes nothing, one
// that finds another limit writes it, and the pod's creation replaces it.
// Before, the record said Submitted until the pod was created.
func TestWaitingForSlotIsRecorded(t *testing.T) {
	f := newFx(t, func(c *Config) {
		c.Namespaces = nil
		c.Parallelism = 1
		c.NamespaceParallelism = map[string]int{"ns": 1}
	})
	check := func(when, id, want string, version int64) {
		t.Helper()
		r := f.record(id)
		if got := r.Phase + "/" + r.Reason + " " + r.Message; got != want || r.Version != version {
			t.Errorf("%s: record of %s says %q (version %d), want %q (version %d)", when, id, got, r.Version, want, version)
		}
	}
	syncs := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if _, _, err := f.sync(id); err != nil {
				t.Fatalf("sync %s: %v", id, err)
			}
		}
	}
	x := newTask()
	x.Namespace = "x"
	if _, err := f.ex.Submit(f.ctx, "x1", x); err != nil {
		t.Fatal(err)
	}
	check("submitted with a free slot", "x1", "Pending/Submitted waiting to create the pod", 1)
	f.update("x1", func(r *store.Record) { r.PodCreated = true })
	xPod := f.podOf("x1", 0, running())
	f.both(xPod)
	syncs("x1")

	all := "Pending/WaitingForSlot all 1 slots in use; namespaces with waiting tasks take free slots in turn"
	f.clk.Step(time.Second)
	f.submit("b1", newTask())
	f.clk.Step(time.Second)
	f.submit("b2", newTask())
	check("submitted while x1 holds the only slot", "b1", all, 1)
	check("submitted while x1 holds the only slot", "b2", all, 1)
	syncs("b2", "b1", "b2", "b1")
	check("passes that find the same limit", "b1", all, 1)
	check("passes that find the same limit", "b2", all, 1)

	// As after a failed attempt: the record says RetryBackoff, and the
	// pass that finds the task waiting writes it.
	f.update("b2", func(r *store.Record) { r.Reason, r.Message = "RetryBackoff", "attempt 1 starts at ..." })
	syncs("b2")
	check("waits once its backoff is over", "b2", all, 3)

	// x1's pod goes: b1 takes the slot, and ns is at its limit for b2.
	f.uncache(xPod)
	f.ex.podEvent(compactPod(xPod), true)
	syncs("b1", "b2", "b2")
	check("b1 admitted, its pod not created yet", "b1", all, 1)
	check("ns at its limit", "b2", "Pending/WaitingForSlot namespace ns at its limit of 1", 4)
	if got := f.drainCreations(); len(got) != 1 || got[0] != "b1" {
		t.Fatalf("creations: %v, want b1", got)
	}
	r := f.record("b1")
	if got := r.Phase + "/" + r.Reason; !r.PodCreated || got != "Pending/Scheduling" {
		t.Errorf("b1 once its pod is created: %s, PodCreated %v, want Pending/Scheduling", got, r.PodCreated)
	}
	// A watch sees what the record says, once per change.
	var seen []string
	for _, ev := range f.events {
		if ev.ID == "b2" && (ev.Type == EventState || ev.Type == EventSubmitted) {
			seen = append(seen, string(ev.Type)+" "+ev.Reason+" "+ev.Message)
		}
	}
	want := []string{"Submitted WaitingForSlot all 1 slots in use; namespaces with waiting tasks take free slots in turn",
		"State WaitingForSlot namespace ns at its limit of 1"}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("b2's events:\n%s\nwant\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}
