// Package storetest is the conformance suite every store.Store implementation
// must pass. It pins down the contract the executor relies on: idempotent
// Create, compare-and-swap Update (on the version and on the nonce: a copy
// of an earlier record of the ID never overwrites a later one), deep-copy
// isolation, List filtering and
// order, a lossless round trip of every Record field, and the same outcomes
// for each write when many run at once (as a store that commits concurrent
// writes together must keep them): one winner per compare-and-swap race, a
// conflict that fails only its own write, a cancelled call that either
// applied its write or reports that it did not, and a Close that leaves no
// call hanging; and the fence: BeginTerm raises an instance's epoch, and an
// Update carrying an older epoch is refused with ErrFenced, also when it
// races with BeginTerm.
//
// For a store that implements them (each case is skipped otherwise), it
// also pins down the optional interfaces of kubetask serve: Pager (every
// filter alone and combined, against a plain filter over the records; paging
// through 1,000 records while more are created, with no record skipped or
// repeated; bad and foreign continue tokens; page sizes; labels that change),
// Logs (chunks read back byte-exact at any offset, offset mismatches, the
// complete flag and cursor, read bounds, a log's task, key order, concurrent
// appends, and with RunWithOptions the size cap and its marker) and
// Retention (only old terminal tasks go, with their logs and labels).
// RunClusters (clusters.go) pins down store.Clusters and the cluster of a
// record, RunGroups (groups.go) store.Groups.
//
// Precision: times round-trip to the nanosecond (compared with time.Equal);
// a time's location is not part of the contract, so a store may return it in
// UTC. Non-zero times must lie within the range of time.UnixNano (years 1678
// to 2262). nil and empty slices are distinct: a store returns Task, Result
// and Attempts exactly as nil or empty as they were written.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kubetask/kubetask/pkg/store"
)

// Run runs the conformance suite against the stores that open returns. open
// is called once per subtest and must return an empty store; Run closes it.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"CreateIdempotent", testCreateIdempotent},
		{"CreateSetsVersionAndTimes", testCreateSetsVersionAndTimes},
		{"CreateEmptyID", testCreateEmptyID},
		{"GetNotFound", testGetNotFound},
		{"SchedulerIDsExact", testSchedulerIDs},
		{"UpdateConflict", testUpdateConflict},
		{"UpdateNotFound", testUpdateNotFound},
		{"UpdateOfAnEarlierUseOfTheIDConflicts", testUpdateIDUsedAgain},
		{"UpdateSetsTheNonceOfARecordWithout", testUpdateSetsNonce},
		{"VersionMonotonic", testVersionMonotonic},
		{"DeepCopyIsolation", testDeepCopyIsolation},
		{"ListFiltersAndOrder", testListFiltersAndOrder},
		{"ListEmpty", testListEmpty},
		{"ConcurrentUpdatesOneWinnerPerVersion", testConcurrentUpdatesOneWinner},
		{"ConcurrentReadModifyWriteLosesNothing", testConcurrentRMW},
		{"ConcurrentCreateOneCreator", testConcurrentCreate},
		{"RoundTrip", testRoundTrip},
		{"CancelledContext", testCancelledContext},
		{"ConcurrentWritersDistinctAndSame", testConcurrentWriters},
		{"MixedOutcomesTogether", testMixedOutcomes},
		{"CancelWhileWaiting", testCancelWhileWaiting},
		{"CloseWhileWriting", testCloseWhileWriting},
		{"FenceRefusesOlderEpochs", testFence},
		{"FenceBeginTermOrdersConcurrentWrites", testFenceConcurrent},
	}
	for _, tc := range append(tests, serviceCases...) {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tc.fn(t, s)
		})
	}
}

// ignoreStoreSet ignores the fields the store sets itself.
var ignoreStoreSet = cmpopts.IgnoreFields(store.Record{}, "Version", "CreatedAt", "UpdatedAt")

func ptr[T any](v T) *T { return &v }

// base is a time with nanoseconds in a non-UTC location, so a store that
// truncates or misreads either fails the round trip.
var base = time.Date(2031, 5, 17, 10, 11, 12, 123456789, time.FixedZone("X", 5*3600+30*60))

// Sample returns a record with every field set to a non-zero value, for
// suites and benchmarks that need a realistic record.
func Sample(id string) store.Record {
	return store.Record{
		ID:            id,
		Namespace:     "ns-" + id,
		Name:          "task-" + id,
		Executor:      "exec-a",
		Cluster:       "east",
		Labels:        map[string]string{"app": "demo", "kubetask.io/team": "core"},
		Origin:        "origin-of-" + id,
		Task:          []byte(`{"image":"busybox","command":["true"]}`),
		Attempt:       1,
		Phase:         "Running",
		Reason:        "ContainerRunning",
		Message:       "main container running",
		ExitCode:      ptr[int32](0),
		Retryable:     true,
		Result:        []byte(`{"ok":true}`),
		Terminal:      false,
		CancelledAt:   base.Add(time.Second),
		NextAttemptAt: base.Add(2 * time.Second),
		PodCreated:    true,
		PodUID:        "uid-" + id,
		PodEpoch:      3,
		Nonce:         "nonce-" + id,
		SubmittedBy:   store.Actor{Auth: "kubernetes", User: "system:serviceaccount:ci:runner \"é\"", UID: "uid-1", Groups: []string{"system:serviceaccounts", "ci"}},
		CancelledBy:   store.Actor{Auth: "token", User: "ops"},
		Attempts: []store.AttemptOutcome{{
			Attempt:    0,
			Pod:        "task-" + id + "-0",
			PodUID:     "uid-0-" + id,
			Cluster:    "west",
			Phase:      "Failed",
			Reason:     "OOMKilled",
			Message:    "exceeded memory",
			ExitCode:   ptr[int32](137),
			Retryable:  true,
			FinishedAt: base,
			ObservedAt: base.Add(1500 * time.Microsecond),
		}},
	}
}

func mustCreate(t *testing.T, s store.Store, rec store.Record) store.Record {
	t.Helper()
	got, created, err := s.Create(context.Background(), rec)
	if err != nil {
		t.Fatalf("Create(%s): %v", rec.ID, err)
	}
	if !created {
		t.Fatalf("Create(%s): created = false for a new ID", rec.ID)
	}
	return got
}

