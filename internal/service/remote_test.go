package service

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// fakeGroups keeps heartbeats by group and answers the unfinished counts
// it is given.
type fakeGroups struct {
	beats    map[string][]string // group -> identities
	alive    map[string]bool     // group -> Members answers one
	counts   map[string]int
	failWith error
	joined   map[string][]store.Member // group -> members in join order
	quiet    map[string]bool           // identity -> not heard of lately
}

func (f *fakeGroups) Join(_ context.Context, group string, m store.Member, _ time.Duration) ([]store.Member, error) {
	if f.failWith != nil {
		return nil, f.failWith
	}
	if f.joined == nil {
		f.joined = map[string][]store.Member{}
	}
	found := false
	for _, o := range f.joined[group] {
		found = found || o.Identity == m.Identity
	}
	if !found {
		m.Joined = int64(len(f.joined[group]) + 1)
		f.joined[group] = append(f.joined[group], m)
	}
	var out []store.Member
	for _, o := range f.joined[group] {
		if !f.quiet[o.Identity] {
			out = append(out, o)
		}
	}
	return out, nil
}

func (f *fakeGroups) Heartbeat(_ context.Context, group string, m store.Member) error {
	if f.failWith != nil {
		return f.failWith
	}
	f.beats[group] = append(f.beats[group], m.Identity)
	return nil
}

func (f *fakeGroups) Leave(context.Context, string, string) error { return nil }

func (f *fakeGroups) Members(_ context.Context, group string, _ time.Duration) ([]store.Member, error) {
	if f.alive[group] {
		return []store.Member{{Identity: "agent-1"}}, nil
	}
	return nil, nil
}

func (f *fakeGroups) UnfinishedByExecutor(context.Context) (map[string]int, error) {
	return f.counts, nil
}

