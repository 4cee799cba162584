package executor

import (
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubetask/kubetask/pkg/store"
)

// TestRecordPending: a task without its pod is written to its record when
// it starts waiting for a slot, when another limit holds it and when its
// pod's creation fails; never at a pass that finds the same limit, nor for
// each failed creation again, nor once its pod or its outcome is recorded.
func TestRecordPending(t *testing.T) {
	const (
		nsLimit = "namespace team-a at its limit of 20"
		all     = "all 50 slots in use; namespaces with waiting tasks take free slots in turn"
		failed  = "creating pod p failed 1 times since 2026-12-03T10:00:00Z, retrying in 200ms: exceeded quota"
		failed2 = "creating pod p failed 2 times since 2026-12-03T10:00:00Z, retrying in 400ms: exceeded quota"
		slot    = reasonWaitingForSlot
	)
	rec := func(phase, reason, msg string, edit ...func(*store.Record)) store.Record {
		r := store.Record{ID: "t", Phase: phase, Reason: reason, Message: msg}
		for _, e := range edit {
			e(&r)
		}
		return r
	}
	for _, c := range []struct {
		name            string
		rec             store.Record
		reason, message string
		want            bool
	}{
		{"submitted, then waits: written", rec("Pending", "Submitted", "waiting to create the pod"), slot, nsLimit, true},
		{"retry backoff over, then waits: written", rec("Pending", "RetryBackoff", "attempt 1 starts at ..."), slot, all, true},
		{"a creation failed, then waits: written", rec("Pending", "CreateFailed", failed), slot, all, true},
		{"the same limit at a later pass: not written", rec("Pending", slot, nsLimit), slot, nsLimit, false},
		{"another limit holds it: written", rec("Pending", slot, nsLimit), slot, all, true},
		{"the same reason in another phase: written", rec("Running", slot, nsLimit), slot, nsLimit, true},
		{"a creation under way (no limit): not written", rec("Pending", "Submitted", ""), slot, "", false},
		{"its creation fails after it waited: written", rec("Pending", slot, all), reasonCreateFailed, failed, true},
		{"its creation fails at once: written", rec("Pending", "Submitted", "waiting to create the pod"), reasonCreateFailed, failed, true},
		{"its creation fails again: not written", rec("Pending", reasonCreateFailed, failed), reasonCreateFailed, failed2, false},
		{"its pod is recorded: not written", rec("Pending", "Scheduling", "pod p created", func(r *store.Record) { r.PodCreated = true }), slot, nsLimit, false},
		{"finished: not written", rec("Failed", "Cancelled", "", func(r *store.Record) { r.Terminal = true }), slot, nsLimit, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := recordPending(c.rec, c.reason, c.message); got != c.want {
				t.Errorf("recordPending(%s/%s %q, %s %q) = %v, want %v", c.rec.Phase, c.rec.Reason, c.rec.Message, c.reason, c.message, got, c.want)
			}
		})
	}
}

// TestCreateFailedIsRecorded: a creation that fails for a passing reason
// is written to the record once (so that a list does not say the task
// still waits for a slot, or was just submitted), not at each failure.
func TestCreateFailedIsRecorded(t *testing.T) {
	f := newFx(t, nil)
	f.submit("a", newTask())
	f.reactorError("create", "pods", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("exceeded quota: pods=10")))
	for i := range 3 {
		if _, _, err := f.sync("a"); err != nil {
			t.Fatal(err)
		}
		f.drainCreations()
		if _, _, err := f.sync("a"); err != nil {
			t.Fatal(err)
		}
		r := f.record("a")
		if r.Reason != reasonCreateFailed || r.Version != 2 || !strings.Contains(r.Message, "exceeded quota") {
			t.Errorf("after %d failed creations: record says %s/%s %q (version %d), want CreateFailed written once (version 2)", i+1, r.Phase, r.Reason, r.Message, r.Version)
		}
		f.clk.Step(time.Minute) // past the creation's backoff
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
