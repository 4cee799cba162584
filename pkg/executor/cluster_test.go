package executor

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// TestLoseAttempt: what a declaration that a cluster is lost writes to a
// record whose current attempt has a pod there, and what it refuses.
func TestLoseAttempt(t *testing.T) {
	now := time.Date(2026, 12, 6, 20, 0, 0, 0, time.UTC)
	earlier := store.AttemptOutcome{Attempt: 0, Pod: "p-0", PodUID: "u0", Phase: "Failed", Reason: "ExitCode", Cluster: "east"}
	claimed := store.Record{ID: "r1", Namespace: "ns", Name: "etl", Nonce: "n", Executor: "g-0-east", Cluster: "east",
		Attempt: 1, Attempts: []store.AttemptOutcome{earlier}, PodCreated: true, PodUID: "u1", PodEpoch: 4, Epoch: 4,
		Phase: "Running", Reason: "Running", Version: 7}
	pod1 := task.PodName(task.Identity{Namespace: "ns", Name: "etl", RunID: "r1", Nonce: "n"}, 1)
	lost := store.AttemptOutcome{Attempt: 1, Pod: pod1, PodUID: "u1", Phase: "Failed", Reason: string(podstate.ReasonClusterLost),
		Retryable: true, Cluster: "east", FinishedAt: now, ObservedAt: now,
		Message: `cluster "east" was declared lost while attempt 1 had pod ` + pod1 + " there; it may still run"}
	tests := map[string]struct {
		edit    func(*store.Record)
		cluster string
		want    func(*store.Record) // from the record as given
		refused bool
	}{
		"a running attempt: lost, the next one unplaced": {cluster: "east", want: func(r *store.Record) {
			r.Attempts = append(r.Attempts, lost)
			r.Attempt = 2
			r.Executor, r.Cluster = "", ""
			r.PodCreated, r.PodUID, r.PodEpoch, r.Epoch = false, "", 0, 0
			r.NextAttemptAt = now
			r.Phase, r.Reason = "Pending", string(podstate.ReasonClusterLost)
			r.Message = lost.Message + "; attempt 2 waits for another cluster"
		}},
		"a cancelled task: ends cancelled, no next attempt": {edit: func(r *store.Record) { r.CancelledAt = now.Add(-time.Minute) }, cluster: "east", want: func(r *store.Record) {
			r.Attempts = append(r.Attempts, lost)
			r.Terminal = true
			r.PodCreated, r.PodUID, r.PodEpoch, r.Epoch = false, "", 0, 0
			r.Phase, r.Reason = "Failed", string(podstate.ReasonCancelled)
			r.Message = "the task was cancelled; " + lost.Message
		}},
		"finished":                        {edit: func(r *store.Record) { r.Terminal = true }, cluster: "east", refused: true},
		"placed on another cluster":       {cluster: "west", refused: true},
		"no pod yet (a move, not a loss)": {edit: func(r *store.Record) { r.PodCreated, r.PodUID = false, "" }, cluster: "east", refused: true},
		"its outcome recorded already": {edit: func(r *store.Record) {
			r.Attempts = append(r.Attempts, store.AttemptOutcome{Attempt: 1, Cluster: "east"})
		}, cluster: "east", refused: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := claimed
			in.Attempts = append([]store.AttemptOutcome(nil), claimed.Attempts...)
			if tc.edit != nil {
				tc.edit(&in)
			}
			got, err := LoseAttempt(in, tc.cluster, now)
			if tc.refused {
				if !errors.Is(err, ErrNotLosable) {
					t.Fatalf("LoseAttempt: err = %v, want ErrNotLosable", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := in
			want.Attempts = append([]store.AttemptOutcome(nil), in.Attempts...)
			tc.want(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("LoseAttempt (-want +got):\n%s", diff)
			}
		})
	}
}

// TestClusterIsValidated: Config.Cluster, when set, is a cluster name.
func TestClusterIsValidated(t *testing.T) {
	for _, tc := range []struct {
		cluster string
		ok      bool
	}{{"", true}, {"east", true}, {"East_1", false}} {
		c := Config{Client: nil, InstanceID: "ex", Cluster: tc.cluster}
		err := c.defaults() // fails for the missing client too
		if bad := err != nil && strings.Contains(err.Error(), "field Cluster:"); bad == tc.ok {
			t.Errorf("Cluster %q: err %v, want valid: %v", tc.cluster, err, tc.ok)
		}
	}
}

// TestLostAttemptsPodIsStoppedWhenItsClusterReturns: after a declaration
// of loss the record is no longer the lost cluster's instance's, yet that
// instance's pod of the lost attempt may run on when the cluster answers
// again. The instance stops it (the task's cleanup: here a delete) and
// writes nothing to the record, which another instance owns. A pod of that
// name (and UID) in another cluster's view is not the lost one (UIDs are
// compared within a cluster) and no record's: discarded, as a stray, and
// the record not written either.
func TestLostAttemptsPodIsStoppedWhenItsClusterReturns(t *testing.T) {
	for _, tc := range []struct {
		name        string
		executor    string // the executor's cluster
		lostOn      string // the cluster the attempt was lost on
		wantStopped bool
	}{
		{"the lost cluster's instance", "east", "east", true},
		{"an instance of another cluster", "west", "east", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, func(c *Config) { c.Cluster = tc.executor })
			f.submit("a", newTask())
			pod := f.podOf("a", 0, running())
			pod.UID = "u-lost"
			f.update("a", func(r *store.Record) {
				r.Cluster, r.PodCreated, r.PodUID = tc.lostOn, true, string(pod.UID)
			})
			lost, err := LoseAttempt(f.record("a"), tc.lostOn, f.clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.ex.store.Update(f.ctx, lost); err != nil {
				t.Fatal(err)
			}
			before := f.record("a")
			f.both(pod) // the cluster answers again: its pod shows
			_, verbs, err := f.sync("a")
			if err != nil {
				t.Fatal(err)
			}
			stopped := slices.Contains(verbs, "delete pods")
			if stopped != tc.wantStopped {
				t.Errorf("requests %v; want the lost pod stopped: %v", verbs, tc.wantStopped)
			}
			if after := f.record("a"); after.Version != before.Version {
				t.Errorf("the record was written (version %d to %d): it is another instance's", before.Version, after.Version)
			}
		})
	}
}

// TestASubmittedTaskIsPlacedOnTheExecutorsCluster: an executor of a
// cluster records the tasks submitted to it as placed on its cluster, and
// runs them. Before, Submit left the record's cluster empty, and the
// executor's pass then left the task as one placed on another cluster:
// it never ran (found while modelling clusters in the simulator).
func TestASubmittedTaskIsPlacedOnTheExecutorsCluster(t *testing.T) {
	f := newFx(t, func(c *Config) { c.Cluster = "east" })
	rec := f.submit("x", newTask())
	if rec.Cluster != "east" {
		t.Fatalf("record placed on cluster %q, want the executor's, east", rec.Cluster)
	}
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	if created := f.drainCreations(); len(created) != 1 {
		t.Errorf("creations %v after a pass, want the task's pod", created)
	}
}

// TestAMovedAttemptsPodIsDiscardedWhereItWasCreated (simulation, the
// clusters scenario, seed 7061): east's creation of a task's pod was on
// its way, not recorded, when the task was moved to west. The record is
// west's instance's now, and east's instance took it for another
// instance's task and left the pod: gated, with kubetask's finalizer, for
// good. East discards it (it never ran: a move requires no pod claimed),
// and writes nothing to the record.
func TestAMovedAttemptsPodIsDiscardedWhereItWasCreated(t *testing.T) {
	f := newFx(t, func(c *Config) { c.Cluster = "east" })
	f.submit("a", newTask())
	pod := f.podOf("a", 0, podtest.MakePod("p", "ns"))
	pod.UID = "u-east"
	pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: task.FenceGate}}
	pod.Annotations[task.AnnotationEpoch] = strconv.FormatInt(f.ex.epoch.Load(), 10)
	f.both(pod)
	moved, err := f.ex.store.(store.Clusters).Move(f.ctx, f.record("a"), "ex-west", "west")
	if err != nil {
		t.Fatal(err)
	}
	_, verbs, err := f.sync("a")
	if err != nil {
		t.Fatal(err)
	}
	if p := f.serverPod(pod.Name); p != nil && (p.DeletionTimestamp == nil || hasFinalizer(p)) {
		t.Errorf("the moved attempt's pod is left on east (requests %v): deletion %v, finalizers %v", verbs, p.DeletionTimestamp, p.Finalizers)
	}
	if after := f.record("a"); after.Version != moved.Version {
		t.Errorf("the record was written (version %d to %d): it is west's", moved.Version, after.Version)
	}
}

