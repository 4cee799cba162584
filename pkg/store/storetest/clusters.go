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

// RunClusters runs the conformance suite of many clusters
// (docs/multicluster.md) against the stores that open returns, which must
// implement store.Clusters: the cluster of a record and of each of its
// attempts round-trip through every write and read; List and Page filter
// by cluster; the clusters' rows are written by compare-and-swap (create,
// update, conflict, not found), refused with the field named when invalid,
// and listed by name; and Move places a task only while it has no pod, from
// the version and the record (nonce) it read, within its fence, so that of a claim and moves
// racing from one version exactly one write wins. open is called once per
// subtest and must return an empty store; RunClusters closes it.
func RunClusters(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"RecordClusterRoundTrip", testRecordClusterRoundTrip},
		{"ListFiltersByCluster", testListByCluster},
		{"PageFiltersByCluster", testPageByCluster},
		{"PutClusterCreateAndCompareAndSwap", testPutCluster},
		{"PutClusterRefusesInvalidRows", testPutClusterInvalid},
		{"PutClusterConcurrentOneWinner", testPutClusterConcurrent},
		{"ListClustersByName", testListClusters},
		{"MovePlacesTaskWithoutPod", testMove},
		{"MoveRefusals", testMoveRefusals},
		{"MoveFenced", testMoveFenced},
		{"MoveOfAnEarlierUseOfTheIDConflicts", testMoveIDUsedAgain},
		{"MoveRacesClaimOneWinner", testMoveRacesClaim},
	} {
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

func clustersOf(t *testing.T, s store.Store) store.Clusters {
	t.Helper()
	c, ok := s.(store.Clusters)
	if !ok {
		t.Fatalf("%T does not implement store.Clusters", s)
	}
	return c
}

// unplaced returns Sample(id) not placed yet and without a pod: what a
// submission of a many-cluster service stores.
func unplaced(id string) store.Record {
	rec := Sample(id)
	rec.Executor, rec.Cluster = "", ""
	rec.PodCreated, rec.PodUID, rec.PodEpoch = false, "", 0
	rec.Terminal = false
	return rec
}

// testRecordClusterRoundTrip: Record.Cluster and each AttemptOutcome.Cluster
// come back as written from Create, Update (a progress update that keeps
// the cluster, and one that changes it), Get, List and Page, and so does a
// lost attempt's discarded end.
func testRecordClusterRoundTrip(t *testing.T, s store.Store) {
	ctx := context.Background()
	in := Sample("a")
	in.Cluster = "east-1"
	in.Attempts = []store.AttemptOutcome{
		{Attempt: 0, Pod: "p0", Cluster: "west", Reason: "ClusterLost", FinishedAt: base,
			Discarded: &store.DiscardedEnd{ExitCode: ptr[int32](3), Reason: "Error", FinishedAt: base.Add(time.Minute), ObservedAt: base.Add(2 * time.Minute)}},
		{Attempt: 1, Pod: "p1", Cluster: "", FinishedAt: base.Add(time.Second), PodStopped: true},
		{Attempt: 2, Pod: "p2", Cluster: "east-1", ExitCode: ptr[int32](1)},
	}
	in.Attempt = 3
	cur := mustCreate(t, s, in)
	check := func(what string, want store.Record) {
		t.Helper()
		if diff := cmp.Diff(want, mustGet(t, s, "a")); diff != "" {
			t.Errorf("Get after %s (-want +got):\n%s", what, diff)
		}
		list, err := s.List(ctx, store.ListOptions{})
		if err != nil || len(list) != 1 {
			t.Fatalf("List after %s: %d records, %v", what, len(list), err)
		}
		if diff := cmp.Diff(want, list[0]); diff != "" {
			t.Errorf("List after %s (-want +got):\n%s", what, diff)
		}
		if p, ok := s.(store.Pager); ok {
			page, err := p.Page(ctx, store.PageOptions{})
			if err != nil || len(page.Records) != 1 {
				t.Fatalf("Page after %s: %d records, %v", what, len(page.Records), err)
			}
			if diff := cmp.Diff(want, page.Records[0]); diff != "" {
				t.Errorf("Page after %s (-want +got):\n%s", what, diff)
			}
		}
	}
	if diff := cmp.Diff(in, cur, ignoreStoreSet); diff != "" {
		t.Errorf("Create result (-in +got):\n%s", diff)
	}
	check("Create", cur)

	steps := []struct {
		name   string
		mutate func(r *store.Record)
	}{
		{"a progress update", func(r *store.Record) { r.Phase, r.Message = "Running", "progress" }},
		{"an update of the cluster", func(r *store.Record) { r.Cluster = "west" }},
		{"an update of an attempt's cluster", func(r *store.Record) { r.Attempts[1].Cluster = "north" }},
		{"an update to no cluster", func(r *store.Record) {
			r.Cluster = ""
			for i := range r.Attempts {
				r.Attempts[i].Cluster = ""
			}
		}},
		{"an update back to a cluster", func(r *store.Record) { r.Cluster = "east-1" }},
	}
	for _, st := range steps {
		next := cur.DeepCopy()
		st.mutate(&next)
		got, err := s.Update(ctx, next)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if diff := cmp.Diff(next, got, ignoreStoreSet); diff != "" {
			t.Errorf("%s: Update result (-in +got):\n%s", st.name, diff)
		}
		check(st.name, got)
		cur = got
	}
}

// clusterFixture is one record of the cluster filters' fixture.
type clusterFixture struct {
	id, namespace, executor, cluster string
	terminal                         bool
}

var clusterFixtures = []clusterFixture{
	{"c-07", "ns-a", "g-0-east", "east", false},
	{"c-01", "ns-b", "g-0-west", "west", true},
	{"c-10", "ns-a", "g-1-east", "east", true},
	{"c-02", "ns-a", "", "", false},
	{"c-05", "ns-b", "g-0-east", "east", false},
	{"c-03", "ns-a", "g-0-west", "west", false},
	{"c-09", "ns-b", "g-1-east", "east", false},
	{"c-04", "ns-a", "g-0", "", true},
	{"c-08", "ns-a", "g-0-east-2", "east-2", false},
	{"c-06", "ns-b", "g-1-east", "east", true},
}

// createClusterFixture creates clusterFixtures one by one (so CreatedAt
// follows their order) and returns the stored records.
func createClusterFixture(t *testing.T, s store.Store) []store.Record {
	t.Helper()
	var out []store.Record
	for _, f := range clusterFixtures {
		rec := Sample(f.id)
		rec.Namespace, rec.Executor, rec.Cluster, rec.Terminal = f.namespace, f.executor, f.cluster, f.terminal
		out = append(out, mustCreate(t, s, rec))
	}
	return out
}

func testListByCluster(t *testing.T, s store.Store) {
	ctx := context.Background()
	createClusterFixture(t, s)
	tests := map[string]struct {
		opts store.ListOptions
		want []string
	}{
		"cluster east":                   {store.ListOptions{Cluster: "east"}, []string{"c-05", "c-06", "c-07", "c-09", "c-10"}},
		"cluster west":                   {store.ListOptions{Cluster: "west"}, []string{"c-01", "c-03"}},
		"not a prefix":                   {store.ListOptions{Cluster: "east-2"}, []string{"c-08"}},
		"cluster east, non-terminal":     {store.ListOptions{Cluster: "east", NonTerminal: true}, []string{"c-05", "c-07", "c-09"}},
		"cluster east, executor":         {store.ListOptions{Cluster: "east", Executor: "g-1-east"}, []string{"c-06", "c-09", "c-10"}},
		"cluster east, executor, non-t.": {store.ListOptions{Cluster: "east", Executor: "g-1-east", NonTerminal: true}, []string{"c-09"}},
		"cluster and executor disagree":  {store.ListOptions{Cluster: "west", Executor: "g-0-east"}, nil},
		"unknown cluster":                {store.ListOptions{Cluster: "nowhere"}, nil},
		"no filter":                      {store.ListOptions{}, []string{"c-01", "c-02", "c-03", "c-04", "c-05", "c-06", "c-07", "c-08", "c-09", "c-10"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := s.List(ctx, tc.opts)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			if diff := cmp.Diff(tc.want, ids(got), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("List(%+v) IDs (-want +got):\n%s", tc.opts, diff)
			}
			for _, r := range got {
				if diff := cmp.Diff(mustGet(t, s, r.ID), r); diff != "" {
					t.Errorf("List record %s differs from Get (-get +list):\n%s", r.ID, diff)
				}
			}
		})
	}
}

func testPageByCluster(t *testing.T, s store.Store) {
	p := pagerOf(t, s)
	all := createClusterFixture(t, s)
	yes, no := true, false
	tests := map[string]struct {
		opts store.PageOptions
		want func(r store.Record) bool
	}{
		"cluster":               {store.PageOptions{Cluster: "east"}, func(r store.Record) bool { return r.Cluster == "east" }},
		"not a prefix":          {store.PageOptions{Cluster: "east-2"}, func(r store.Record) bool { return r.Cluster == "east-2" }},
		"unknown cluster":       {store.PageOptions{Cluster: "nowhere"}, func(store.Record) bool { return false }},
		"cluster, namespace":    {store.PageOptions{Cluster: "east", Namespace: "ns-b"}, func(r store.Record) bool { return r.Cluster == "east" && r.Namespace == "ns-b" }},
		"cluster, terminal":     {store.PageOptions{Cluster: "east", Terminal: &yes}, func(r store.Record) bool { return r.Cluster == "east" && r.Terminal }},
		"cluster, not terminal": {store.PageOptions{Cluster: "west", Terminal: &no}, func(r store.Record) bool { return r.Cluster == "west" && !r.Terminal }},
		"cluster, namespaces": {store.PageOptions{Cluster: "east", Namespaces: []string{"ns-a", "ns-c"}},
			func(r store.Record) bool { return r.Cluster == "east" && r.Namespace == "ns-a" }},
		"cluster, label":  {store.PageOptions{Cluster: "west", Labels: map[string]string{"app": "demo"}}, func(r store.Record) bool { return r.Cluster == "west" }},
		"cluster, prefix": {store.PageOptions{Cluster: "east", NamePrefix: "task-c-0"}, func(r store.Record) bool { return r.Cluster == "east" && r.ID != "c-10" }},
		"cluster, created after": {store.PageOptions{Cluster: "east", CreatedAfter: all[4].CreatedAt},
			func(r store.Record) bool { return r.Cluster == "east" && !r.CreatedAt.Before(all[4].CreatedAt) }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var want []store.Record
			for _, r := range all {
				if tc.want(r) {
					want = append(want, r)
				}
			}
			slices.SortFunc(want, func(a, b store.Record) int {
				if inPageOrder(a, b) {
					return -1
				}
				return 1
			})
			for _, limit := range []int{1, 2, 100} {
				got := pageAll(t, p, tc.opts, limit)
				if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
					t.Fatalf("limit %d: records (-want +got):\n%s", limit, diff)
				}
			}
		})
	}
	// A token belongs to its cluster filter.
	page, err := p.Page(context.Background(), store.PageOptions{Cluster: "east", Limit: 1})
	if err != nil || page.Continue == "" {
		t.Fatalf("first page of cluster east: %d records, token %q, %v", len(page.Records), page.Continue, err)
	}
	for _, other := range []string{"", "west"} {
		if _, err := p.Page(context.Background(), store.PageOptions{Cluster: other, Continue: page.Continue}); !errors.Is(err, store.ErrBadContinue) {
			t.Errorf("a token of cluster east used with cluster %q: %v, want ErrBadContinue", other, err)
		}
	}
}