// TestRemoteCluster: a cluster run by an agent, as the service sees it. A
// task placed there is recorded for the agent's instance (its shard's,
// with shards) and cluster, and cancelled through the store; the cluster
// answers while the agent's heartbeats are fresh, and its free slots are
// its parallelism less its instances' unfinished tasks; quiet for
// unreachableAfter it is Unreachable, and declared lost and answering
// again it stays Returning for the service (its agent, which sees its
// pods, makes it Ready).
func TestRemoteCluster(t *testing.T) {
	ctx := context.Background()
	st := memoryWithClusters(t)
	groups := &fakeGroups{beats: map[string][]string{}, alive: map[string]bool{}, counts: map[string]int{"svc-west-shard-0": 3, "svc-west-shard-1": 4, "svc-east": 50}}
	r := &router{st: st, rows: st, groups: groups, instanceID: "svc", shards: 2, defaultNamespace: "default", log: quietLog(), unreachableAfter: 10 * time.Second}
	west, rc, err := r.newRemoteCluster(Config{Parallelism: 20, Shards: 2}, "west", map[string]string{"region": "eu"}, executor.Config{Store: st, DefaultNamespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	west.byAgent = true
	r.clusters = []*clusterRun{west}
	r.leader.Store(true) // the only replica
	if err := r.ensureRows(ctx); err != nil {
		t.Fatal(err)
	}
	if row, _ := st.GetCluster(ctx, "west"); row.Mode != store.ClusterAgent {
		t.Errorf("west's row has mode %q, want agent", row.Mode)
	}
	if err := rc.ready(); err == nil {
		t.Error("ready before any heartbeat was read")
	}
	groups.alive[clusterGroup("svc-west")] = true
	if err := r.refreshRemote(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rc.ready(); err != nil {
		t.Errorf("not ready with a fresh heartbeat: %v", err)
	}
	if got := west.free("any"); got != 20-7 {
		t.Errorf("free = %d, want 13 (20 less its shards' 7 unfinished)", got)
	}
	tk := &task.Task{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "default"}}
	tk.Spec.MainContainer, tk.Spec.Template.Spec.Containers = "main", []corev1.Container{{Name: "main", Image: "busybox"}}
	rec, created, err := r.SubmitCreated(ctx, "t-1", tk)
	if err != nil || !created {
		t.Fatalf("SubmitCreated: %v, created %v", err, created)
	}
	if want := west.target("t-1"); rec.Executor != want || rec.Cluster != "west" {
		t.Errorf("recorded for %s on %q, want %s on west", rec.Executor, rec.Cluster, want)
	}
	if err := r.Cancel(ctx, "t-1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.Get(ctx, "t-1"); got.CancelledAt.IsZero() {
		t.Error("the cancellation is not in the store, for the agent")
	}

	t0 := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	check := func(at time.Duration, want store.ClusterState) {
		t.Helper()
		if err := r.refreshRemote(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.checkClusters(ctx, t0.Add(at)); err != nil {
			t.Fatal(err)
		}
		if row, _ := st.GetCluster(ctx, "west"); row.State != want {
			t.Fatalf("at %s: west is %s, want %s", at, row.State, want)
		}
	}
	check(0, store.ClusterReady)
	groups.alive[clusterGroup("svc-west")] = false
	check(time.Second, store.ClusterReady)
	check(12*time.Second, store.ClusterUnreachable)
	groups.alive[clusterGroup("svc-west")] = true
	check(13*time.Second, store.ClusterReady)
	if _, err := r.markLost(ctx, "west"); err != nil {
		t.Fatal(err)
	}
	check(14*time.Second, store.ClusterReturning)
	check(20*time.Second, store.ClusterReturning)
}

// TestAgentHeartbeats: an agent says in the store that it runs its
// cluster while that cluster's executors answer, and never checks or
// says anything of the others.
func TestAgentHeartbeats(t *testing.T) {
	ctx := context.Background()
	groups := &fakeGroups{beats: map[string][]string{}, alive: map[string]bool{}}
	answers := true
	r := &router{groups: groups, agent: "west", identity: "agent-1"}
	r.clusters = []*clusterRun{
		{name: "east", instance: "svc-east", remote: true, run: &runner{ready: func() error { return nil }}},
		{name: "west", instance: "svc-west", run: &runner{ready: func() error {
			if !answers {
				return errors.New("no lease")
			}
			return nil
		}}},
	}
	if err := r.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	answers = false
	if err := r.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if got := groups.beats; len(got) != 1 || len(got[clusterGroup("svc-west")]) != 1 || got[clusterGroup("svc-west")][0] != "agent-1" {
		t.Errorf("heartbeats %v: want one of agent-1 for svc-west, while it answered", got)
	}
}

// TestRouterLeader: of a service's replicas, the one that joined the
// router's group first makes the router's decisions; the others only
// follow the clusters' states. When the leader is no longer heard of, the
// next one leads; a replica that cannot reach the store does not.
func TestRouterLeader(t *testing.T) {
	ctx := context.Background()
	st := memoryWithClusters(t)
	groups := &fakeGroups{beats: map[string][]string{}, alive: map[string]bool{}, quiet: map[string]bool{}}
	answers := false
	newReplicaRouter := func(id string) *router {
		r := &router{st: st, rows: st, groups: groups, instanceID: "svc", shards: 2, identity: id, log: quietLog(), unreachableAfter: time.Second}
		r.clusters = []*clusterRun{{name: "east", instance: "svc-east", run: &runner{ready: func() error {
			if !answers {
				return errors.New("no lease")
			}
			return nil
		}}}}
		return r
	}
	r1, r2 := newReplicaRouter("r1"), newReplicaRouter("r2")
	if err := r1.ensureRows(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*router{r1, r2} {
		if err := r.elect(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !r1.leads() || r2.leads() {
		t.Fatalf("r1 leads %v, r2 leads %v; want r1 only (it joined first)", r1.leads(), r2.leads())
	}
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	state := func() store.ClusterState {
		row, _ := st.GetCluster(ctx, "east")
		return row.State
	}
	for _, at := range []time.Duration{0, 5 * time.Second} {
		if err := r2.checkClusters(ctx, t0.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	if state() != store.ClusterReady {
		t.Errorf("a replica that does not lead wrote east %s", state())
	}
	for _, at := range []time.Duration{0, 5 * time.Second} {
		if err := r1.checkClusters(ctx, t0.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	if state() != store.ClusterUnreachable {
		t.Errorf("the leader left east %s, want Unreachable", state())
	}
	groups.quiet["r1"] = true
	if err := r2.elect(ctx); err != nil || !r2.leads() {
		t.Errorf("r2 once r1 is not heard of: leads %v, %v", r2.leads(), err)
	}
	groups.failWith = errors.New("the store does not answer")
	if err := r2.elect(ctx); err == nil || r2.leads() {
		t.Errorf("r2 without the store: leads %v, %v; want not", r2.leads(), err)
	}
}