func mustGet(t *testing.T, s store.Store, id string) store.Record {
	t.Helper()
	got, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return got
}

func testCreateIdempotent(t *testing.T, s store.Store) {
	ctx := context.Background()
	first := mustCreate(t, s, Sample("a"))

	again := Sample("a")
	again.Name, again.Phase, again.Task = "other", "Pending", []byte(`{}`)
	got, created, err := s.Create(ctx, again)
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if created {
		t.Errorf("second Create: created = true, want false")
	}
	if diff := cmp.Diff(first, got); diff != "" {
		t.Errorf("second Create returned a record other than the stored one (-stored +got):\n%s", diff)
	}
	if diff := cmp.Diff(first, mustGet(t, s, "a")); diff != "" {
		t.Errorf("second Create changed the stored record (-first +now):\n%s", diff)
	}
}

func testCreateSetsVersionAndTimes(t *testing.T, s store.Store) {
	rec := Sample("a")
	rec.Version = 42
	rec.CreatedAt = base.Add(-time.Hour)
	rec.UpdatedAt = base.Add(-time.Hour)
	got := mustCreate(t, s, rec)
	if got.Version != 1 {
		t.Errorf("Version = %d, want 1", got.Version)
	}
	if got.CreatedAt.Equal(rec.CreatedAt) || got.CreatedAt.IsZero() {
		t.Errorf("CreatedAt = %v: want the store's clock, not the caller's %v", got.CreatedAt, rec.CreatedAt)
	}
	if !got.UpdatedAt.Equal(got.CreatedAt) {
		t.Errorf("UpdatedAt = %v, want CreatedAt %v on create", got.UpdatedAt, got.CreatedAt)
	}
	if diff := cmp.Diff(rec, got, ignoreStoreSet); diff != "" {
		t.Errorf("Create result differs from input (-in +got):\n%s", diff)
	}
	if diff := cmp.Diff(got, mustGet(t, s, "a")); diff != "" {
		t.Errorf("Get differs from Create result (-create +get):\n%s", diff)
	}
}

func testCreateEmptyID(t *testing.T, s store.Store) {
	if _, _, err := s.Create(context.Background(), store.Record{Name: "x"}); err == nil {
		t.Errorf("Create with an empty ID: err = nil, want an error")
	}
}

func testGetNotFound(t *testing.T, s store.Store) {
	mustCreate(t, s, Sample("a"))
	_, err := s.Get(context.Background(), "b")
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(missing): err = %v, want ErrNotFound", err)
	}
}

// testSchedulerIDs: IDs as schedulers make them (task.ValidateID: any
// printable text up to 512 bytes) are stored, found, updated, listed in byte
// order and given logs exactly as they are, none mistaken for another.
func testSchedulerIDs(t *testing.T, s store.Store) {
	ctx := context.Background()
	ids := []string{
		"etl_dag.Extract_Users.scheduled__2026-12-01T00:00:00+00:00.1",
		"etl_dag.Extract_Users.scheduled__2026-12-01T00:00:00+00:00.10",
		"with spaces, 100% & ?query#frag",
		"with spaces, 100% & ?query#frag ",
		"Ünïcödé ✓ 任务",
		"UNICODE",
		strings.Repeat("long.", 102) + "xy", // 512 bytes
		"a'b\"c\\d;--",
	}
	for _, id := range ids {
		mustCreate(t, s, Sample(id))
	}
	for _, id := range ids {
		got, err := s.Get(ctx, id)
		if err != nil || got.ID != id || got.Name != "task-"+id {
			t.Fatalf("Get(%q) = %q (name %q), %v", id, got.ID, got.Name, err)
		}
		got.Phase = "Succeeded"
		if got, err = s.Update(ctx, got); err != nil || got.ID != id {
			t.Fatalf("Update(%q) = %q, %v", id, got.ID, err)
		}
	}
	if _, err := s.Get(ctx, strings.ToLower(ids[5])); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get of an ID that differs in case: %v, want ErrNotFound", err)
	}
	recs, err := s.List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, r := range recs {
		listed = append(listed, r.ID)
	}
	want := slices.Sorted(slices.Values(ids))
	if diff := cmp.Diff(want, listed); diff != "" {
		t.Errorf("List IDs (-want +got, byte order):\n%s", diff)
	}
	logs, ok := s.(store.Logs)
	if !ok {
		return
	}
	for i, id := range ids {
		key := store.LogKey{TaskID: id, Attempt: 0, Container: "main"}
		if _, err := logs.AppendLog(ctx, key, store.LogAppend{Data: []byte(id), Complete: true}); err != nil {
			t.Fatalf("AppendLog(%q): %v", id, err)
		}
		keys, err := logs.LogKeys(ctx, id)
		if err != nil || len(keys) != 1 || keys[0] != key {
			t.Fatalf("LogKeys(%q) = %v, %v", id, keys, err)
		}
		data, _, err := logs.ReadLog(ctx, key, 0, 1<<20)
		if err != nil || string(data) != id {
			t.Fatalf("ReadLog(%q) = %q, %v (log %d)", id, data, err, i)
		}
	}
}

func testUpdateConflict(t *testing.T, s store.Store) {
	ctx := context.Background()
	v1 := mustCreate(t, s, Sample("a"))
	v1.Phase = "Succeeded"
	v2, err := s.Update(ctx, v1)
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	stale := v1 // still Version 1
	stale.Phase = "Failed"
	if _, err := s.Update(ctx, stale); !errors.Is(err, store.ErrConflict) {
		t.Errorf("Update(stale): err = %v, want ErrConflict", err)
	}
	if errors.Is(err, store.ErrNotFound) {
		t.Errorf("Update(stale): err also matches ErrNotFound: %v", err)
	}
	ahead := v2
	ahead.Version = v2.Version + 5
	if _, err := s.Update(ctx, ahead); !errors.Is(err, store.ErrConflict) {
		t.Errorf("Update(version ahead): err = %v, want ErrConflict", err)
	}
	if diff := cmp.Diff(v2, mustGet(t, s, "a")); diff != "" {
		t.Errorf("a failed Update changed the record (-want +got):\n%s", diff)
	}
}