// ignoreUpdatedAt leaves the store-set UpdatedAt out of a comparison of
// clusters.
var ignoreUpdatedAt = cmpopts.IgnoreFields(store.Cluster{}, "UpdatedAt")

func mustGetCluster(t *testing.T, c store.Clusters, name string) store.Cluster {
	t.Helper()
	got, err := c.GetCluster(context.Background(), name)
	if err != nil {
		t.Fatalf("GetCluster(%s): %v", name, err)
	}
	return got
}

func testPutCluster(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := clustersOf(t, s)
	before := time.Now()
	in := store.Cluster{Name: "east", State: store.ClusterReady, Labels: map[string]string{"region": "eu", "gpu": "a100"}}
	created, err := c.PutCluster(ctx, in)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if created.Version != 1 || created.Mode != store.ClusterPush || created.UpdatedAt.IsZero() || !created.Since.Equal(created.UpdatedAt) {
		t.Errorf("created: version %d, mode %q, updated %v, since %v; want 1, push, the store's clock, since = updated",
			created.Version, created.Mode, created.UpdatedAt, created.Since)
	}
	if created.UpdatedAt.Before(before.Add(-time.Hour)) || created.UpdatedAt.After(time.Now().Add(time.Hour)) {
		t.Errorf("UpdatedAt %v is not the store's clock (now %v)", created.UpdatedAt, time.Now())
	}
	want := in
	want.Mode, want.Version, want.Since = store.ClusterPush, 1, created.Since
	if diff := cmp.Diff(want, created, ignoreUpdatedAt); diff != "" {
		t.Errorf("create result (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(created, mustGetCluster(t, c, "east")); diff != "" {
		t.Errorf("GetCluster after create (-create +get):\n%s", diff)
	}
	// The caller's row and the returned one are the caller's own.
	in.Labels["region"], created.Labels["gpu"] = "scribbled", "scribbled"
	if got := mustGetCluster(t, c, "east"); got.Labels["region"] != "eu" || got.Labels["gpu"] != "a100" {
		t.Errorf("changing the written or returned labels changed the row: %v", got.Labels)
	}
	created = mustGetCluster(t, c, "east")

	// An update from the stored version: every field as given.
	since := base.Add(time.Hour)
	next := created.DeepCopy()
	next.State, next.Since, next.Reason, next.Message = store.ClusterUnreachable, since, "CredentialsRefused", "401 Unauthorized: «token expired»\n"
	next.Mode, next.Labels = store.ClusterAgent, map[string]string{}
	next.UpdatedAt = base // ignored
	updated, err := c.PutCluster(ctx, next)
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	want = next
	want.Version = 2
	if diff := cmp.Diff(want, updated, ignoreUpdatedAt); diff != "" {
		t.Errorf("update result (-want +got):\n%s", diff)
	}
	if updated.UpdatedAt.Equal(base) || updated.UpdatedAt.Before(created.UpdatedAt) {
		t.Errorf("UpdatedAt %v after %v: want the store's clock, not the caller's", updated.UpdatedAt, created.UpdatedAt)
	}
	if diff := cmp.Diff(updated, mustGetCluster(t, c, "east")); diff != "" {
		t.Errorf("GetCluster after update (-update +get):\n%s", diff)
	}
	if got := mustGetCluster(t, c, "east"); got.Labels == nil {
		t.Errorf("empty labels came back nil")
	}

	// Refusals, each changing nothing.
	stale := created.DeepCopy() // version 1
	stale.State = store.ClusterLost
	ahead := updated.DeepCopy()
	ahead.Version += 5
	again := store.Cluster{Name: "east", State: store.ClusterReady}
	missing := store.Cluster{Name: "west", State: store.ClusterReady, Version: 1}
	for _, tc := range []struct {
		name string
		c    store.Cluster
		want error
	}{
		{"a stale version", stale, store.ErrConflict},
		{"a version ahead", ahead, store.ErrConflict},
		{"a create of an existing row", again, store.ErrConflict},
		{"an update of a missing row", missing, store.ErrNotFound},
	} {
		_, err := c.PutCluster(ctx, tc.c)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "task record") {
			t.Errorf("%s: the error speaks of a task record: %v", tc.name, err)
		}
		if err != nil && !strings.Contains(err.Error(), tc.c.Name) {
			t.Errorf("%s: the error does not name the cluster %s: %v", tc.name, tc.c.Name, err)
		}
	}
	if diff := cmp.Diff(updated, mustGetCluster(t, c, "east")); diff != "" {
		t.Errorf("refused writes changed the row (-want +got):\n%s", diff)
	}
	if _, err := c.GetCluster(ctx, "west"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an update of a missing row created it: GetCluster = %v", err)
	}
	if _, err := c.GetCluster(ctx, "nowhere"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetCluster(missing): err = %v, want ErrNotFound", err)
	}
	if _, err := c.GetCluster(ctx, "Not A Name\x00\xff"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetCluster(invalid name): err = %v, want ErrNotFound", err)
	}

	// A row without labels keeps them nil; one created with a Since keeps it.
	plain, err := c.PutCluster(ctx, store.Cluster{Name: "north", State: store.ClusterDraining, Since: since, Mode: store.ClusterPush})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustGetCluster(t, c, "north"); got.Labels != nil || !got.Since.Equal(since) || got.Mode != store.ClusterPush {
		t.Errorf("north: labels %v (want nil), since %v (want %v), mode %q", got.Labels, got.Since, since, got.Mode)
	} else if diff := cmp.Diff(plain, got); diff != "" {
		t.Errorf("GetCluster(north) (-put +get):\n%s", diff)
	}
}

