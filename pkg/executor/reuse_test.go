package executor

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// A task ID used again: retention deleted the finished record, and a user
// submitted a task of the same ID, which gets a new record with a new
// nonce. Nothing the executor keeps of the earlier record may be taken for
// the new one's (the simulator's retention scenario).

// retainAndSubmitAgain deletes every finished record, as retention does,
// and submits t as task id again.
func (f *fx) retainAndSubmitAgain(id string, t *task.Task) store.Record {
	f.t.Helper()
	if _, err := f.ex.store.(store.Retention).DeleteFinishedBefore(f.ctx, f.clk.Now().Add(time.Hour), 100); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.ex.store.Get(f.ctx, id); !errors.Is(err, store.ErrNotFound) {
		f.t.Fatalf("record %s not deleted: %v", id, err)
	}
	return f.submit(id, t)
}

// TestAnIDUsedAgainIsCapturedAgain (simulation seed 5030): a process that
// captured the log of attempt 0 of the first record took that done capture
// for the new record's attempt 0, and released its pod's finalizer with
// nothing of its log archived.
func TestAnIDUsedAgainIsCapturedAgain(t *testing.T) {
	started := make(chan LogCapture, 4)
	f := newFx(t, func(c *Config) {
		c.CaptureLogs = func(ctx context.Context, lc LogCapture) error {
			started <- lc
			return nil // archived at once
		}
	})
	f.submit("a", newTask())
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	w := mainExited(0).On("envoy").Terminated(0).Phase(corev1.PodSucceeded)
	first := f.podOf("a", 0, w)
	first.UID = "u-first"
	f.both(first)
	f.clk.SetTime(w.Now())
	if _, _, err := f.sync("a"); err != nil { // the capture starts; the outcome is recorded
		t.Fatal(err)
	}
	firstNonce := f.record("a").Nonce
	if lc := nextCapture(t, started, "u-first", "the first record's capture did not start"); lc.Nonce == "" || lc.Nonce != firstNonce {
		t.Fatalf("the first capture's nonce %q, want the first record's %q (the archive tells records of an ID apart by it)", lc.Nonce, firstNonce)
	}
	if !f.record("a").Terminal {
		t.Fatalf("first record %+v", f.record("a"))
	}
	// Its pod is gone; before any pass sees that, retention deletes the
	// record and the ID is used again.
	f.uncache(first)
	f.retainAndSubmitAgain("a", newTask())
	f.update("a", func(r *store.Record) { r.PodCreated = true })
	second := f.podOf("a", 0, running())
	second.UID = "u-second"
	f.both(second)
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	lc := nextCapture(t, started, "u-second", "no capture of the new record's pod: the first record's done capture was taken for it")
	if want := f.record("a").Nonce; lc.Nonce != want || want == firstNonce {
		t.Fatalf("the second capture's nonce %q, want the second record's %q (the first's: %q)", lc.Nonce, want, firstNonce)
	}
}

// nextCapture waits for the next capture started and fails t unless it
// follows the pod with uid (none within 5 s: t fails saying none), and
// returns it.
func nextCapture(t *testing.T, started <-chan LogCapture, uid types.UID, none string) LogCapture {
	t.Helper()
	select {
	case lc := <-started:
		if lc.UID != uid {
			t.Fatalf("capture of %s, want %s", lc.UID, uid)
		}
		return lc
	case <-time.After(5 * time.Second):
		t.Fatal(none)
	}
	return LogCapture{}
}

