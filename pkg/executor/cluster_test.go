package executor

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
