package replica

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/task"
)

// TestReplicasOverClusters: two replicas of `kubetask serve` (the built
// binary, PostgreSQL) run tasks on two clusters (east and west: two names
// for the local cluster, whose instances keep apart by their pods'
// executor label), each cluster with a replica group of its own: its
// shards' Leases are balanced between the two replicas. Tasks placed on
// each cluster by name, submitted to either replica, run on their
// cluster's shard instance (the pods' executor label, from the API
// server); the replica holding more shards is SIGKILLed mid-run and the
// other takes its shards of both clusters. Every task ends Succeeded with
// one attempt, no attempt had two pods that ran, and no pod is left.
func TestReplicasOverClusters(t *testing.T) {
	const (
		shards = 4
		lease  = 6 * time.Second
		tasks  = 40
	)
	env := clustertest.New(t)
	g := newGroup(t, env, pgtest.Database(t), shards, lease)
	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	doc := fmt.Sprintf("clusters:\n- {name: east, kubeconfig: %q}\n- {name: west, kubeconfig: %q}\n", env.Kubeconfig, env.Kubeconfig)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	pods := watchPods(t, env)
	ids := []string{"r0", "r1"}
	procs := []*replicaProc{g.start("r0", "--config", cfg), g.start("r1", "--config", cfg)}
	groupOf := func(cluster string) *group {
		cg := *g
		cg.name = g.name + "-" + cluster
		return &cg
	}
	east, west := groupOf("east"), groupOf("west")
	for _, cg := range []*group{east, west} {
		took, holders := cg.waitBalanced(time.Minute, ids...)
		t.Logf("%s: shards balanced %s after both were ready: %v", cg.name, took.Round(time.Millisecond), holders)
	}

	cluster := map[string]string{}
	submit := func(i int) {
		t.Helper()
		cl := []string{"east", "west"}[i%2]
		id := fmt.Sprintf("mc-%02d", i)
		d := strings.Replace(string(simTaskDoc(t, "mc", time.Duration(2000+i*50)*time.Millisecond)), `"spec":{`, `"spec":{"placement":{"cluster":"`+cl+`"},`, 1)
		for try := 0; ; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			tk, _, err := procs[(i/2)%len(procs)].client.Submit(ctx, env.Namespace, []byte(d), client.SubmitOptions{ID: id})
			cancel()
			if err == nil {
				if tk.Cluster != cl {
					t.Fatalf("%s: placed on %q, want %s", id, tk.Cluster, cl)
				}
				break
			}
			if try > 20 {
				t.Fatalf("submitting %s: %v", id, err)
			}
		}
		cluster[id] = cl
	}
	for i := range tasks / 2 {
		submit(i)
	}
	clustertest.Eventually(t, 2*time.Minute, "the first half's pods", func(context.Context) error {
		pods.mu.Lock()
		n := len(pods.first)
		pods.mu.Unlock()
		if n < tasks/2 {
			return fmt.Errorf("%d runs have pods", n)
		}
		return nil
	})
	// SIGKILL the replica that holds more shards of both clusters.
	load := map[string]int{}
	for _, cg := range []*group{east, west} {
		hs, err := cg.holders(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			load[h]++
		}
	}
	victim, survivor := "r0", procs[1]
	if load["r1"] > load["r0"] {
		victim, survivor = "r1", procs[0]
	}
	g.stop(victim, syscall.SIGKILL)
	procs = []*replicaProc{survivor}
	for i := tasks / 2; i < tasks; i++ {
		submit(i)
	}
	for _, cg := range []*group{east, west} {
		cg.waitBalanced(3*lease+30*time.Second, survivor.id)
	}

	for id, cl := range cluster {
		var tk *api.Task
		clustertest.Eventually(t, 3*time.Minute, id+" to finish", func(ctx context.Context) error {
			var err error
			if tk, err = survivor.client.Get(ctx, id); err != nil {
				return err
			}
			if !tk.Terminal {
				return fmt.Errorf("%s/%s", tk.Phase, tk.Reason)
			}
			return nil
		})
		if tk.Phase != "Succeeded" || len(tk.Attempts) != 1 || tk.Attempts[0].Cluster != cl {
			t.Errorf("%s: %s/%s, attempts %+v; want Succeeded on %s in one attempt", id, tk.Phase, tk.Reason, tk.Attempts, cl)
		}
	}
	if d := pods.duplicates(); len(d) > 0 {
		t.Errorf("attempts with more than one pod that ran: %v", d)
	}
	// Each task's pods ran under its cluster's shard instance (the API
	// server's labels), and none is left.
	list, err := env.Client.CoreV1().Pods(env.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		id := p.Labels[task.LabelRun]
		if want := replica.ShardID(g.name+"-"+cluster[id], replica.ShardOf(id, shards)); p.Labels[task.LabelExecutor] != want {
			t.Errorf("pod %s of %s ran under %q, want %q", p.Name, id, p.Labels[task.LabelExecutor], want)
		}
	}
	clustertest.Eventually(t, 2*time.Minute, "every task pod gone or released", func(ctx context.Context) error {
		list, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			if len(p.Finalizers) > 0 {
				return fmt.Errorf("pod %s keeps %v", p.Name, p.Finalizers)
			}
		}
		return nil
	})
	// The shard Leases of both clusters' groups are the survivor's.
	for _, cg := range []*group{east, west} {
		for k := range shards {
			l, err := env.Client.CoordinationV1().Leases(env.Namespace).Get(context.Background(), executor.LeaseName(replica.ShardID(cg.name, k)), metav1.GetOptions{})
			if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != survivor.id {
				t.Errorf("%s shard %d's Lease: %v %v", cg.name, k, holderOf(l), err)
			}
		}
	}
}

func holderOf(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}