func testPutClusterInvalid(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := clustersOf(t, s)
	good := store.Cluster{Name: "east", State: store.ClusterReady}
	with := func(f func(*store.Cluster)) store.Cluster {
		cl := good
		f(&cl)
		return cl
	}
	tests := map[string]struct {
		c store.Cluster
		// words are what the error must say: the field and what it allows.
		words []string
	}{
		"empty name":           {with(func(c *store.Cluster) { c.Name = "" }), []string{"name", "a-z"}},
		"upper case":           {with(func(c *store.Cluster) { c.Name = "East" }), []string{"name", `"East"`, "a-z"}},
		"leading dash":         {with(func(c *store.Cluster) { c.Name = "-east" }), []string{"name", "a-z"}},
		"trailing dash":        {with(func(c *store.Cluster) { c.Name = "east-" }), []string{"name", "a-z"}},
		"underscore":           {with(func(c *store.Cluster) { c.Name = "east_1" }), []string{"name"}},
		"dot":                  {with(func(c *store.Cluster) { c.Name = "east.eu" }), []string{"name"}},
		"space":                {with(func(c *store.Cluster) { c.Name = "east 1" }), []string{"name"}},
		"unicode":              {with(func(c *store.Cluster) { c.Name = "öst" }), []string{"name"}},
		"NUL":                  {with(func(c *store.Cluster) { c.Name = "east\x00" }), []string{"name"}},
		"41 characters":        {with(func(c *store.Cluster) { c.Name = strings.Repeat("a", 41) }), []string{"name", "40"}},
		"empty state":          {with(func(c *store.Cluster) { c.State = "" }), []string{"state", "Ready", "Unreachable", "Draining", "Lost", "Returning"}},
		"state in lower case":  {with(func(c *store.Cluster) { c.State = "ready" }), []string{"state", `"ready"`, "Ready"}},
		"unknown state":        {with(func(c *store.Cluster) { c.State = "Up" }), []string{"state", "Ready"}},
		"mode in upper case":   {with(func(c *store.Cluster) { c.Mode = "Push" }), []string{"mode", `"Push"`, "push", "agent"}},
		"unknown mode":         {with(func(c *store.Cluster) { c.Mode = "pull" }), []string{"mode", "push", "agent"}},
		"negative version":     {with(func(c *store.Cluster) { c.Version = -1 }), []string{"version"}},
		"since out of range":   {with(func(c *store.Cluster) { c.Since = time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC) }), []string{"since"}},
		"bad name, bad state":  {with(func(c *store.Cluster) { c.Name, c.State = "East", "Up" }), []string{"name"}},
		"bad state, bad mode":  {with(func(c *store.Cluster) { c.State, c.Mode = "Up", "pull" }), []string{"state"}},
		"update with bad mode": {with(func(c *store.Cluster) { c.Version, c.Mode = 1, "pull" }), []string{"mode"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := c.PutCluster(ctx, tc.c)
			if !errors.Is(err, store.ErrInvalidCluster) {
				t.Fatalf("PutCluster(%+v): err = %v, want ErrInvalidCluster", tc.c, err)
			}
			for _, w := range tc.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q: %v", w, err)
				}
			}
		})
	}
	if list, err := c.ListClusters(ctx); err != nil || len(list) != 0 {
		t.Errorf("after refused writes: ListClusters = %v, %v; want none", list, err)
	}
	for _, name := range []string{"a", "0", "a-b", "a--b", "0east", strings.Repeat("z", store.MaxClusterNameLength), "eu-west-1"} {
		if _, err := c.PutCluster(ctx, store.Cluster{Name: name, State: store.ClusterReady}); err != nil {
			t.Errorf("PutCluster of valid name %q: %v", name, err)
		}
		if err := store.ValidateClusterName(name); err != nil {
			t.Errorf("ValidateClusterName(%q): %v", name, err)
		}
	}
	for _, st := range store.ClusterStates {
		for _, mode := range []store.ClusterMode{"", store.ClusterPush, store.ClusterAgent} {
			name := strings.ToLower(fmt.Sprintf("s-%s-m%s", st, mode))
			if _, err := c.PutCluster(ctx, store.Cluster{Name: name, State: st, Mode: mode}); err != nil {
				t.Errorf("PutCluster in state %s, mode %q: %v", st, mode, err)
			}
		}
	}
}