func testUpdateNotFound(t *testing.T, s store.Store) {
	rec := Sample("missing")
	rec.Version = 1
	_, err := s.Update(context.Background(), rec)
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Update(missing): err = %v, want ErrNotFound", err)
	}
	if errors.Is(err, store.ErrConflict) {
		t.Errorf("Update(missing): err also matches ErrConflict: %v", err)
	}
	if _, err := s.Get(context.Background(), "missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Update(missing) created a record: Get err = %v", err)
	}
}

// testUpdateIDUsedAgain: once retention deleted a finished record and its
// ID was used again, a write of a copy of the earlier record is ErrConflict
// (nothing written), also when the later record is at the copy's version,
// also when the copy would be fenced too, and also when the copy is of a
// record from before nonces: the stored record is another use of the ID,
// whose nonce a write must carry.
func testUpdateIDUsedAgain(t *testing.T, s store.Store) {
	r, ok := s.(store.Retention)
	if !ok {
		t.Skip("the store does not implement store.Retention: an ID is never used again")
	}
	ctx := context.Background()
	// used creates the record id with nonce, and updates it to version 2.
	used := func(t *testing.T, id, nonce string) store.Record {
		t.Helper()
		rec := Sample(id)
		rec.Nonce, rec.Terminal = nonce, false
		cur := mustCreate(t, s, rec)
		cur.Message = "progress of the record with nonce " + nonce
		cur, err := s.Update(ctx, cur)
		if err != nil {
			t.Fatalf("Update of the record with nonce %q: %v", nonce, err)
		}
		if cur.Version != 2 {
			t.Fatalf("version after an update = %d, want 2", cur.Version)
		}
		return cur
	}
	// retire finishes cur and deletes it as retention does.
	retire := func(t *testing.T, cur store.Record) {
		t.Helper()
		cur.Terminal, cur.Phase = true, "Succeeded"
		if _, err := s.Update(ctx, cur); err != nil {
			t.Fatalf("Update to finished: %v", err)
		}
		if n, err := r.DeleteFinishedBefore(ctx, waitPast(t, time.Now()), 100); err != nil || n != 1 {
			t.Fatalf("DeleteFinishedBefore = %d, err %v; want the 1 finished task", n, err)
		}
	}
	for i, tc := range []struct {
		name, earlier string
		epoch         int64 // of the earlier copy's write; exec-a's epoch stays 0
	}{
		{"a copy of the earlier record", "first", 0},
		{"a copy of the earlier record, fenced too", "first", 1},
		{"a copy of an earlier record from before nonces", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("x-%d", i)
			earlier := used(t, id, tc.earlier)
			retire(t, earlier)
			later := used(t, id, "second")
			stale := earlier.DeepCopy()
			stale.Message, stale.Epoch = "the earlier record's late write", tc.epoch
			_, err := s.Update(ctx, stale)
			if !errors.Is(err, store.ErrConflict) {
				t.Errorf("Update of %s: err = %v, want ErrConflict", tc.name, err)
			}
			if errors.Is(err, store.ErrFenced) || errors.Is(err, store.ErrNotFound) {
				t.Errorf("Update of %s: err also matches ErrFenced or ErrNotFound: %v", tc.name, err)
			}
			if err != nil && !strings.Contains(err.Error(), "another use of its ID") {
				t.Errorf("Update of %s: the error does not say the stored record is another use of its ID: %v", tc.name, err)
			}
			if diff := cmp.Diff(later, mustGet(t, s, id)); diff != "" {
				t.Errorf("the refused write changed the later record (-want +got):\n%s", diff)
			}
			// The later record's own writes go on.
			later.Message = "the later record's write"
			if later, err = s.Update(ctx, later); err != nil {
				t.Fatalf("Update of the later record: %v", err)
			}
			retire(t, later)
		})
	}
}

// testUpdateSetsNonce: a stored record without a nonce (written before
// nonces) accepts an Update that sets one (the executor adopting its pod);
// from then on the record has that nonce, and a write with another is
// ErrConflict.
func testUpdateSetsNonce(t *testing.T, s store.Store) {
	ctx := context.Background()
	rec := Sample("a")
	rec.Nonce = ""
	cur := mustCreate(t, s, rec)
	if cur.Nonce != "" {
		t.Fatalf("created nonce = %q, want empty", cur.Nonce)
	}
	cur.Nonce = "adopted"
	cur, err := s.Update(ctx, cur)
	if err != nil {
		t.Fatalf("Update setting the nonce of a record without one: %v", err)
	}
	if got := mustGet(t, s, "a"); got.Nonce != "adopted" {
		t.Errorf("stored nonce = %q, want %q", got.Nonce, "adopted")
	}
	for _, nonce := range []string{"other", ""} {
		w := cur.DeepCopy()
		w.Nonce, w.Message = nonce, "a write with nonce "+nonce
		if _, err := s.Update(ctx, w); !errors.Is(err, store.ErrConflict) {
			t.Errorf("Update with nonce %q of the record with nonce %q: err = %v, want ErrConflict", nonce, cur.Nonce, err)
		}
	}
	if diff := cmp.Diff(cur, mustGet(t, s, "a")); diff != "" {
		t.Errorf("a refused write changed the record (-want +got):\n%s", diff)
	}
	cur.Message = "a write with the record's nonce"
	if _, err := s.Update(ctx, cur); err != nil {
		t.Errorf("Update with the record's nonce: %v", err)
	}
}

