package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// fakeInstance is one cluster's executor as the router sees it: it stores
// the records it is given, naming itself, and counts the calls.
type fakeInstance struct {
	st                     store.Store
	instance, cluster      string
	submits, gets, cancels int
}

func (f *fakeInstance) SubmitCreated(ctx context.Context, id string, t *task.Task, _ ...executor.SubmitOption) (store.Record, bool, error) {
	f.submits++
	return f.st.Create(ctx, store.Record{ID: id, Namespace: t.Namespace, Name: t.Name, Executor: f.instance, Cluster: f.cluster, Phase: "Pending"})
}

func (f *fakeInstance) Get(ctx context.Context, id string) (store.Record, error) {
	f.gets++
	return f.st.Get(ctx, id)
}

func (f *fakeInstance) Cancel(context.Context, string, ...executor.CancelOption) error {
	f.cancels++
	return nil
}

func (f *fakeInstance) Healthy() error { return nil }

// clusterStore is a store that keeps clusters' rows.
type clusterStore interface {
	store.Store
	store.Clusters
}

func memoryWithClusters(t *testing.T) clusterStore {
	st, ok := store.NewMemory().(clusterStore)
	if !ok {
		t.Fatal("the memory store keeps no clusters")
	}
	return st
}

// TestRouterPlaces: a new task goes to the Ready cluster its placement
// allows with the most free slots, else to the shortest line; a placement
// no cluster meets is an invalid task (422) naming the field; no Ready
// cluster allowed is ErrUnavailable (503), with nothing stored; every
// other call goes to the instance the record names.
func TestRouterPlaces(t *testing.T) {
	eu := &metav1.LabelSelector{MatchLabels: map[string]string{"region": "eu"}}
	for name, tc := range map[string]struct {
		free      map[string]int
		states    map[string]store.ClusterState
		placement *task.Placement
		want      string // the cluster chosen; "" when refused
		err       error  // the refusal's kind
		errText   string
	}{
		"the most free slots":               {free: map[string]int{"east": 2, "west": 5}, want: "west"},
		"a tie goes to the first name":      {free: map[string]int{"east": 3, "west": 3}, want: "east"},
		"a named cluster":                   {free: map[string]int{"east": 0, "west": 5}, placement: &task.Placement{Cluster: "east"}, want: "east"},
		"a selector":                        {free: map[string]int{"east": 1, "west": 5}, placement: &task.Placement{ClusterSelector: eu}, want: "east"},
		"none free: the shortest line":      {free: map[string]int{"east": -4, "west": -1}, want: "west"},
		"never a draining cluster":          {free: map[string]int{"east": 1, "west": 9}, states: map[string]store.ClusterState{"west": store.ClusterDraining}, want: "east"},
		"an unknown cluster":                {placement: &task.Placement{Cluster: "north"}, err: executor.ErrInvalidTask, errText: `spec.placement.cluster "north" matches none of the clusters: east (region=eu), west (region=us)`},
		"a selector that matches none":      {placement: &task.Placement{ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gpu": "a100"}}}, err: executor.ErrInvalidTask, errText: "spec.placement.clusterSelector matches none"},
		"the only cluster allowed is lost":  {free: map[string]int{"east": 1, "west": 9}, placement: &task.Placement{Cluster: "west"}, states: map[string]store.ClusterState{"west": store.ClusterLost}, err: server.ErrUnavailable, errText: "east Ready, west Lost"},
		"every cluster unreachable or lost": {states: map[string]store.ClusterState{"east": store.ClusterUnreachable, "west": store.ClusterLost}, err: server.ErrUnavailable},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := memoryWithClusters(t)
			r := &router{st: st, rows: st, defaultNamespace: "default"}
			fakes := map[string]*fakeInstance{}
			for _, c := range []struct {
				name   string
				labels map[string]string
			}{{"east", map[string]string{"region": "eu"}}, {"west", map[string]string{"region": "us"}}} {
				f := &fakeInstance{st: st, instance: "kubetask-serve-" + c.name, cluster: c.name}
				fakes[c.name] = f
				free := tc.free[c.name]
				r.clusters = append(r.clusters, &clusterRun{name: c.name, labels: c.labels, instance: f.instance,
					run: &runner{api: f}, free: func(string) int { return free }})
			}
			if err := r.ensureRows(ctx); err != nil {
				t.Fatal(err)
			}
			for cl, state := range tc.states {
				row, err := st.GetCluster(ctx, cl)
				if err != nil {
					t.Fatal(err)
				}
				row.State, row.Since = state, metav1.Now().Time
				if _, err := st.PutCluster(ctx, row); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.refreshStates(ctx); err != nil { // as the router's check does every checkInterval
				t.Fatal(err)
			}
			tk := &task.Task{ObjectMeta: metav1.ObjectMeta{Name: "t"}}
			tk.Spec.Placement = tc.placement
			rec, created, err := r.SubmitCreated(ctx, "id-1", tk)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("SubmitCreated: %v; want %v with %q", err, tc.err, tc.errText)
				}
				if _, err := st.Get(ctx, "id-1"); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("a refused task was stored (%v)", err)
				}
				return
			}
			if err != nil || !created {
				t.Fatalf("SubmitCreated: %v, created %v", err, created)
			}
			if rec.Cluster != tc.want || fakes[tc.want].submits != 1 {
				t.Fatalf("placed on %q (submits east %d, west %d), want %q", rec.Cluster, fakes["east"].submits, fakes["west"].submits, tc.want)
			}
			// A retry of the ID finds the record where it is, whatever
			// the free slots say now.
			other := "east"
			if tc.want == "east" {
				other = "west"
			}
			if again, created, err := r.SubmitCreated(ctx, "id-1", tk); err != nil || created || again.Cluster != tc.want {
				t.Errorf("the retry: %v, created %v, on %q; want the record on %q", err, created, again.Cluster, tc.want)
			}
			if _, err := r.Get(ctx, "id-1"); err != nil {
				t.Fatal(err)
			}
			if err := r.Cancel(ctx, "id-1"); err != nil {
				t.Fatal(err)
			}
			if f := fakes[tc.want]; f.gets != 1 || f.cancels != 1 {
				t.Errorf("the placed cluster's instance: %d gets and %d cancels, want 1 each", f.gets, f.cancels)
			}
			if f := fakes[other]; f.gets != 0 || f.cancels != 0 {
				t.Errorf("the other cluster's instance: %d gets and %d cancels, want none", f.gets, f.cancels)
			}
		})
	}
}