// testPutClusterConcurrent: writers race to update one row from the same
// version, round after round: exactly one wins each round, the others get
// ErrConflict; and of concurrent creates of one name, one creates it.
func testPutClusterConcurrent(t *testing.T, s store.Store) {
	const writers, rounds = 8, 10
	ctx := context.Background()
	c := clustersOf(t, s)
	race := func(write func(w int) (store.Cluster, error)) (wins []store.Cluster, conflicts int) {
		t.Helper()
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		start := make(chan struct{})
		for w := range writers {
			wg.Go(func() {
				<-start
				out, err := write(w)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins = append(wins, out)
				case errors.Is(err, store.ErrConflict):
					conflicts++
				default:
					errs = append(errs, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatal(errors.Join(errs...))
		}
		return wins, conflicts
	}
	wins, conflicts := race(func(w int) (store.Cluster, error) {
		return c.PutCluster(ctx, store.Cluster{Name: "east", State: store.ClusterReady, Reason: fmt.Sprint(w)})
	})
	if len(wins) != 1 || conflicts != writers-1 {
		t.Fatalf("creates: %d won, %d got ErrConflict; want 1 and %d", len(wins), conflicts, writers-1)
	}
	cur := wins[0]
	for round := range rounds {
		wins, conflicts := race(func(w int) (store.Cluster, error) {
			next := cur.DeepCopy()
			next.Message = fmt.Sprintf("round %d writer %d", round, w)
			return c.PutCluster(ctx, next)
		})
		if len(wins) != 1 || conflicts != writers-1 {
			t.Fatalf("round %d: %d won, %d got ErrConflict; want 1 and %d", round, len(wins), conflicts, writers-1)
		}
		if wins[0].Version != cur.Version+1 {
			t.Fatalf("round %d: the winner's version %d, want %d", round, wins[0].Version, cur.Version+1)
		}
		if diff := cmp.Diff(wins[0], mustGetCluster(t, c, "east")); diff != "" {
			t.Fatalf("round %d: the stored row is not the winner's (-winner +stored):\n%s", round, diff)
		}
		cur = wins[0]
	}
}

func testListClusters(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := clustersOf(t, s)
	if list, err := c.ListClusters(ctx); err != nil || len(list) != 0 {
		t.Fatalf("ListClusters of an empty store = %v, %v", list, err)
	}
	want := map[string]store.Cluster{}
	for i, name := range []string{"west", "east", "a-1", "zz", "east-2", "0-first", "east-10"} {
		cl, err := c.PutCluster(ctx, store.Cluster{Name: name, State: store.ClusterStates[i%len(store.ClusterStates)],
			Labels: map[string]string{"n": fmt.Sprint(i)}, Reason: "R" + fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		want[name] = cl
	}
	list, err := c.ListClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, cl := range list {
		names = append(names, cl.Name)
		if diff := cmp.Diff(want[cl.Name], cl); diff != "" {
			t.Errorf("ListClusters row %s (-put +list):\n%s", cl.Name, diff)
		}
	}
	if diff := cmp.Diff([]string{"0-first", "a-1", "east", "east-10", "east-2", "west", "zz"}, names); diff != "" {
		t.Errorf("ListClusters names, by name (-want +got):\n%s", diff)
	}
	list[0].Labels["n"] = "scribbled"
	if got := mustGetCluster(t, c, list[0].Name); got.Labels["n"] == "scribbled" {
		t.Errorf("changing ListClusters' output changed the row")
	}
}

// testMove: a task not placed moves to a cluster, and a placed one without a
// pod to another; each move writes the record as given with the new
// executor and cluster, from its version, and is unfenced (epoch 0) unless
// the caller's record says otherwise.
func testMove(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := clustersOf(t, s)
	cur := mustCreate(t, s, unplaced("a"))
	created := cur.CreatedAt
	for i, to := range []struct{ executor, cluster string }{
		{"g-0-east", "east"}, // placement
		{"g-0-west", "west"}, // a move of a placed task
		{"g-0-west", "west"}, // to where it is: a write like another
		{"g-0", ""},          // back to the one cluster of a single-cluster service
		{"g-3-east-2", "east-2"},
	} {
		in := cur.DeepCopy()
		in.Message = fmt.Sprintf("move %d", i)
		in.CreatedAt = base // ignored, as by Update
		got, err := c.Move(ctx, in, to.executor, to.cluster)
		if err != nil {
			t.Fatalf("move %d to %s (%q): %v", i, to.executor, to.cluster, err)
		}
		want := in.DeepCopy()
		want.Executor, want.Cluster = to.executor, to.cluster
		if diff := cmp.Diff(want, got, ignoreStoreSet); diff != "" {
			t.Errorf("move %d: result (-want +got):\n%s", i, diff)
		}
		if got.Version != cur.Version+1 || !got.CreatedAt.Equal(created) || got.UpdatedAt.Before(cur.UpdatedAt) || got.Epoch != 0 {
			t.Errorf("move %d: version %d (want %d), created %v (want %v), updated %v after %v, epoch %d (want 0)",
				i, got.Version, cur.Version+1, got.CreatedAt, created, got.UpdatedAt, cur.UpdatedAt, got.Epoch)
		}
		if diff := cmp.Diff(got, mustGet(t, s, "a")); diff != "" {
			t.Errorf("move %d: Get differs from the result (-move +get):\n%s", i, diff)
		}
		cur = got
	}
	// The moved task is where the filters look.
	list, err := s.List(ctx, store.ListOptions{Cluster: "east-2", Executor: "g-3-east-2", NonTerminal: true})
	if err != nil || len(list) != 1 || list[0].ID != "a" {
		t.Errorf("List of the new cluster and executor: %v, %v", ids(list), err)
	}
	if list, err := s.List(ctx, store.ListOptions{Cluster: "west"}); err != nil || len(list) != 0 {
		t.Errorf("List of the old cluster: %v, %v; want none", ids(list), err)
	}
	// Once it moved, its claim goes on as usual: an Update from the moved version.
	claim := cur.DeepCopy()
	claim.PodCreated, claim.PodUID = true, "uid-new"
	if _, err := s.Update(ctx, claim); err != nil {
		t.Errorf("the claim after the move: %v", err)
	}
	// Returned records are the caller's own.
	moved, err := c.Move(ctx, unplacedCreated(t, s, "b"), "g-0-east", "east")
	if err != nil {
		t.Fatal(err)
	}
	stored := mustGet(t, s, "b")
	moved.Labels["app"], moved.Attempts[0].Pod = "scribbled", "scribbled"
	if diff := cmp.Diff(stored, mustGet(t, s, "b")); diff != "" {
		t.Errorf("changing Move's output changed the stored record (-want +got):\n%s", diff)
	}
}

func unplacedCreated(t *testing.T, s store.Store, id string) store.Record {
	t.Helper()
	return mustCreate(t, s, unplaced(id))
}

// testMoveRefusals: a move from a stale version is ErrConflict, of a
// finished task or one whose attempt has a pod ErrClaimed, of a missing one
// ErrNotFound, to a cluster name that is not one ErrInvalidCluster; none of
// them writes, and a stale version is told before a claim.
func testMoveRefusals(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := clustersOf(t, s)

	placed := mustCreate(t, s, unplaced("placed"))
	placed.Executor, placed.Cluster = "g-0-east", "east"
	placed, err := s.Update(ctx, placed)
	if err != nil {
		t.Fatal(err)
	}
	stale := placed.DeepCopy()
	stale.Version--

	claimed := mustCreate(t, s, unplaced("claimed"))
	claimed.Executor, claimed.Cluster = "g-0-east", "east"
	claimed.PodCreated, claimed.PodUID, claimed.PodEpoch = true, "uid-1", 1
	if claimed, err = s.Update(ctx, claimed); err != nil {
		t.Fatal(err)
	}
	// The caller's copy says no pod, the stored record has one.
	claimedUnseen := claimed.DeepCopy()
	claimedUnseen.PodCreated, claimedUnseen.PodUID, claimedUnseen.PodEpoch = false, "", 0
	claimedStale := claimedUnseen.DeepCopy()
	claimedStale.Version--

	finished := mustCreate(t, s, unplaced("finished"))
	finished.Terminal, finished.Phase = true, "Succeeded"
	if finished, err = s.Update(ctx, finished); err != nil {
		t.Fatal(err)
	}
	finishedUnseen := finished.DeepCopy()
	finishedUnseen.Terminal = false

	missing := unplaced("missing")
	missing.Version = 1

	tests := []struct {
		name    string
		rec     store.Record
		cluster string
		want    error
		notWant []error
	}{
		{"a stale version", stale, "west", store.ErrConflict, []error{store.ErrClaimed, store.ErrNotFound}},
		{"a version ahead", func() store.Record { r := placed.DeepCopy(); r.Version += 3; return r }(), "west", store.ErrConflict, []error{store.ErrClaimed}},
		{"a stored pod", claimedUnseen, "west", store.ErrClaimed, []error{store.ErrConflict, store.ErrFenced}},
		{"a stored pod, from a stale version", claimedStale, "west", store.ErrConflict, []error{store.ErrClaimed}},
		{"a stored pod, as read", claimed, "west", store.ErrClaimed, []error{store.ErrConflict}},
		{"a finished task", finishedUnseen, "west", store.ErrClaimed, []error{store.ErrConflict}},
		{"a finished task, as read", finished, "west", store.ErrClaimed, []error{store.ErrConflict}},
		{"a missing task", missing, "west", store.ErrNotFound, []error{store.ErrConflict, store.ErrClaimed}},
		{"a cluster name that is not one", placed, "West", store.ErrInvalidCluster, []error{store.ErrConflict, store.ErrClaimed}},
		{"a cluster name too long", placed, strings.Repeat("w", 41), store.ErrInvalidCluster, nil},
	}
	before := map[string]store.Record{}
	for _, id := range []string{"placed", "claimed", "finished"} {
		before[id] = mustGet(t, s, id)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Move(ctx, tc.rec, "g-0-"+strings.ToLower(tc.cluster), tc.cluster)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Move: err = %v, want %v", err, tc.want)
			}
			for _, no := range tc.notWant {
				if errors.Is(err, no) {
					t.Errorf("Move: err also matches %v: %v", no, err)
				}
			}
			if !strings.Contains(err.Error(), tc.rec.ID) {
				t.Errorf("Move: the error does not name the task %s: %v", tc.rec.ID, err)
			}
			for id, want := range before {
				if diff := cmp.Diff(want, mustGet(t, s, id)); diff != "" {
					t.Errorf("a refused move changed %s (-before +after):\n%s", id, diff)
				}
			}
			if _, err := s.Get(ctx, "missing"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("a move of a missing task created it: Get = %v", err)
			}
		})
	}
	if t.Failed() {
		return
	}
	// A move that would write a pod or an end is refused too.
	for name, f := range map[string]func(*store.Record){
		"with a pod":  func(r *store.Record) { r.PodCreated, r.PodUID = true, "uid-x" },
		"as finished": func(r *store.Record) { r.Terminal = true },
	} {
		in := placed.DeepCopy()
		f(&in)
		if _, err := c.Move(ctx, in, "g-0-west", "west"); !errors.Is(err, store.ErrClaimed) {
			t.Errorf("a move that writes the record %s: err = %v, want ErrClaimed", name, err)
		}
	}
	if diff := cmp.Diff(before["placed"], mustGet(t, s, "placed")); diff != "" {
		t.Errorf("refused moves changed the record (-before +after):\n%s", diff)
	}
	// The record refused moves is still moved by a good one.
	if _, err := c.Move(ctx, placed, "g-0-west", "west"); err != nil {
		t.Errorf("a move from the stored version: %v", err)
	}
}

// testMoveFenced: a fenced move (Epoch not 0) applies only with the current
// epoch of the instance the record will name, as Update fences; a stale one
// is ErrFenced and writes nothing; an unfenced one is not fenced.
func testMoveFenced(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := clustersOf(t, s)
	for range 2 {
		if _, err := s.BeginTerm(ctx, "g-0-west"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.BeginTerm(ctx, "g-0-east"); err != nil { // epoch 1
		t.Fatal(err)
	}
	cur := mustCreate(t, s, unplaced("a"))
	for _, tc := range []struct {
		name  string
		epoch int64
	}{
		{"an older epoch of the destination", 1},
		{"a newer epoch than the destination's", 3},
		{"the source's epoch, not the destination's", 1},
	} {
		in := cur.DeepCopy()
		in.Executor, in.Epoch = "g-0-east", tc.epoch
		_, err := c.Move(ctx, in, "g-0-west", "west")
		if !errors.Is(err, store.ErrFenced) {
			t.Errorf("%s (%d, current 2): err = %v, want ErrFenced", tc.name, tc.epoch, err)
		}
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrClaimed) {
			t.Errorf("%s: err also matches ErrConflict or ErrClaimed: %v", tc.name, err)
		}
		if diff := cmp.Diff(cur, mustGet(t, s, "a")); diff != "" {
			t.Errorf("%s: a fenced move changed the record (-want +got):\n%s", tc.name, diff)
		}
	}
	in := cur.DeepCopy()
	in.Epoch = 2
	moved, err := c.Move(ctx, in, "g-0-west", "west")
	if err != nil {
		t.Fatalf("a move with the destination's current epoch: %v", err)
	}
	if got := mustGet(t, s, "a"); got.Epoch != 2 || got.Executor != "g-0-west" || got.Cluster != "west" {
		t.Errorf("stored: epoch %d, executor %s, cluster %q; want 2, g-0-west, west", got.Epoch, got.Executor, got.Cluster)
	}
	// A new term of the destination fences the moved record's writes of the
	// old term, whoever made them.
	if _, err := s.BeginTerm(ctx, "g-0-west"); err != nil {
		t.Fatal(err)
	}
	old := moved.DeepCopy()
	old.Message = "old term"
	if _, err := s.Update(ctx, old); !errors.Is(err, store.ErrFenced) {
		t.Errorf("an Update of the old term after the move: err = %v, want ErrFenced", err)
	}
	if _, err := c.Move(ctx, moved, "g-0-west", "west"); !errors.Is(err, store.ErrFenced) {
		t.Errorf("a move of the old term: err = %v, want ErrFenced", err)
	}
	// A claimed record is told as claimed before fenced.
	claimed := moved.DeepCopy()
	claimed.Epoch, claimed.PodCreated, claimed.PodUID = 3, true, "uid-1"
	if claimed, err = s.Update(ctx, claimed); err != nil {
		t.Fatal(err)
	}
	stalePod := claimed.DeepCopy()
	stalePod.PodCreated, stalePod.PodUID, stalePod.Epoch = false, "", 1
	if _, err := c.Move(ctx, stalePod, "g-0-west", "west"); !errors.Is(err, store.ErrClaimed) || errors.Is(err, store.ErrFenced) {
		t.Errorf("a fenced move of a claimed record: err = %v, want ErrClaimed only", err)
	}
	// An unfenced move is not fenced, and stores epoch 0.
	other := mustCreate(t, s, unplaced("b"))
	if got, err := c.Move(ctx, other, "g-0-west", "west"); err != nil || got.Epoch != 0 || mustGet(t, s, "b").Epoch != 0 {
		t.Errorf("an unfenced move: epoch %d, err %v; want 0, nil", got.Epoch, err)
	}
}

// testMoveIDUsedAgain: once retention deleted a finished record and its ID
// was used again, a move of a copy of the earlier record is ErrConflict
// (nothing written), also when the later record is at the copy's version;
// a record without a nonce (from before nonces) accepts a move that sets one.
func testMoveIDUsedAgain(t *testing.T, s store.Store) {
	c := clustersOf(t, s)
	ctx := context.Background()
	// placed creates the record x with nonce, and places it (version 2).
	placed := func(id, nonce string) store.Record {
		t.Helper()
		rec := unplaced(id)
		rec.Nonce = nonce
		cur, err := c.Move(ctx, mustCreate(t, s, rec), "g-0-east", "east")
		if err != nil {
			t.Fatalf("placement of the record with nonce %q: %v", nonce, err)
		}
		if cur.Version != 2 {
			t.Fatalf("version after the placement = %d, want 2", cur.Version)
		}
		return cur
	}

	old := placed("b", "")
	old.Nonce = "adopted"
	old, err := c.Move(ctx, old, "g-0-west", "west")
	if err != nil {
		t.Fatalf("a move setting the nonce of a record without one: %v", err)
	}
	if got := mustGet(t, s, "b"); got.Nonce != "adopted" {
		t.Errorf("stored nonce = %q, want %q", got.Nonce, "adopted")
	}
	other := old.DeepCopy()
	other.Nonce = "other"
	if _, err := c.Move(ctx, other, "g-0-east", "east"); !errors.Is(err, store.ErrConflict) {
		t.Errorf("a move with another nonce than the stored one: err = %v, want ErrConflict", err)
	}

	r, ok := s.(store.Retention)
	if !ok {
		return // an ID is never used again
	}
	earlier := placed("x", "first")
	done := earlier.DeepCopy()
	done.Terminal, done.Phase = true, "Succeeded"
	if _, err := s.Update(ctx, done); err != nil {
		t.Fatalf("Update to finished: %v", err)
	}
	if n, err := r.DeleteFinishedBefore(ctx, waitPast(t, time.Now()), 100); err != nil || n != 1 {
		t.Fatalf("DeleteFinishedBefore = %d, err %v; want the 1 finished task", n, err)
	}
	later := placed("x", "second")
	_, err = c.Move(ctx, earlier, "g-0-west", "west")
	if !errors.Is(err, store.ErrConflict) {
		t.Errorf("a move of the earlier record's copy: err = %v, want ErrConflict", err)
	}
	for _, no := range []error{store.ErrClaimed, store.ErrFenced, store.ErrNotFound} {
		if errors.Is(err, no) {
			t.Errorf("a move of the earlier record's copy: err also matches %v: %v", no, err)
		}
	}
	if err != nil && !strings.Contains(err.Error(), "another use of its ID") {
		t.Errorf("a move of the earlier record's copy: the error does not say the stored record is another use of its ID: %v", err)
	}
	if diff := cmp.Diff(later, mustGet(t, s, "x")); diff != "" {
		t.Errorf("the refused move changed the later record (-want +got):\n%s", diff)
	}
	if _, err := c.Move(ctx, later, "g-0-west", "west"); err != nil {
		t.Errorf("a move of the later record: %v", err)
	}
}

// testMoveRacesClaim: round after round, movers race to move one placed
// record to clusters of their own while its instance claims it (an Update
// with the pod, from the same version): exactly one write wins, every other
// gets ErrConflict, and the stored record is the winner's: if the claim
// won, no move applied; if a move won, the record is where it moved and has
// no pod.
func testMoveRacesClaim(t *testing.T, s store.Store) {
	const movers, rounds = 6, 20
	ctx := context.Background()
	c := clustersOf(t, s)
	claims := 0
	for round := range rounds {
		cur := mustCreate(t, s, unplaced(fmt.Sprintf("r-%02d", round)))
		cur.Executor, cur.Cluster = "g-0-east", "east"
		cur, err := s.Update(ctx, cur)
		if err != nil {
			t.Fatal(err)
		}
		type outcome struct {
			who string
			rec store.Record
			err error
		}
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			outcomes []outcome
		)
		start := make(chan struct{})
		report := func(who string, rec store.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			outcomes = append(outcomes, outcome{who, rec, err})
		}
		for m := range movers {
			wg.Go(func() {
				cluster := fmt.Sprintf("c-%d", m)
				<-start
				rec, err := c.Move(ctx, cur, "g-0-"+cluster, cluster)
				report(cluster, rec, err)
			})
		}
		wg.Go(func() {
			claim := cur.DeepCopy()
			claim.PodCreated, claim.PodUID, claim.Phase = true, fmt.Sprintf("uid-%d", round), "Pending"
			<-start
			rec, err := s.Update(ctx, claim)
			report("claim", rec, err)
		})
		close(start)
		wg.Wait()
		var wins []outcome
		for _, o := range outcomes {
			switch {
			case o.err == nil:
				wins = append(wins, o)
			case !errors.Is(o.err, store.ErrConflict):
				t.Errorf("round %d: %s: err = %v, want nil or ErrConflict", round, o.who, o.err)
			}
		}
		if len(wins) != 1 {
			t.Fatalf("round %d: %d writes won, want 1: %+v", round, len(wins), outcomes)
		}
		win := wins[0]
		stored := mustGet(t, s, cur.ID)
		if diff := cmp.Diff(win.rec, stored); diff != "" {
			t.Fatalf("round %d: the stored record is not the winner's (%s) (-winner +stored):\n%s", round, win.who, diff)
		}
		switch win.who {
		case "claim":
			claims++
			if stored.Executor != "g-0-east" || stored.Cluster != "east" || !stored.PodCreated {
				t.Errorf("round %d: the claim won, but the record is on %s (%s), pod %v", round, stored.Executor, stored.Cluster, stored.PodCreated)
			}
		default:
			if stored.Cluster != win.who || stored.Executor != "g-0-"+win.who || stored.PodCreated {
				t.Errorf("round %d: %s won, but the record is on %s (%s), pod %v", round, win.who, stored.Executor, stored.Cluster, stored.PodCreated)
			}
		}
		if stored.Version != cur.Version+1 {
			t.Errorf("round %d: version %d, want %d: more than one write applied", round, stored.Version, cur.Version+1)
		}
	}
	t.Logf("the claim won %d of %d rounds", claims, rounds)
}