func testVersionMonotonic(t *testing.T, s store.Store) {
	ctx := context.Background()
	cur := mustCreate(t, s, Sample("a"))
	created := cur.CreatedAt
	for i := 2; i <= 12; i++ {
		cur.Attempt = i
		cur.CreatedAt = base // the caller cannot rewrite CreatedAt
		prevUpdated := cur.UpdatedAt
		next, err := s.Update(ctx, cur)
		if err != nil {
			t.Fatalf("Update %d: %v", i, err)
		}
		if next.Version != int64(i) {
			t.Fatalf("Version after %d writes = %d, want %d", i, next.Version, i)
		}
		if !next.CreatedAt.Equal(created) {
			t.Errorf("Update changed CreatedAt: %v, want %v", next.CreatedAt, created)
		}
		if next.UpdatedAt.Before(prevUpdated) {
			t.Errorf("UpdatedAt went back: %v after %v", next.UpdatedAt, prevUpdated)
		}
		if diff := cmp.Diff(next, mustGet(t, s, "a")); diff != "" {
			t.Fatalf("Get differs from Update result (-update +get):\n%s", diff)
		}
		cur = next
	}
}

func testDeepCopyIsolation(t *testing.T, s store.Store) {
	ctx := context.Background()
	in := Sample("a")
	created := mustCreate(t, s, in)
	want := created.DeepCopy()

	scribble := func(r *store.Record) {
		r.Labels["app"] = "scribbled"
		r.Labels["new"] = "scribbled"
		r.Task[0] = 'X'
		r.Result[0] = 'X'
		*r.ExitCode = 99
		r.Attempts[0].Pod = "scribbled"
		*r.Attempts[0].ExitCode = 99
	}
	scribble(&in)      // the caller's input after Create
	scribble(&created) // the record Create returned
	got := mustGet(t, s, "a")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("changing Create's input or output changed the stored record (-want +got):\n%s", diff)
	}
	scribble(&got) // a record Get returned
	if diff := cmp.Diff(want, mustGet(t, s, "a")); diff != "" {
		t.Fatalf("changing Get's output changed the stored record (-want +got):\n%s", diff)
	}

	upd := want.DeepCopy()
	upd.Phase = "Succeeded"
	upd.Attempts = append(upd.Attempts, store.AttemptOutcome{Attempt: 1, ExitCode: ptr[int32](0)})
	out, err := s.Update(ctx, upd)
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	want2 := out.DeepCopy()
	scribble(&upd)
	scribble(&out)
	*upd.Attempts[1].ExitCode = 7
	if diff := cmp.Diff(want2, mustGet(t, s, "a")); diff != "" {
		t.Fatalf("changing Update's input or output changed the stored record (-want +got):\n%s", diff)
	}

	list, err := s.List(ctx, store.ListOptions{})
	if err != nil || len(list) != 1 {
		t.Fatalf("List: %d records, err %v", len(list), err)
	}
	scribble(&list[0])
	if diff := cmp.Diff(want2, mustGet(t, s, "a")); diff != "" {
		t.Fatalf("changing List's output changed the stored record (-want +got):\n%s", diff)
	}

	if p, ok := s.(store.Pager); ok {
		page, err := p.Page(ctx, store.PageOptions{Labels: map[string]string{"app": "demo"}})
		if err != nil || len(page.Records) != 1 {
			t.Fatalf("Page: %d records, err %v", len(page.Records), err)
		}
		scribble(&page.Records[0])
		if diff := cmp.Diff(want2, mustGet(t, s, "a")); diff != "" {
			t.Fatalf("changing Page's output changed the stored record (-want +got):\n%s", diff)
		}
	}
}

func testListFiltersAndOrder(t *testing.T, s store.Store) {
	ctx := context.Background()
	// Created out of order, so an insertion-ordered store fails.
	recs := []struct {
		id, executor string
		terminal     bool
	}{
		{"t-05", "a", false},
		{"t-01", "b", true},
		{"t-10", "a", true},
		{"t-02", "a", false},
		{"t-07", "b", false},
		{"t-03", "", false},
	}
	for _, r := range recs {
		rec := Sample(r.id)
		rec.Executor = r.executor
		rec = mustCreate(t, s, rec)
		if r.terminal {
			rec.Terminal = true
			if _, err := s.Update(ctx, rec); err != nil {
				t.Fatalf("Update(%s): %v", r.id, err)
			}
		}
	}
	tests := map[string]struct {
		opts store.ListOptions
		want []string
	}{
		"all":                  {store.ListOptions{}, []string{"t-01", "t-02", "t-03", "t-05", "t-07", "t-10"}},
		"executor a":           {store.ListOptions{Executor: "a"}, []string{"t-02", "t-05", "t-10"}},
		"non-terminal":         {store.ListOptions{NonTerminal: true}, []string{"t-02", "t-03", "t-05", "t-07"}},
		"executor b, non-term": {store.ListOptions{Executor: "b", NonTerminal: true}, []string{"t-07"}},
		"unknown executor":     {store.ListOptions{Executor: "zzz"}, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := s.List(ctx, tc.opts)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			var ids []string
			for _, r := range got {
				ids = append(ids, r.ID)
				if diff := cmp.Diff(mustGet(t, s, r.ID), r); diff != "" {
					t.Errorf("List record %s differs from Get (-get +list):\n%s", r.ID, diff)
				}
			}
			if diff := cmp.Diff(tc.want, ids); diff != "" {
				t.Errorf("List(%+v) IDs (-want +got):\n%s", tc.opts, diff)
			}
		})
	}
}

func testListEmpty(t *testing.T, s store.Store) {
	got, err := s.List(context.Background(), store.ListOptions{NonTerminal: true})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(got) != 0 {
		t.Errorf("List on an empty store: %d records", len(got))
	}
}