// TestAnEarlierRecordsCreationIsNotClaimed: a creation admitted for the
// first record of an ID, still on its way when retention deleted that
// record and the ID was used again, builds a pod with the first record's
// nonce. The new record, at the same attempt with no pod, would have taken
// it: the claim compares the nonces, and the pod is discarded, never run.
func TestAnEarlierRecordsCreationIsNotClaimed(t *testing.T) {
	f := newFx(t, nil)
	first := f.submit("a", newTask())
	if _, _, err := f.sync("a"); err != nil { // admits the creation
		t.Fatal(err)
	}
	if _, ok := f.ex.creationOf("a"); !ok {
		t.Fatal("no creation admitted")
	}
	f.update("a", func(r *store.Record) { r.Terminal, r.Phase, r.Reason = true, "Failed", "Cancelled" })
	second := f.retainAndSubmitAgain("a", newTask())
	if second.Nonce == first.Nonce {
		t.Fatal("the new record has the first one's nonce")
	}
	f.drainCreations()
	rec := f.record("a")
	if rec.PodCreated {
		t.Fatalf("the new record took the first record's pod %s", rec.PodUID)
	}
	pods, err := f.client.CoreV1().Pods("ns").List(f.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if !attempt.Fenced(&p) {
			t.Errorf("pod %s (nonce %s) was ungated", p.Name, p.Annotations[task.AnnotationNonce])
		}
	}
}

// TestAnIDUsedAgainStartsWithNoFailures: the first record's failed
// creations do not count against the new record's attempt 0 (its backoff
// and its schedule timeout start from its own first failure).
func TestAnIDUsedAgainStartsWithNoFailures(t *testing.T) {
	f := newFx(t, nil)
	f.reactorError("create", "pods", apierrors.NewInternalError(errors.New("etcd is slow")))
	f.submit("a", newTask())
	for range 3 {
		if _, _, err := f.sync("a"); err != nil {
			t.Fatal(err)
		}
		f.drainCreations()
		if _, _, err := f.sync("a"); err != nil {
			t.Fatal(err)
		}
		f.clk.Step(time.Minute)
	}
	if msg := f.message("a"); !strings.Contains(msg, "failed 3 times") {
		t.Fatalf("first record: %q", msg)
	}
	f.update("a", func(r *store.Record) { r.Terminal, r.Phase, r.Reason = true, "Failed", "Cancelled" })
	f.retainAndSubmitAgain("a", newTask())
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	f.drainCreations()
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	if msg := f.message("a"); !strings.Contains(msg, "failed 1 times") {
		t.Errorf("new record: %q, want its first failure counted as its first", msg)
	}
}

// message is the task's message as Get reports it.
func (f *fx) message(id string) string {
	f.t.Helper()
	rec, err := f.ex.Get(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return rec.Message
}

// TestADiscardIsSentOnceWhileTheCacheLags (simulation seed 1400056336): the
// cache still shows a pod of the ID's first record after a user deleted
// it, its watch behind. Each pass decided to discard the pod, and forgot
// the done discard at its end (the pod is none of the record's attempts),
// so the cleaner's answer brought the task back to a pass that sent the
// DELETE again: a loop of requests with no pause until the watch caught
// up (the simulator's run never settled). The discard is sent once; the
// cache's catching up ends it, and only then is the action forgotten.
func TestADiscardIsSentOnceWhileTheCacheLags(t *testing.T) {
	for name, finished := range map[string]bool{"the new record runs": false, "the new record finished": true} {
		t.Run(name, func(t *testing.T) {
			f := newFx(t, nil)
			f.submit("a", newTask())
			f.update("a", func(r *store.Record) { r.Terminal, r.Phase, r.Reason = true, "Failed", "ExitCode" })
			first := f.podOf("a", 0, mainExited(3).Phase(corev1.PodFailed))
			first.UID = "u-first"
			f.cache(first) // the user deleted it: gone from the API server, not from the cache
			f.retainAndSubmitAgain("a", newTask())
			if finished {
				f.update("a", func(r *store.Record) { r.Terminal, r.Phase, r.Reason = true, "Failed", "Cancelled" })
			}
			total := 0
			for pass := range 5 {
				_, verbs, err := f.sync("a")
				if err != nil {
					t.Fatalf("pass %d: %v", pass, err)
				}
				total += strings.Count(strings.Join(verbs, ","), "delete pods")
			}
			if total != 1 {
				t.Errorf("%d DELETEs of the first record's pod in 5 passes while the cache showed it; want 1", total)
			}
			f.reflect(first.Name)
			if _, _, err := f.sync("a"); err != nil {
				t.Fatal(err)
			}
			if _, ok := f.ex.actionOf("ns/" + first.Name); ok {
				t.Error("the done discard is kept after the cache showed the pod gone")
			}
		})
	}
}
