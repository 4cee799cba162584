package expiry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/test/exectest"
)

// TestExecutorThrough410Storm: etcd is compacted five times a second for 30 s while
// tasks finish, and the executor's connections drop every 3 s, so its
// informers keep hitting 410 Expired when they resume and relist (counted in
// kubetask_pod_lists_total); every task still ends in
// exactly one correct state and no pod is left.
func TestExecutorThrough410Storm(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	st := store.NewMemory()
	reg := prometheus.NewRegistry()
	// Connections the client drops every 3 s, as a flaky network or a load
	// balancer would: no bookmark brings the informer's resourceVersion up to
	// date, so resuming after a compaction gets 410 Expired.
	flaky := rest.CopyConfig(env.Config)
	flaky.Timeout = 3 * time.Second
	client, err := kubernetes.NewForConfig(flaky)
	if err != nil {
		t.Fatal(err)
	}
	ex, _ := exectest.StartExecutor(t, env, executor.Config{Store: st, OnEvent: evs.Add, Registerer: reg, Client: client})

	want := map[string]int{}
	var ids []string
	for i := 0; i < 40; i++ {
		id := fmt.Sprintf("s%02d", i)
		code := []int{0, 3}[i%2]
		want[id] = code
		ids = append(ids, id)
		exectest.Submit(t, ex, id, exectest.SimTask(id, map[string]string{
			kwokstages.ExitContainer: "main",
			kwokstages.ExitCode:      fmt.Sprint(code),
			kwokstages.ExitAfter:     fmt.Sprintf("%ds", 2+(i*28)/40),
		}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	noise, err := env.Client.CoreV1().ConfigMaps(env.Namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "noise"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Five compactions a second: whenever a watch resumes, the newest
	// compaction is very likely past the last pod event it saw.
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	compactions := 0
storm:
	for {
		select {
		case <-ctx.Done():
			break storm
		case <-tick.C:
			// An unrelated write first, so the compaction passes the last pod
			// event the informers saw (unless a pod changed in between).
			noise.Data = map[string]string{"n": fmt.Sprint(compactions)}
			updated, err := env.Client.CoreV1().ConfigMaps(env.Namespace).Update(ctx, noise, metav1.UpdateOptions{})
			if err != nil && ctx.Err() == nil {
				t.Fatalf("writing noise: %v", err)
			}
			if err == nil {
				noise = updated
			}
			if _, err := env.Cluster.CompactEtcd(ctx); err != nil && ctx.Err() == nil {
				t.Fatalf("compacting: %v", err)
			}
			compactions++
		}
	}
	lists := counterValue(t, reg, "kubetask_pod_lists_total", "ok")
	failedLists := counterValue(t, reg, "kubetask_pod_lists_total", "error")
	watches := counterValue(t, reg, "kubetask_pod_watches_total", "ok")
	expired := counterValue(t, reg, "kubetask_watch_errors_total", "expired")
	t.Logf("%d compactions; the informers listed %v times (%v lists failed), watched %v times, and met 410 Expired %v times", compactions, lists, failedLists, watches, expired)
	// One LIST at start; every further one is a relist after a 410.
	if lists < 3 {
		t.Errorf("the informers relisted %v times during the storm: the test did not test anything", lists-1)
	}
	evs.WaitTerminal(t, 2*time.Minute, ids...)
	for id, code := range want {
		term := evs.Terminal(id)
		if len(term) != 1 {
			t.Errorf("%s: %d terminal events, want 1", id, len(term))
			continue
		}
		wantPhase := podstate.Succeeded
		if code != 0 {
			wantPhase = podstate.Failed
		}
		if podstate.Phase(term[0].Phase) != wantPhase || exectest.ExitCode(term[0]) != int32(code) {
			t.Errorf("%s: %s exit %d, want %s exit %d", id, term[0].Phase, exectest.ExitCode(term[0]), wantPhase, code)
		}
		if rec := exectest.Record(t, st, id); len(rec.Attempts) != 1 {
			t.Errorf("%s: %d recorded attempts", id, len(rec.Attempts))
		}
	}
	exectest.WaitNoTaskPods(t, env, time.Minute)
}

// counterValue returns the value of counter family name for one label value (0 if absent).
func counterValue(t *testing.T, g prometheus.Gatherer, name, label string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