// TestRouterWritesClusterRows: the configured clusters get Ready rows with
// their labels; a row that exists (an operator drained the cluster) is
// left as it is.
func TestRouterWritesClusterRows(t *testing.T) {
	ctx := context.Background()
	st := memoryWithClusters(t)
	if _, err := st.PutCluster(ctx, store.Cluster{Name: "west", State: store.ClusterDraining}); err != nil {
		t.Fatal(err)
	}
	r := &router{st: st, rows: st, clusters: []*clusterRun{{name: "east", labels: map[string]string{"region": "eu"}}, {name: "west"}}}
	for range 2 { // twice: a restart writes nothing new
		if err := r.ensureRows(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := st.ListClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Name != "east" || rows[0].State != store.ClusterReady || rows[0].Labels["region"] != "eu" || rows[0].Version != 1 ||
		rows[1].Name != "west" || rows[1].State != store.ClusterDraining || rows[1].Version != 1 {
		t.Errorf("rows %+v", rows)
	}
}

// TestRouterDrains: Ready to Draining and back, each idempotent; a
// drained cluster takes no new task; a Lost cluster is not the drain's to
// change (ErrClusterState), an unknown one ErrNotFound.
func TestRouterDrains(t *testing.T) {
	ctx := context.Background()
	st := memoryWithClusters(t)
	r := &router{st: st, rows: st, defaultNamespace: "default"}
	fakes := map[string]*fakeInstance{}
	for _, name := range []string{"east", "west"} {
		f := &fakeInstance{st: st, instance: "i-" + name, cluster: name}
		fakes[name] = f
		r.clusters = append(r.clusters, &clusterRun{name: name, instance: f.instance, run: &runner{api: f}, free: func(string) int { return 5 }})
	}
	if err := r.ensureRows(ctx); err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct {
		cluster  string
		draining bool
		state    string
		err      error
	}{
		{"east", true, "Draining", nil},
		{"east", true, "Draining", nil},
		{"east", false, "Ready", nil},
		{"east", false, "Ready", nil},
		{"east", true, "Draining", nil},
		{"north", true, "", store.ErrNotFound},
	} {
		c, err := r.Drain(ctx, step.cluster, step.draining)
		if !errors.Is(err, step.err) || err == nil && c.State != step.state {
			t.Fatalf("step %d: drain %s %v: %+v, %v; want %s, %v", i, step.cluster, step.draining, c, err, step.state, step.err)
		}
	}
	row, err := st.GetCluster(ctx, "east")
	if err != nil {
		t.Fatal(err)
	}
	if row.Version != 4 || row.Reason != "Drained" {
		t.Errorf("east's row: version %d, reason %q; want 4 writes (the first and three changes), Drained", row.Version, row.Reason)
	}
	for i := range 3 {
		rec, _, err := r.SubmitCreated(ctx, fmt.Sprintf("t%d", i), &task.Task{ObjectMeta: metav1.ObjectMeta{Name: "t"}})
		if err != nil || rec.Cluster != "west" {
			t.Fatalf("a task while east drains: on %q, %v; want west", rec.Cluster, err)
		}
	}
	list, err := r.ListClusters(ctx)
	if err != nil || len(list) != 2 || list[0].State != "Draining" || list[1].State != "Ready" {
		t.Errorf("ListClusters: %+v, %v", list, err)
	}
	west, err := st.GetCluster(ctx, "west")
	if err != nil {
		t.Fatal(err)
	}
	west.State, west.Since = store.ClusterLost, time.Now()
	if _, err := st.PutCluster(ctx, west); err != nil {
		t.Fatal(err)
	}
	for _, draining := range []bool{true, false} {
		if _, err := r.Drain(ctx, "west", draining); !errors.Is(err, server.ErrClusterState) || !strings.Contains(err.Error(), "cluster west is Lost") {
			t.Errorf("drain a lost cluster (%v): %v", draining, err)
		}
	}
}

// TestRouterLoses: declaring east lost marks its row Lost, begins a new
// term of its instance (a write of the old term is refused), ends the
// attempt of a task with a pod there Failed/ClusterLost and places the
// next attempt on west, moves a task without a pod to west, leaves a
// finished task and west's tasks alone, and leaves unplaced a task that
// may run on east only. A second declaration changes nothing more.
func TestRouterLoses(t *testing.T) {
	ctx := context.Background()
	st := memoryWithClusters(t)
	var events []executor.Event
	r := &router{st: st, rows: st, defaultNamespace: "default", publish: func(ev executor.Event) { events = append(events, ev) }}
	resynced := map[string][]string{}
	for _, name := range []string{"east", "west"} {
		f := &fakeInstance{st: st, instance: "i-" + name, cluster: name}
		r.clusters = append(r.clusters, &clusterRun{name: name, instance: f.instance, run: &runner{api: f},
			free: func(string) int { return 5 }, resync: func(id string) { resynced[name] = append(resynced[name], id) }})
	}
	if err := r.ensureRows(ctx); err != nil {
		t.Fatal(err)
	}
	oldTerm, err := st.BeginTerm(ctx, "i-east")
	if err != nil {
		t.Fatal(err)
	}
	doc := func(p *task.Placement) []byte {
		tk := &task.Task{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "default"}}
		tk.Spec.Placement = p
		b, err := json.Marshal(tk)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, rec := range []store.Record{
		{ID: "running", Executor: "i-east", Cluster: "east", PodCreated: true, PodUID: "u-1", Phase: "Running", Task: doc(nil)},
		{ID: "waiting", Executor: "i-east", Cluster: "east", Phase: "Pending", Task: doc(nil)},
		{ID: "east-only", Executor: "i-east", Cluster: "east", PodCreated: true, PodUID: "u-2", Phase: "Running", Task: doc(&task.Placement{Cluster: "east"})},
		{ID: "done", Executor: "i-east", Cluster: "east", Phase: "Succeeded", Terminal: true, Task: doc(nil)},
		{ID: "on-west", Executor: "i-west", Cluster: "west", PodCreated: true, PodUID: "u-3", Phase: "Running", Task: doc(nil)},
	} {
		rec.Namespace, rec.Name, rec.Nonce = "default", "t", "n-"+rec.ID
		if _, _, err := st.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	c, err := r.Lose(ctx, "east")
	if err != nil {
		t.Fatal(err)
	}
	if c.State != "Lost" || !strings.Contains(c.Message, "2 attempts lost, 1 tasks moved, 1 placed") {
		t.Errorf("Lose: %+v", c)
	}
	get := func(id string) store.Record {
		rec, err := st.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	if rec := get("running"); rec.Executor != "i-west" || rec.Cluster != "west" || rec.Attempt != 1 || len(rec.Attempts) != 1 ||
		rec.Attempts[0].Reason != "ClusterLost" || rec.Attempts[0].Cluster != "east" || rec.Attempts[0].PodUID != "u-1" {
		t.Errorf("the running task: on %s/%s, attempt %d, outcomes %+v; want attempt 0 lost on east, attempt 1 on west", rec.Executor, rec.Cluster, rec.Attempt, rec.Attempts)
	}
	if rec := get("waiting"); rec.Executor != "i-west" || rec.Cluster != "west" || rec.Attempt != 0 || len(rec.Attempts) != 0 {
		t.Errorf("the waiting task: on %s/%s, attempt %d; want moved to west, attempt 0", rec.Executor, rec.Cluster, rec.Attempt)
	}
	if rec := get("east-only"); rec.Executor != "" || rec.Cluster != "" || rec.Attempt != 1 || rec.Reason != "ClusterLost" {
		t.Errorf("the east-only task: on %q/%q, attempt %d, %s; want unplaced, attempt 1, ClusterLost", rec.Executor, rec.Cluster, rec.Attempt, rec.Reason)
	}
	if rec := get("done"); rec.Version != 1 {
		t.Errorf("the finished task was written (version %d)", rec.Version)
	}
	if rec := get("on-west"); rec.Version != 1 {
		t.Errorf("west's task was written (version %d)", rec.Version)
	}
	if got := resynced["west"]; !slices.Equal(slices.Sorted(slices.Values(got)), []string{"running", "waiting"}) {
		t.Errorf("west's executor told of %v, want running and waiting", got)
	}
	// The watches hear of each lost attempt: no executor tells them.
	var lostEvents []string
	for _, ev := range events {
		if ev.Type == executor.EventAttemptFinished && ev.Reason == "ClusterLost" && ev.Cluster == "east" && ev.Attempt == 0 && ev.Phase == "Failed" && !ev.Terminal {
			lostEvents = append(lostEvents, ev.ID)
		}
	}
	if slices.Sort(lostEvents); !slices.Equal(lostEvents, []string{"east-only", "running"}) || len(events) != 2 {
		t.Errorf("events %+v; want one AttemptFinished ClusterLost on east for running and east-only", events)
	}
	stale := get("on-west")
	stale.Executor, stale.Cluster, stale.Epoch = "i-east", "east", oldTerm
	if _, err := st.Update(ctx, stale); !errors.Is(err, store.ErrFenced) {
		t.Errorf("a write of east's term from before the declaration: %v, want ErrFenced", err)
	}
	if c, err := r.Lose(ctx, "east"); err != nil || !strings.Contains(c.Message, "0 attempts lost, 0 tasks moved, 0 placed") {
		t.Errorf("a second declaration: %+v, %v", c, err)
	}
	if _, err := r.Drain(ctx, "east", false); !errors.Is(err, server.ErrClusterState) {
		t.Errorf("resume a lost cluster: %v, want ErrClusterState", err)
	}
}

// TestRouterMarksUnconfiguredClusters: a cluster the store has a row of,
// but the configuration no longer names (the service restarted without it
// while it ran tasks), is Unreachable with reason NotConfigured once the
// rows are ensured; it is listed; its task shows ClusterUnreachable and
// why, and keeps its state (nothing written) until an operator declares the
// cluster lost, which works without its client: the running attempt ends
// ClusterLost and runs again on the configured cluster, the waiting task
// moves there. A Lost cluster stays Lost.
func TestRouterMarksUnconfiguredClusters(t *testing.T) {
	ctx := context.Background()
	st := memoryWithClusters(t)
	for _, row := range []store.Cluster{
		{Name: "west", State: store.ClusterReady, Labels: map[string]string{"region": "us"}},
		{Name: "north", State: store.ClusterLost, Reason: "DeclaredLost"},
	} {
		if _, err := st.PutCluster(ctx, row); err != nil {
			t.Fatal(err)
		}
	}
	r := &router{st: st, rows: st, instanceID: "i", defaultNamespace: "default", log: quietLog()}
	resynced := map[string][]string{}
	f := &fakeInstance{st: st, instance: "i-east", cluster: "east"}
	r.clusters = append(r.clusters, &clusterRun{name: "east", instance: f.instance, run: &runner{api: f},
		free: func(string) int { return 5 }, resync: func(id string) { resynced["east"] = append(resynced["east"], id) }})
	for _, rec := range []store.Record{
		{ID: "running", Executor: "i-west", Cluster: "west", PodCreated: true, PodUID: "u-1", Phase: "Running", Task: []byte(`{"metadata":{"name":"t"}}`)},
		{ID: "waiting", Executor: "i-west", Cluster: "west", Phase: "Pending", Task: []byte(`{"metadata":{"name":"t"}}`)},
	} {
		rec.Namespace, rec.Name, rec.Nonce = "default", "t", "n-"+rec.ID
		if _, _, err := st.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.ensureRows(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := r.ListClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, c := range list {
		states[c.Name] = c.State + "/" + c.Reason
	}
	if want := map[string]string{"east": "Ready/", "west": "Unreachable/NotConfigured", "north": "Lost/DeclaredLost"}; !maps.Equal(states, want) {
		t.Errorf("clusters %v, want %v", states, want)
	}
	got, err := r.Get(ctx, "running")
	if err != nil {
		t.Fatal(err)
	}
	if got.Reason != "ClusterUnreachable" || got.Version != 1 || !strings.Contains(got.Message, "cluster west is not in the service's configuration since") ||
		!strings.Contains(got.Message, "kubetask clusters lose west --yes") {
		t.Errorf("the task on west: %s (%s), version %d", got.Reason, got.Message, got.Version)
	}
	if err := r.ensureRows(ctx); err != nil { // a second start: no new write
		t.Fatal(err)
	}
	if row, err := st.GetCluster(ctx, "west"); err != nil || row.Version != 2 {
		t.Errorf("west's row after a second start: %+v, %v; want version 2 (one marking)", row, err)
	}
	c, err := r.Lose(ctx, "west")
	if err != nil {
		t.Fatal(err)
	}
	if c.State != "Lost" || !strings.Contains(c.Message, "1 attempts lost, 1 tasks moved") {
		t.Errorf("Lose west: %+v", c)
	}
	for id, want := range map[string]int{"running": 1, "waiting": 0} {
		rec, err := st.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Executor != "i-east" || rec.Cluster != "east" || rec.Attempt != want {
			t.Errorf("%s after west was declared lost: on %s/%s, attempt %d; want on east, attempt %d", id, rec.Executor, rec.Cluster, rec.Attempt, want)
		}
	}
	if _, err := r.Lose(ctx, "south"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("lose a cluster with no row: %v, want ErrNotFound", err)
	}
}

// TestRouterNamesRefusedCredentials: a quiet cluster whose API server
// refuses the service's credentials when asked (401 or 403) is
// Unreachable with reason CredentialsRefused, and says the refusal; one
// that does not answer the question either is NotAnswering.
func TestRouterNamesRefusedCredentials(t *testing.T) {
	for name, tc := range map[string]struct {
		probe      error
		wantReason string
	}{
		"forbidden":    {apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("RBAC: no binding")), "CredentialsRefused"},
		"unauthorized": {apierrors.NewUnauthorized("token expired"), "CredentialsRefused"},
		"silent":       {context.DeadlineExceeded, "NotAnswering"},
		"a 404":        {apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "data"), "NotAnswering"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := memoryWithClusters(t)
			r := &router{st: st, rows: st, defaultNamespace: "default", log: quietLog(), unreachableAfter: 30 * time.Second}
			probed := 0
			f := &fakeInstance{st: st, instance: "i-east", cluster: "east"}
			r.clusters = append(r.clusters, &clusterRun{name: "east", instance: f.instance,
				run:   &runner{api: f, ready: func() error { return errors.New("no lease") }},
				free:  func(string) int { return 5 },
				probe: func(context.Context) error { probed++; return tc.probe }})
			if err := r.ensureRows(ctx); err != nil {
				t.Fatal(err)
			}
			t0 := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
			for _, at := range []time.Duration{0, 10 * time.Second, 30 * time.Second} {
				if err := r.checkClusters(ctx, t0.Add(at)); err != nil {
					t.Fatal(err)
				}
			}
			row, err := st.GetCluster(ctx, "east")
			if err != nil {
				t.Fatal(err)
			}
			if row.State != store.ClusterUnreachable || row.Reason != tc.wantReason {
				t.Errorf("east: %s/%s (%s), want Unreachable/%s", row.State, row.Reason, row.Message, tc.wantReason)
			}
			if tc.wantReason == "CredentialsRefused" && !strings.Contains(row.Message, tc.probe.Error()) {
				t.Errorf("the message does not say the refusal %q: %s", tc.probe, row.Message)
			}
			if probed != 1 {
				t.Errorf("asked the API server %d times, want once (only when the quiet reached unreachableAfter)", probed)
			}
		})
	}
}

// TestRouterChecksClusters: a cluster whose instance stops answering is
// Unreachable after unreachableAfter, its tasks without a pod move to the
// other cluster (those with one stay), and it is Ready again once it
// answers; a lost cluster that answers is Returning until its instance
// shows no stranded pod, then Ready.
func TestRouterChecksClusters(t *testing.T) {
	ctx := context.Background()
	st := memoryWithClusters(t)
	var events []executor.Event
	r := &router{st: st, rows: st, defaultNamespace: "default", log: quietLog(), unreachableAfter: 30 * time.Second,
		publish: func(ev executor.Event) { events = append(events, ev) }}
	answers := map[string]bool{"east": true, "west": true}
	stranded := 0
	resynced := map[string][]string{}
	r.clusters = answering(st, answers, resynced)
	for _, c := range r.clusters {
		c.stranded = func(context.Context) (int, error) { return stranded, nil }
	}
	if err := r.ensureRows(ctx); err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(&task.Task{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "default"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []store.Record{
		{ID: "waiting", Executor: "i-east", Cluster: "east", Phase: "Pending"},
		{ID: "running", Executor: "i-east", Cluster: "east", PodCreated: true, PodUID: "u", Phase: "Running"},
	} {
		rec.Namespace, rec.Name, rec.Nonce, rec.Task = "default", "t", "n-"+rec.ID, doc
		if _, _, err := st.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	state := func(name string) store.ClusterState {
		t.Helper()
		row, err := st.GetCluster(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return row.State
	}
	t0 := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	check := func(at time.Duration, want store.ClusterState) {
		t.Helper()
		if err := r.checkClusters(ctx, t0.Add(at)); err != nil {
			t.Fatal(err)
		}
		if got := state("east"); got != want {
			t.Fatalf("at %s: east is %s, want %s", at, got, want)
		}
	}
	check(0, store.ClusterReady)
	answers["east"] = false
	check(time.Second, store.ClusterReady)
	check(30*time.Second, store.ClusterReady) // quiet for 29 s
	if rec, _ := st.Get(ctx, "waiting"); rec.Executor != "i-east" {
		t.Fatalf("a task moved while east was still Ready: %s", rec.Executor)
	}
	if len(events) != 0 {
		t.Errorf("events while east was Ready: %+v", events)
	}
	check(31*time.Second, store.ClusterUnreachable)
	// The watches hear that the task that stays shows ClusterUnreachable
	// (the one moved to west is west's to tell of).
	if len(events) != 1 || events[0].ID != "running" || events[0].Type != executor.EventState || events[0].Reason != "ClusterUnreachable" ||
		events[0].Phase != "Running" || events[0].Cluster != "east" {
		t.Errorf("events once east is Unreachable: %+v; want a State event of running, Running/ClusterUnreachable on east", events)
	}
	events = nil
	if rec, _ := st.Get(ctx, "waiting"); rec.Executor != "i-west" || rec.Cluster != "west" || !slices.Equal(resynced["west"], []string{"waiting"}) {
		t.Errorf("the task without a pod: on %s/%s, west told of %v; want moved to west", rec.Executor, rec.Cluster, resynced["west"])
	}
	if rec, _ := st.Get(ctx, "running"); rec.Executor != "i-east" {
		t.Errorf("the task with a pod moved to %s: its pod may still run on east", rec.Executor)
	}
	shown, err := r.Get(ctx, "running")
	if err != nil {
		t.Fatal(err)
	}
	if stored, _ := st.Get(ctx, "running"); shown.Reason != "ClusterUnreachable" || !strings.Contains(shown.Message, "cluster east has not answered since") ||
		!strings.Contains(shown.Message, "Running/") || stored.Reason == "ClusterUnreachable" || shown.Phase != "Running" {
		t.Errorf("Get of the task on the unreachable cluster: %s/%s %q (stored %s); want Running/ClusterUnreachable, saying since when, not stored", shown.Phase, shown.Reason, shown.Message, stored.Reason)
	}
	if state("west") != store.ClusterReady {
		t.Errorf("west is %s", state("west"))
	}
	answers["east"] = true
	check(40*time.Second, store.ClusterReady)
	if len(events) != 1 || events[0].ID != "running" || events[0].Reason == "ClusterUnreachable" || events[0].Phase != "Running" {
		t.Errorf("events once east answers: %+v; want a State event of running as its executor has it", events)
	}
	if shown, err := r.Get(ctx, "running"); err != nil || shown.Reason == "ClusterUnreachable" {
		t.Errorf("Get once east answers: %s, %v", shown.Reason, err)
	}

	row, err := st.GetCluster(ctx, "east")
	if err != nil {
		t.Fatal(err)
	}
	row.State, row.Since = store.ClusterLost, t0
	if _, err := st.PutCluster(ctx, row); err != nil {
		t.Fatal(err)
	}
	answers["east"] = false
	check(time.Minute, store.ClusterLost)
	answers["east"], stranded = true, 2
	check(2*time.Minute, store.ClusterReturning)
	check(3*time.Minute, store.ClusterReturning)
	stranded = 0
	check(4*time.Minute, store.ClusterReady)
}

// TestRouterRebalances: a cluster with free slots takes the tasks waiting
// in another's line that the line's slot plan would start first, within
// its room for each namespace: not a task whose placement names the other
// cluster, not one whose pod is claimed, nothing from an Unreachable
// cluster's line (moveQuiet's) or into a Draining one; both executors are
// told of each move.
func TestRouterRebalances(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		westFree  map[string]int // by namespace; "" the executor's
		westState store.ClusterState
		eastState store.ClusterState
		want      []string // moved to west
	}{
		"west's free slots to the head of east's line":       {westFree: map[string]int{"": 2, "a": 2, "b": 2}, want: []string{"a1", "b1"}},
		"as many as west has":                                {westFree: map[string]int{"": 1, "a": 1, "b": 1}, want: []string{"a1"}},
		"a namespace west has no room for stays":             {westFree: map[string]int{"": 5, "a": 0, "b": 5}, want: []string{"b1"}},
		"every movable one, past the pinned and the claimed": {westFree: map[string]int{"": 9, "a": 9, "b": 9}, want: []string{"a1", "b1", "a2"}},
		"none to a Draining cluster":                         {westFree: map[string]int{"": 5, "a": 5, "b": 5}, westState: store.ClusterDraining},
		"a Draining cluster's line empties":                  {westFree: map[string]int{"": 5, "a": 5, "b": 5}, eastState: store.ClusterDraining, want: []string{"a1", "b1", "a2"}},
		"none from an Unreachable cluster":                   {westFree: map[string]int{"": 5, "a": 5, "b": 5}, eastState: store.ClusterUnreachable},
		"no free slot":                                       {westFree: map[string]int{"": 0, "a": 5, "b": 5}},
	} {
		t.Run(name, func(t *testing.T) {
			st := memoryWithClusters(t)
			r := &router{st: st, rows: st, defaultNamespace: "default", log: quietLog(), unreachableAfter: 30 * time.Second}
			resynced := map[string][]string{}
			// East's line, in its slot plan's order; NextInLine honours
			// room and n as the executor's does.
			line := []string{"pinned", "a1", "claimed", "b1", "a2"}
			nsOf := map[string]string{"pinned": "a", "a1": "a", "claimed": "b", "b1": "b", "a2": "a"}
			for _, name := range []string{"east", "west"} {
				f := &fakeInstance{st: st, instance: "i-" + name, cluster: name}
				c := &clusterRun{name: name, instance: f.instance, run: &runner{api: f, ready: func() error { return nil }},
					resync: func(id string) { resynced[name] = append(resynced[name], id) }}
				if name == "west" {
					c.free = func(ns string) int { return tc.westFree[ns] }
				} else {
					c.free = func(string) int { return 0 }
					c.nextInLine = func(n int, room func(string) int, skip func(string) bool) []string {
						var out []string
						used := map[string]int{}
						for _, id := range line {
							if len(out) == n {
								break
							}
							if rec, err := st.Get(ctx, id); err == nil && rec.Executor == "i-east" && !rec.PodCreated && !skip(id) && used[nsOf[id]] < room(nsOf[id]) {
								used[nsOf[id]]++
								out = append(out, id)
							}
						}
						return out
					}
				}
				r.clusters = append(r.clusters, c)
			}
			if err := r.ensureRows(ctx); err != nil {
				t.Fatal(err)
			}
			for cl, state := range map[string]store.ClusterState{"east": tc.eastState, "west": tc.westState} {
				if state == "" {
					continue
				}
				row, err := st.GetCluster(ctx, cl)
				if err != nil {
					t.Fatal(err)
				}
				row.State = state
				if _, err := st.PutCluster(ctx, row); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.refreshStates(ctx); err != nil {
				t.Fatal(err)
			}
			for _, id := range line {
				tk := &task.Task{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: nsOf[id]}}
				if id == "pinned" {
					tk.Spec.Placement = &task.Placement{Cluster: "east"}
				}
				doc, err := json.Marshal(tk)
				if err != nil {
					t.Fatal(err)
				}
				rec := store.Record{ID: id, Namespace: nsOf[id], Name: id, Nonce: "n-" + id, Task: doc, Executor: "i-east", Cluster: "east", Phase: "Pending", Reason: "WaitingForSlot"}
				if id == "claimed" {
					rec.PodCreated, rec.PodUID = true, "u"
				}
				if _, _, err := st.Create(ctx, rec); err != nil {
					t.Fatal(err)
				}
			}
			n, err := r.rebalance(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var moved []string
			for _, id := range line {
				if rec, _ := st.Get(ctx, id); rec.Executor == "i-west" && rec.Cluster == "west" {
					moved = append(moved, id)
				}
			}
			slices.Sort(moved)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(moved, want) || n != len(want) {
				t.Errorf("moved %v (counted %d), want %v", moved, n, want)
			}
			if got := slices.Sorted(slices.Values(resynced["west"])); !slices.Equal(got, want) {
				t.Errorf("west told of %v, want %v", got, want)
			}
			if got := slices.Sorted(slices.Values(resynced["east"])); !slices.Equal(got, want) {
				t.Errorf("east told of %v, want %v", got, want)
			}
		})
	}
}

// TestRouterReadyWhileOneClusterAnswers: a service with several clusters
// is ready while one of them answers (its load balancer keeps sending it
// tasks, which go to that cluster), and not when none does.
func TestRouterReadyWhileOneClusterAnswers(t *testing.T) {
	answers := map[string]bool{"east": false, "west": true}
	r := &router{}
	for _, name := range []string{"east", "west"} {
		r.clusters = append(r.clusters, &clusterRun{name: name, run: &runner{ready: func() error {
			if !answers[name] {
				return errors.New("no lease")
			}
			return nil
		}}})
	}
	if err := r.ready(); err != nil {
		t.Errorf("ready with west answering: %v", err)
	}
	answers["west"] = false
	if err := r.ready(); err == nil || !strings.Contains(err.Error(), "cluster east: no lease") || !strings.Contains(err.Error(), "cluster west: no lease") {
		t.Errorf("ready with no cluster answering: %v; want both named", err)
	}
}

// TestStrandedPods: a replica group's cluster counts, from its API server,
// the tasks with unreleased pods of its instances whose records are placed
// elsewhere: not a task placed there, not a released pod, not another
// group's pod.
func TestStrandedPods(t *testing.T) {
	ctx := context.Background()
	st := memoryWithClusters(t)
	client := fake.NewClientset()
	c := &clusterRun{name: "east", instance: "svc-east", instances: []string{"svc-east-shard-0", "svc-east-shard-1"}, client: client}
	r := &router{st: st}
	for _, p := range []struct {
		id, cluster, instance string
		released              bool
	}{
		{"moved", "west", "svc-east-shard-1", false},
		{"lost", "", "svc-east-shard-0", false},
		{"here", "east", "svc-east-shard-0", false},
		{"released", "west", "svc-east-shard-0", true},
		{"other", "west", "svc-north-shard-0", false},
	} {
		tk := &task.Task{ObjectMeta: metav1.ObjectMeta{Name: p.id, Namespace: "ns"}}
		tk.Spec.MainContainer, tk.Spec.Template.Spec.Containers = "main", []corev1.Container{{Name: "main", Image: "busybox"}}
		doc, err := json.Marshal(tk)
		if err != nil {
			t.Fatal(err)
		}
		rec := store.Record{ID: p.id, Namespace: "ns", Name: p.id, Nonce: "n" + p.id, Task: doc, Cluster: p.cluster, Phase: "Running"}
		if _, _, err := st.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
		pod, err := task.BuildPod(tk, task.Identity{Namespace: "ns", Name: p.id, RunID: p.id, Executor: p.instance, Nonce: rec.Nonce}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if p.released {
			pod.Labels[task.LabelReleased] = "true"
		}
		if _, err := client.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := r.strandedPods(ctx, c, []string{"ns"}); err != nil || n != 2 {
		t.Errorf("strandedPods = %d, %v; want 2 (moved and lost)", n, err)
	}
}

// TestRouterLosesOverdueAttempts: on a cluster Unreachable for longer than
// a task's spec.placement.lostAfter, that task's attempt (its pod
// recorded) ends ClusterLost and the next one is placed on the cluster
// left, with a new term of the instance first; a task without lostAfter,
// or whose lostAfter has not passed, keeps waiting for the cluster.
func TestRouterLosesOverdueAttempts(t *testing.T) {
	ctx := context.Background()
	st := memoryWithClusters(t)
	var events []executor.Event
	r := &router{st: st, rows: st, defaultNamespace: "default", log: quietLog(), unreachableAfter: 30 * time.Second,
		publish: func(ev executor.Event) { events = append(events, ev) }}
	answers := map[string]bool{"east": true, "west": true}
	r.clusters = answering(st, answers, map[string][]string{})
	if err := r.ensureRows(ctx); err != nil {
		t.Fatal(err)
	}
	for id, lostAfter := range map[string]task.Duration{"gives-up": "2m", "patient": "", "later": "10m"} {
		tk := &task.Task{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: "default"}}
		tk.Spec.Placement = &task.Placement{LostAfter: lostAfter}
		doc, err := json.Marshal(tk)
		if err != nil {
			t.Fatal(err)
		}
		rec := store.Record{ID: id, Namespace: "default", Name: id, Nonce: "n-" + id, Task: doc, Executor: "i-east", Cluster: "east",
			PodCreated: true, PodUID: "u-" + id, Phase: "Running", Reason: "Running"}
		if _, _, err := st.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	epoch, err := st.BeginTerm(ctx, "i-east")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)
	answers["east"] = false
	for _, at := range []time.Duration{0, 31 * time.Second, 2 * time.Minute} {
		if err := r.checkClusters(ctx, t0.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	if rec, _ := st.Get(ctx, "gives-up"); rec.Attempt != 0 || len(rec.Attempts) != 0 {
		t.Fatalf("gave up 1m30s after Unreachable (lostAfter 2m): %+v", rec.Attempts)
	}
	if err := r.checkClusters(ctx, t0.Add(2*time.Minute+31*time.Second)); err != nil {
		t.Fatal(err)
	}
	rec, _ := st.Get(ctx, "gives-up")
	if rec.Attempt != 1 || len(rec.Attempts) != 1 || rec.Attempts[0].Reason != "ClusterLost" || rec.Attempts[0].Cluster != "east" ||
		rec.Executor != "i-west" || rec.Cluster != "west" {
		t.Errorf("past its lostAfter: attempt %d on %s/%s, outcomes %+v; want attempt 0 lost on east, attempt 1 on west", rec.Attempt, rec.Executor, rec.Cluster, rec.Attempts)
	}
	for _, id := range []string{"patient", "later"} {
		if rec, _ := st.Get(ctx, id); rec.Attempt != 0 || rec.Executor != "i-east" || len(rec.Attempts) != 0 {
			t.Errorf("%s was given up on: %+v", id, rec)
		}
	}
	if now, _ := st.BeginTerm(ctx, "i-east"); now <= epoch+1 {
		t.Errorf("no new term of i-east before the loss (term %d after %d)", now, epoch)
	}
	var finished []string
	for _, ev := range events {
		if ev.Type == executor.EventAttemptFinished {
			finished = append(finished, ev.ID+"/"+ev.Reason)
		}
	}
	if !slices.Equal(finished, []string{"gives-up/ClusterLost"}) {
		t.Errorf("attempts finished, as the watches hear: %v; want gives-up's, ClusterLost", finished)
	}
}

// answering is east and west, fake instances i-east and i-west on st with
// 5 free slots each, that answer while answers says so and note in
// resynced the tasks they are told of.
func answering(st store.Store, answers map[string]bool, resynced map[string][]string) []*clusterRun {
	var out []*clusterRun
	for _, name := range []string{"east", "west"} {
		f := &fakeInstance{st: st, instance: "i-" + name, cluster: name}
		out = append(out, &clusterRun{name: name, instance: f.instance,
			run: &runner{api: f, ready: func() error {
				if !answers[name] {
					return errors.New("no lease")
				}
				return nil
			}},
			free: func(string) int { return 5 }, resync: func(id string) { resynced[name] = append(resynced[name], id) }})
	}
	return out
}
