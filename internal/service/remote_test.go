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
}

func (f *fakeGroups) Join(context.Context, string, store.Member, time.Duration) ([]store.Member, error) {
	return nil, nil
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