// TestALostAttemptsEndIsRecordedAsDiscarded: the pod of an attempt declared
// lost ran on, and its main container exited 3 while nobody watched. When
// its cluster answers again, its instance records that end as the lost
// attempt's discarded end (for the user), before it releases the pod, and
// changes nothing else: the attempt's outcome stays ClusterLost, the task
// stays another instance's at its attempt, and a second pass writes
// nothing more.
func TestALostAttemptsEndIsRecordedAsDiscarded(t *testing.T) {
	f := newFx(t, func(c *Config) { c.Cluster = "east" })
	f.submit("a", newTask())
	w := mainExited(3).On("envoy").Terminated(0).Phase(corev1.PodFailed)
	pod := f.podOf("a", 0, w)
	pod.UID = "u-lost"
	f.update("a", func(r *store.Record) { r.PodCreated, r.PodUID = true, string(pod.UID) })
	lost, err := LoseAttempt(f.record("a"), "east", f.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ex.store.Update(f.ctx, lost); err != nil {
		t.Fatal(err)
	}
	moved, err := f.ex.store.(store.Clusters).Move(f.ctx, f.record("a"), "ex-west", "west")
	if err != nil {
		t.Fatal(err)
	}
	f.both(pod) // the cluster answers again
	f.clk.SetTime(w.Now())
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	rec := f.record("a")
	d := rec.Attempts[0].Discarded
	if d == nil || d.ExitCode == nil || *d.ExitCode != 3 {
		t.Fatalf("the lost attempt's discarded end %+v, want exit code 3", d)
	}
	if out := rec.Attempts[0]; out.Reason != "ClusterLost" || out.ExitCode != nil {
		t.Errorf("the lost attempt's outcome became %s, exit code %v; want ClusterLost, none", out.Reason, out.ExitCode)
	}
	if rec.Executor != moved.Executor || rec.Attempt != moved.Attempt || rec.Phase != moved.Phase || rec.PodCreated {
		t.Errorf("the record changed beyond the discarded end: %+v", rec)
	}
	f.reflect(pod.Name)
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	if again := f.record("a"); again.Version != rec.Version {
		t.Errorf("a second pass wrote the record again (version %d to %d)", rec.Version, again.Version)
	}
	if p := f.serverPod(pod.Name); p != nil && hasFinalizer(p) {
		t.Errorf("the lost pod keeps kubetask's finalizer: %v", p.Finalizers)
	}
}

// TestPodStoppedIsRecorded: an attempt's outcome says whether its pod was
// seen stopped (every container terminated) when it was recorded: not
// while the sidecar still runs after the main container's exit; yes once
// the pod has stopped, or when there was no pod. The next attempt's first
// wait for a slot says it in the same write, once the pass has seen the
// pod stopped. A placer moves a task away from its cluster only then.
func TestPodStoppedIsRecorded(t *testing.T) {
	retried := func(tk *task.Task) {
		one := int32(1)
		tk.Spec.Retries.Limit, tk.Spec.Retries.RetryOn = &one, []string{string(podstate.ReasonExitCode)}
	}
	for _, tc := range []struct {
		name string
		pod  *podtest.PodWrapper
		want bool
	}{
		{"the sidecar runs on", mainExited(3), false},
		{"every container stopped", mainExited(3).On("envoy").Terminated(0).Phase(corev1.PodFailed), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, func(c *Config) { c.Cluster = "east" })
			f.submit("a", newTask(retried))
			f.update("a", func(r *store.Record) { r.PodCreated = true })
			f.both(f.podOf("a", 0, tc.pod))
			f.clk.SetTime(tc.pod.Now())
			if _, _, err := f.sync("a"); err != nil {
				t.Fatal(err)
			}
			rec := f.record("a")
			if len(rec.Attempts) != 1 || rec.Attempt != 1 {
				t.Fatalf("attempts %+v, current %d; want attempt 0 ended and 1 next", rec.Attempts, rec.Attempt)
			}
			if got := rec.Attempts[0].PodStopped; got != tc.want {
				t.Errorf("attempt 0's pod recorded stopped: %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("the next attempt's wait for a slot", func(t *testing.T) {
		f := newFx(t, func(c *Config) { c.Cluster = "east" })
		f.submit("a", newTask(retried))
		f.update("a", func(r *store.Record) {
			r.Attempt = 1
			r.Attempts = []store.AttemptOutcome{{Attempt: 0, Phase: "Failed", Reason: "ExitCode", Cluster: "east"}}
		})
		if err := f.ex.persistPending(f.ctx, f.record("a"), reasonWaitingForSlot, "parallelism 1 reached"); err != nil {
			t.Fatal(err)
		}
		if !f.record("a").Attempts[0].PodStopped {
			t.Error("the wait for a slot did not record attempt 0's pod stopped")
		}
	})
	t.Run("no pod", func(t *testing.T) {
		f := newFx(t, func(c *Config) { c.Cluster = "east" })
		f.submit("a", newTask())
		if err := f.ex.Cancel(f.ctx, "a"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.sync("a"); err != nil {
			t.Fatal(err)
		}
		if rec := f.record("a"); len(rec.Attempts) != 1 || !rec.Attempts[0].PodStopped {
			t.Errorf("attempts %+v; want one, its pod (none) recorded stopped", rec.Attempts)
		}
	})
}

// TestStranded counts the tasks whose pods the instance shows while their
// records are placed elsewhere: none while the record is the instance's,
// one once its attempt is lost (unplaced) and once moved on to another
// cluster, none once the pod is gone, and none without a cluster.
func TestStranded(t *testing.T) {
	f := newFx(t, func(c *Config) { c.Cluster = "east" })
	f.submit("a", newTask())
	pod := f.podOf("a", 0, running())
	pod.UID = "u-a"
	f.update("a", func(r *store.Record) { r.PodCreated, r.PodUID = true, string(pod.UID) })
	f.both(pod)
	f.submit("b", newTask()) // no pod
	stranded := func(want int, when string) {
		t.Helper()
		if n, err := f.ex.Stranded(f.ctx); err != nil || n != want {
			t.Errorf("%s: Stranded = %d, %v; want %d", when, n, err, want)
		}
	}
	stranded(0, "the instance's own")
	lost, err := LoseAttempt(f.record("a"), "east", f.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ex.store.Update(f.ctx, lost); err != nil {
		t.Fatal(err)
	}
	stranded(1, "lost, unplaced")
	f.update("a", func(r *store.Record) { r.Executor, r.Cluster = "other-west", "west" })
	stranded(1, "placed on west")
	f.uncache(pod)
	stranded(0, "its pod gone")

	g := newFx(t, nil)
	g.submit("a", newTask())
	g.cache(g.podOf("a", 0, running()))
	g.update("a", func(r *store.Record) { r.Executor, r.Cluster = "other", "west" })
	if n, err := g.ex.Stranded(g.ctx); err != nil || n != 0 {
		t.Errorf("an executor without a cluster: Stranded = %d, %v; want 0", n, err)
	}
}

// TestRecordOnlyNeedsNoClient: a RecordOnly executor (the view of an
// instance that runs in a cluster this process cannot reach) is built
// without RESTConfig or Client, records a submission for its instance and
// cluster, reads and cancels through the store, and refuses to start.
func TestRecordOnlyNeedsNoClient(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory()
	ex, err := New(Config{InstanceID: "svc-west", Cluster: "west", RecordOnly: true, Store: st})
	if err != nil {
		t.Fatalf("a RecordOnly executor without a client: %v", err)
	}
	tk := newTask()
	tk.Namespace = "ns"
	rec, err := ex.Submit(ctx, "a", tk)
	if err != nil || rec.Executor != "svc-west" || rec.Cluster != "west" {
		t.Fatalf("Submit: %+v, %v; want recorded for svc-west on west", rec, err)
	}
	if err := ex.Cancel(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got, err := ex.Get(ctx, "a"); err != nil || got.CancelledAt.IsZero() {
		t.Errorf("Get after Cancel: %+v, %v; want the cancellation recorded", got, err)
	}
	if err := ex.Start(ctx); err == nil {
		t.Error("a RecordOnly executor started")
	}
	if _, err := New(Config{InstanceID: "svc-west", Store: st}); err == nil || !strings.Contains(err.Error(), "RESTConfig is required") {
		t.Errorf("an executor that runs, without a client: %v; want RESTConfig required", err)
	}
}