// testConcurrentUpdatesOneWinner lets N goroutines race to update the same
// version, round after round: exactly one may win each round, the rest must
// see ErrConflict and nothing else.
func testConcurrentUpdatesOneWinner(t *testing.T, s store.Store) {
	const workers, rounds = 8, 20
	ctx := context.Background()
	cur := mustCreate(t, s, Sample("a"))
	for round := range rounds {
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			wins      []store.Record
			conflicts int
			others    []error
		)
		start := make(chan struct{})
		for w := range workers {
			wg.Go(func() {
				rec := cur.DeepCopy()
				rec.Message = fmt.Sprintf("round %d worker %d", round, w)
				<-start
				out, err := s.Update(ctx, rec)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins = append(wins, out)
				case errors.Is(err, store.ErrConflict):
					conflicts++
				default:
					others = append(others, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(others) > 0 {
			t.Fatalf("round %d: unexpected errors: %v", round, others)
		}
		if len(wins) != 1 || conflicts != workers-1 {
			t.Fatalf("round %d: %d wins and %d conflicts, want 1 and %d", round, len(wins), conflicts, workers-1)
		}
		if wins[0].Version != cur.Version+1 {
			t.Fatalf("round %d: winner's version %d, want %d", round, wins[0].Version, cur.Version+1)
		}
		if diff := cmp.Diff(wins[0], mustGet(t, s, "a")); diff != "" {
			t.Fatalf("round %d: stored record is not the winner's (-winner +stored):\n%s", round, diff)
		}
		cur = wins[0]
	}
}

// testConcurrentRMW runs get-modify-update loops that retry on conflict: no
// increment may be lost and every version is written exactly once.
func testConcurrentRMW(t *testing.T, s store.Store) {
	const workers, perWorker = 4, 25
	ctx := context.Background()
	rec := Sample("a")
	rec.Attempts = nil
	mustCreate(t, s, rec)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := 0; i < perWorker; {
				cur, err := s.Get(ctx, "a")
				if err != nil {
					errs <- err
					return
				}
				cur.Attempt++
				cur.Attempts = append(cur.Attempts, store.AttemptOutcome{Attempt: len(cur.Attempts), Pod: fmt.Sprintf("w%d-%d", w, i)})
				if _, err := s.Update(ctx, cur); errors.Is(err, store.ErrConflict) {
					continue
				} else if err != nil {
					errs <- err
					return
				}
				i++
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("read-modify-write: %v", err)
	}
	got := mustGet(t, s, "a")
	const total = workers * perWorker
	if got.Attempt != 1+total || len(got.Attempts) != total || got.Version != 1+total {
		t.Fatalf("after %d successful updates: Attempt %d, %d attempts, version %d; want %d, %d, %d",
			total, got.Attempt, len(got.Attempts), got.Version, 1+total, total, 1+total)
	}
	for i, a := range got.Attempts {
		if a.Attempt != i {
			t.Fatalf("Attempts[%d].Attempt = %d: an update was lost or doubled", i, a.Attempt)
		}
	}
}

func testConcurrentCreate(t *testing.T, s store.Store) {
	const workers = 8
	ctx := context.Background()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		creates int
		seen    []store.Record
		errs    []error
	)
	start := make(chan struct{})
	for w := range workers {
		wg.Go(func() {
			rec := Sample("a")
			rec.Message = fmt.Sprintf("worker %d", w)
			<-start
			got, created, err := s.Create(ctx, rec)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if created {
				creates++
			}
			seen = append(seen, got)
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent Create: %v", errs)
	}
	if creates != 1 {
		t.Fatalf("concurrent Create: %d callers created the record, want 1", creates)
	}
	stored := mustGet(t, s, "a")
	for _, got := range seen {
		if diff := cmp.Diff(stored, got); diff != "" {
			t.Errorf("a Create returned a record other than the stored one (-stored +got):\n%s", diff)
		}
	}
}

func testRoundTrip(t *testing.T, s store.Store) {
	ctx := context.Background()
	tests := map[string]func(r *store.Record){
		"every field set": func(*store.Record) {},
		"zero record but ID": func(r *store.Record) {
			*r = store.Record{ID: r.ID}
		},
		"exit code nil": func(r *store.Record) { r.ExitCode = nil },
		"exit code 0":   func(r *store.Record) { r.ExitCode = ptr[int32](0) },
		"exit code negative": func(r *store.Record) {
			r.ExitCode = ptr[int32](-1)
		},
		"result nil":    func(r *store.Record) { r.Result = nil },
		"result empty":  func(r *store.Record) { r.Result = []byte{} },
		"result binary": func(r *store.Record) { r.Result = []byte{0, 1, 2, 0xff, 0} },
		"task nil":      func(r *store.Record) { r.Task = nil },
		"task empty":    func(r *store.Record) { r.Task = []byte{} },
		"labels nil":    func(r *store.Record) { r.Labels = nil },
		"labels empty":  func(r *store.Record) { r.Labels = map[string]string{} },
		"labels with empty value, dots, slashes and unicode": func(r *store.Record) {
			r.Labels = map[string]string{"app.kubernetes.io/name": "x", "empty": "", "ünï": "cödé \"q\" <&>", "123": "456"}
		},
		"origin empty":   func(r *store.Record) { r.Origin = "" },
		"attempts nil":   func(r *store.Record) { r.Attempts = nil },
		"attempts empty": func(r *store.Record) { r.Attempts = []store.AttemptOutcome{} },
		"attempts with exit codes nil and 0 and zero times": func(r *store.Record) {
			r.Attempts = []store.AttemptOutcome{
				{Attempt: 0, Pod: "p0", ExitCode: nil},
				{Attempt: 1, Pod: "p1", ExitCode: ptr[int32](0), FinishedAt: base, ObservedAt: base.Add(time.Nanosecond)},
				{Attempt: 2, Pod: "p2", ExitCode: ptr[int32](2), Message: "unicode ✓ \"quoted\"\n", Retryable: true},
			}
		},
		"zero times": func(r *store.Record) {
			r.CancelledAt, r.NextAttemptAt = time.Time{}, time.Time{}
		},
		"times in UTC and at the Unix epoch": func(r *store.Record) {
			r.CancelledAt = time.Unix(0, 0).UTC()
			r.NextAttemptAt = time.Unix(1, 1).UTC()
		},
		"terminal": func(r *store.Record) { r.Terminal, r.Phase = true, "Succeeded" },
		"strings with quotes and unicode": func(r *store.Record) {
			r.Namespace, r.Name, r.Message = "ns'; DROP TABLE tasks; --", "näme", "line1\nline2\x00end"
		},
	}
	i := 0
	for name, mutate := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			// Through Create.
			in := Sample(fmt.Sprintf("rt-%02d", i))
			mutate(&in)
			got := mustCreate(t, s, in)
			if diff := cmp.Diff(in, got, ignoreStoreSet); diff != "" {
				t.Errorf("Create result (-in +got):\n%s", diff)
			}
			if diff := cmp.Diff(in, mustGet(t, s, in.ID), ignoreStoreSet); diff != "" {
				t.Errorf("Get after Create (-in +got):\n%s", diff)
			}
			// Through Update, from a record with every field set but the
			// nonce, which a write must carry as stored (or set on a
			// record without one).
			id := fmt.Sprintf("rt-upd-%02d", i)
			in = Sample(id)
			mutate(&in)
			from := Sample(id)
			from.Nonce = in.Nonce
			prev := mustCreate(t, s, from)
			in.ID, in.Version = id, prev.Version
			got, err := s.Update(ctx, in)
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			if diff := cmp.Diff(in, got, ignoreStoreSet); diff != "" {
				t.Errorf("Update result (-in +got):\n%s", diff)
			}
			if diff := cmp.Diff(in, mustGet(t, s, id), ignoreStoreSet); diff != "" {
				t.Errorf("Get after Update (-in +got):\n%s", diff)
			}
		})
	}
}

func testCancelledContext(t *testing.T, s store.Store) {
	rec := mustCreate(t, s, Sample("a"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := s.Create(ctx, Sample("b")); !errors.Is(err, context.Canceled) {
		t.Errorf("Create: err = %v, want context.Canceled", err)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, context.Canceled) {
		t.Errorf("Get: err = %v, want context.Canceled", err)
	}
	if _, err := s.Update(ctx, rec); !errors.Is(err, context.Canceled) {
		t.Errorf("Update: err = %v, want context.Canceled", err)
	}
	if _, err := s.List(ctx, store.ListOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("List: err = %v, want context.Canceled", err)
	}
	if diff := cmp.Diff(rec, mustGet(t, s, "a")); diff != "" {
		t.Errorf("calls with a cancelled context changed the record (-want +got):\n%s", diff)
	}
	if _, err := s.Get(context.Background(), "b"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Create with a cancelled context stored a record: Get err = %v", err)
	}
}

// testConcurrentWriters runs, round after round, writers that each update a
// record of their own beside racers that all update one shared record from
// the same version, all released at once: every own-record write succeeds
// and exactly one racer wins each round, the others get ErrConflict.
func testConcurrentWriters(t *testing.T, s store.Store) {
	const distinct, racers, rounds = 32, 32, 10
	ctx := context.Background()
	own := make([]store.Record, distinct)
	for i := range own {
		own[i] = mustCreate(t, s, Sample(fmt.Sprintf("own-%02d", i)))
	}
	shared := mustCreate(t, s, Sample("shared"))
	for round := range rounds {
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			wins      []store.Record
			conflicts int
			errs      []error
		)
		start := make(chan struct{})
		for i := range own {
			wg.Go(func() {
				rec := own[i].DeepCopy()
				rec.Message = fmt.Sprintf("round %d", round)
				<-start
				out, err := s.Update(ctx, rec)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					errs = append(errs, fmt.Errorf("own-%02d: %w", i, err))
				case out.Version != own[i].Version+1 || out.Message != rec.Message:
					errs = append(errs, fmt.Errorf("own-%02d: got version %d message %q, want %d %q",
						i, out.Version, out.Message, own[i].Version+1, rec.Message))
				default:
					own[i] = out
				}
			})
		}
		for r := range racers {
			wg.Go(func() {
				rec := shared.DeepCopy()
				rec.Message = fmt.Sprintf("round %d racer %d", round, r)
				<-start
				out, err := s.Update(ctx, rec)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins = append(wins, out)
				case errors.Is(err, store.ErrConflict):
					conflicts++
				default:
					errs = append(errs, fmt.Errorf("racer %d: %w", r, err))
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: %v", round, errors.Join(errs...))
		}
		if len(wins) != 1 || conflicts != racers-1 {
			t.Fatalf("round %d: %d racers won and %d got ErrConflict, want 1 and %d", round, len(wins), conflicts, racers-1)
		}
		if wins[0].Version != shared.Version+1 {
			t.Fatalf("round %d: winner's version %d, want %d", round, wins[0].Version, shared.Version+1)
		}
		shared = wins[0]
	}
	for _, want := range append(own, shared) {
		if diff := cmp.Diff(want, mustGet(t, s, want.ID)); diff != "" {
			t.Errorf("%s: stored record is not the last returned one (-returned +stored):\n%s", want.ID, diff)
		}
	}
}

// testMixedOutcomes releases at once writes whose outcomes differ (as a store
// that groups concurrent writes puts them in one transaction): updates that
// succeed beside stale and missing ones, two Creates of one new ID and a
// Create of an existing one. Each write gets its own outcome whatever the
// order, and a failing write changes nothing for the others.
func testMixedOutcomes(t *testing.T, s store.Store) {
	const n = 4
	ctx := context.Background()
	cur := make([]store.Record, n)   // at version 2
	stale := make([]store.Record, n) // at version 1
	for i := range n {
		stale[i] = mustCreate(t, s, Sample(fmt.Sprintf("upd-%d", i)))
		var err error
		if cur[i], err = s.Update(ctx, stale[i]); err != nil {
			t.Fatal(err)
		}
	}
	existing := mustCreate(t, s, Sample("existing"))

	type outcome struct {
		rec     store.Record
		created bool
		err     error
	}
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		mu    sync.Mutex
		got   = map[string]outcome{}
	)
	run := func(name string, call func() (store.Record, bool, error)) {
		wg.Go(func() {
			<-start
			rec, created, err := call()
			mu.Lock()
			defer mu.Unlock()
			got[name] = outcome{rec, created, err}
		})
	}
	update := func(rec store.Record) func() (store.Record, bool, error) {
		return func() (store.Record, bool, error) {
			out, err := s.Update(ctx, rec)
			return out, false, err
		}
	}
	create := func(rec store.Record) func() (store.Record, bool, error) {
		return func() (store.Record, bool, error) { return s.Create(ctx, rec) }
	}
	good := make([]store.Record, n)
	for i := range n {
		good[i] = cur[i].DeepCopy()
		good[i].Message = "good"
		run(fmt.Sprintf("good %d", i), update(good[i]))
		bad := stale[i].DeepCopy()
		bad.Message = "stale"
		run(fmt.Sprintf("stale %d", i), update(bad))
		ahead := cur[i].DeepCopy()
		ahead.Version += 5
		ahead.Message = "ahead"
		run(fmt.Sprintf("ahead %d", i), update(ahead))
		missing := Sample(fmt.Sprintf("missing-%d", i))
		missing.Version = 1
		run(fmt.Sprintf("missing %d", i), update(missing))
		for c := range 2 {
			rec := Sample(fmt.Sprintf("new-%d", i))
			rec.Message = fmt.Sprintf("creator %d", c)
			run(fmt.Sprintf("new %d creator %d", i, c), create(rec))
		}
		again := Sample("existing")
		again.Message = fmt.Sprintf("again %d", i)
		run(fmt.Sprintf("existing %d", i), create(again))
	}
	close(start)
	wg.Wait()

	for i := range n {
		g := got[fmt.Sprintf("good %d", i)]
		if g.err != nil {
			t.Errorf("good update %d: %v", i, g.err)
		} else if diff := cmp.Diff(good[i], g.rec, ignoreStoreSet); diff != "" || g.rec.Version != 3 {
			t.Errorf("good update %d: version %d, want 3; record (-want +got):\n%s", i, g.rec.Version, diff)
		}
		for _, name := range []string{"stale", "ahead"} {
			if err := got[fmt.Sprintf("%s %d", name, i)].err; !errors.Is(err, store.ErrConflict) {
				t.Errorf("%s update %d: err = %v, want ErrConflict", name, i, err)
			}
		}
		if err := got[fmt.Sprintf("missing %d", i)].err; !errors.Is(err, store.ErrNotFound) {
			t.Errorf("update of missing %d: err = %v, want ErrNotFound", i, err)
		}
		if diff := cmp.Diff(g.rec, mustGet(t, s, cur[i].ID)); g.err == nil && diff != "" {
			t.Errorf("upd-%d: stored record is not the good update's (-update +stored):\n%s", i, diff)
		}
		if _, err := s.Get(ctx, fmt.Sprintf("missing-%d", i)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("update of missing-%d created it: Get err = %v", i, err)
		}

		stored := mustGet(t, s, fmt.Sprintf("new-%d", i))
		creators := 0
		for c := range 2 {
			o := got[fmt.Sprintf("new %d creator %d", i, c)]
			if o.err != nil {
				t.Errorf("create new-%d by creator %d: %v", i, c, o.err)
				continue
			}
			if o.created {
				creators++
			}
			if diff := cmp.Diff(stored, o.rec); diff != "" {
				t.Errorf("create new-%d by creator %d returned a record other than the stored one (-stored +got):\n%s", i, c, diff)
			}
		}
		if creators != 1 {
			t.Errorf("new-%d: %d of 2 Creates created it, want 1", i, creators)
		}

		if o := got[fmt.Sprintf("existing %d", i)]; o.err != nil || o.created {
			t.Errorf("create of an existing ID %d: created %v, err %v; want false, nil", i, o.created, o.err)
		} else if diff := cmp.Diff(existing, o.rec); diff != "" {
			t.Errorf("create of an existing ID %d returned (-stored +got):\n%s", i, diff)
		}
	}
	if diff := cmp.Diff(existing, mustGet(t, s, "existing")); diff != "" {
		t.Errorf("Creates of an existing ID changed it (-before +after):\n%s", diff)
	}
}

// testCancelWhileWaiting updates records while each call's context is
// cancelled when a neighbouring writer's call returns, so cancellations land
// at arbitrary moments, also while a call waits for its write to commit: a
// call that returns nil applied its write, one that returns the context's
// error did not, and nothing else may happen (no half-applied write, no
// version skipped).
func testCancelWhileWaiting(t *testing.T, s store.Store) {
	const writers, perWriter = 16, 20
	ctx := context.Background()
	var (
		wg                 sync.WaitGroup
		applied, cancelled atomicCounter
		mu                 sync.Mutex
		inFlight           [writers]context.CancelFunc // each writer's current call
	)
	cancelNeighbour := func(w int) {
		mu.Lock()
		defer mu.Unlock()
		if c := inFlight[(w+1)%writers]; c != nil {
			c()
		}
	}
	errs := make(chan error, writers)
	for w := range writers {
		cur := mustCreate(t, s, Sample(fmt.Sprintf("w-%02d", w)))
		wg.Go(func() {
			for i := range perWriter {
				next := cur.DeepCopy()
				next.Message = fmt.Sprintf("write %d", i)
				callCtx, cancel := context.WithCancel(ctx)
				mu.Lock()
				inFlight[w] = cancel
				mu.Unlock()
				out, err := s.Update(callCtx, next)
				mu.Lock()
				inFlight[w] = nil
				mu.Unlock()
				cancel()
				cancelNeighbour(w)
				switch {
				case err == nil:
					if out.Version != cur.Version+1 || out.Message != next.Message {
						errs <- fmt.Errorf("%s: returned version %d message %q, want %d %q", cur.ID, out.Version, out.Message, cur.Version+1, next.Message)
						return
					}
					cur = out
					applied.add()
				case errors.Is(err, context.Canceled):
					cancelled.add()
				default:
					errs <- fmt.Errorf("%s: %w", cur.ID, err)
					return
				}
				stored, err := s.Get(ctx, cur.ID)
				if err != nil {
					errs <- err
					return
				}
				if diff := cmp.Diff(cur, stored); diff != "" {
					errs <- fmt.Errorf("%s after write %d: stored record differs from what the calls reported (-reported +stored):\n%s", cur.ID, i, diff)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d writes applied, %d cancelled", applied.get(), cancelled.get())
}

// testCloseWhileWriting closes the store while writers are busy: every call
// returns (with its result or an error), and calls after Close fail.
func testCloseWhileWriting(t *testing.T, s store.Store) {
	const writers = 16
	ctx := context.Background()
	var wg sync.WaitGroup
	var ok atomicCounter
	started := make(chan struct{}, writers)
	for w := range writers {
		cur := mustCreate(t, s, Sample(fmt.Sprintf("w-%02d", w)))
		wg.Go(func() {
			for i := 0; ; i++ {
				out, err := s.Update(ctx, cur)
				if err != nil {
					return
				}
				cur = out
				ok.add()
				if i == 0 {
					started <- struct{}{}
				}
			}
		})
	}
	for range writers {
		<-started
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	wg.Wait() // a call left hanging by Close hangs the test
	if _, err := s.Update(ctx, Sample("w-00")); err == nil {
		t.Errorf("Update after Close: err = nil")
	}
	if _, _, err := s.Create(ctx, Sample("after")); err == nil {
		t.Errorf("Create after Close: err = nil")
	}
	t.Logf("%d writes returned nil before Close", ok.get())
}

type atomicCounter struct {
	mu sync.Mutex
	n  int
}

func (c *atomicCounter) add() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *atomicCounter) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// testFence: BeginTerm raises each instance's epoch on its own; an Update
// whose Epoch is not its instance's current one is refused with ErrFenced and
// changes nothing; Epoch 0 is not fenced; the epoch is stored.
func testFence(t *testing.T, s store.Store) {
	ctx := context.Background()
	epoch := func(inst string) int64 {
		t.Helper()
		e, err := s.Epoch(ctx, inst)
		if err != nil {
			t.Fatalf("Epoch(%s): %v", inst, err)
		}
		return e
	}
	begin := func(inst string) int64 {
		t.Helper()
		e, err := s.BeginTerm(ctx, inst)
		if err != nil {
			t.Fatalf("BeginTerm(%s): %v", inst, err)
		}
		return e
	}
	if e := epoch("exec-a"); e != 0 {
		t.Errorf("Epoch before any term = %d, want 0", e)
	}
	if e := begin("exec-a"); e != 1 {
		t.Errorf("first BeginTerm = %d, want 1", e)
	}
	if e := begin("exec-b"); e != 1 {
		t.Errorf("first BeginTerm of another instance = %d, want 1", e)
	}
	cur := mustCreate(t, s, Sample("a")) // Executor exec-a
	cur.Epoch, cur.Phase = 1, "Running"
	cur, err := s.Update(ctx, cur)
	if err != nil {
		t.Fatalf("Update with the current epoch: %v", err)
	}
	if got := mustGet(t, s, "a"); got.Epoch != 1 {
		t.Errorf("stored epoch = %d, want 1", got.Epoch)
	}
	if e := begin("exec-a"); e != 2 {
		t.Errorf("second BeginTerm = %d, want 2", e)
	}
	if e := epoch("exec-a"); e != 2 {
		t.Errorf("Epoch = %d, want 2", e)
	}
	for _, stale := range []int64{1, 3} {
		w := cur
		w.Epoch, w.Phase = stale, "Failed"
		_, err := s.Update(ctx, w)
		if !errors.Is(err, store.ErrFenced) {
			t.Errorf("Update with epoch %d (current 2): err = %v, want ErrFenced", stale, err)
		}
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			t.Errorf("Update with epoch %d: err also matches ErrConflict or ErrNotFound: %v", stale, err)
		}
	}
	if diff := cmp.Diff(cur, mustGet(t, s, "a")); diff != "" {
		t.Errorf("a fenced Update changed the record (-want +got):\n%s", diff)
	}
	// Another instance's epoch does not fence exec-a's records: the record's
	// Executor names the instance.
	w := cur
	w.Epoch = 2
	if cur, err = s.Update(ctx, w); err != nil {
		t.Fatalf("Update with the new epoch: %v", err)
	}
	w = cur
	w.Epoch, w.Message = 0, "unfenced"
	if cur, err = s.Update(ctx, w); err != nil {
		t.Fatalf("unfenced Update: %v", err)
	}
	if cur.Epoch != 0 || mustGet(t, s, "a").Epoch != 0 {
		t.Errorf("an unfenced write stores epoch 0: got %d", mustGet(t, s, "a").Epoch)
	}
	// A record that moves to another instance is fenced by that instance's epoch.
	w = cur
	w.Executor, w.Epoch = "exec-b", 1
	if _, err := s.Update(ctx, w); err != nil {
		t.Errorf("Update moving the record to exec-b with exec-b's epoch: %v", err)
	}
}

// testFenceConcurrent: writers fenced with epoch 1 race with BeginTerm. Once
// BeginTerm has returned, no write with epoch 1 is applied, and every one
// applied before is visible: the record read right after BeginTerm is the
// record at the end.
func testFenceConcurrent(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.BeginTerm(ctx, "exec-a"); err != nil {
		t.Fatal(err)
	}
	const writers = 8
	for i := range writers {
		mustCreate(t, s, Sample(fmt.Sprintf("f-%d", i)))
	}
	var applied atomicCounter
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("f-%d", i)
			for n := 0; ; n++ {
				rec, err := s.Get(ctx, id)
				if err != nil {
					errs <- err
					return
				}
				rec.Epoch, rec.Message = 1, fmt.Sprint(n)
				switch _, err := s.Update(ctx, rec); {
				case err == nil:
					applied.add()
				case errors.Is(err, store.ErrFenced):
					return // the term is over for this writer
				default:
					errs <- err
					return
				}
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for applied.get() < 50 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // let the writers get going; not a synchronisation
	}
	if _, err := s.BeginTerm(ctx, "exec-a"); err != nil {
		t.Fatal(err)
	}
	after := make([]store.Record, writers)
	for i := range writers {
		after[i] = mustGet(t, s, fmt.Sprintf("f-%d", i))
	}
	wg.Wait() // each writer ends at its first fenced write
	close(errs)
	for err := range errs {
		t.Errorf("writer: %v", err)
	}
	for i := range writers {
		if diff := cmp.Diff(after[i], mustGet(t, s, fmt.Sprintf("f-%d", i))); diff != "" {
			t.Errorf("f-%d was written with the old epoch after BeginTerm returned (-at BeginTerm +end):\n%s", i, diff)
		}
	}
	if applied.get() == 0 {
		t.Error("no write was applied before BeginTerm: the race was not exercised")
	}
}
