package executor

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/components"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// simSpec is what a simulated task will do: its main container exits with
// code after delay while an envoy-like sidecar keeps running.
type simSpec struct {
	delay time.Duration
	code  int
}

func (s simSpec) task(name string) *task.Task {
	return exectest.SimTask(name, map[string]string{
		kwokstages.ExitContainer: "main",
		kwokstages.ExitCode:      fmt.Sprint(s.code),
		kwokstages.ExitAfter:     s.delay.String(),
	})
}

func (s simSpec) want() (podstate.Phase, int32) {
	if s.code == 0 {
		return podstate.Succeeded, 0
	}
	return podstate.Failed, int32(s.code)
}

// checkExactlyOnce checks that each task has exactly one terminal event with
// the expected outcome, and one recorded attempt.
func checkExactlyOnce(t *testing.T, evs *exectest.Events, st store.Store, specs map[string]simSpec) {
	t.Helper()
	bad := 0
	for id, s := range specs {
		term := evs.Terminal(id)
		phase, code := s.want()
		switch {
		case len(term) != 1:
			t.Errorf("%s: %d terminal events, want exactly 1", id, len(term))
			bad++
		case podstate.Phase(term[0].Phase) != phase || exectest.ExitCode(term[0]) != code:
			t.Errorf("%s: %s exit %d (%s), want %s exit %d", id, term[0].Phase, exectest.ExitCode(term[0]), term[0].Message, phase, code)
			bad++
		}
		if rec := exectest.Record(t, st, id); len(rec.Attempts) != 1 || !rec.Terminal {
			t.Errorf("%s: record has %d attempts, terminal=%v: %+v", id, len(rec.Attempts), rec.Terminal, rec.Attempts)
			bad++
		}
		if bad > 10 {
			t.Fatal("too many failures")
		}
	}
}

// TestAPIServerRestartedTwiceWith200Tasks: 200 sidecar tasks on kwok nodes
// finish while kube-apiserver is restarted twice (the informers' watches get
// 410 Expired and relist); every task ends in exactly one correct state and
// no pod is left.
func TestAPIServerRestartedTwiceWith200Tasks(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	st := store.NewMemory()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{Store: st, OnEvent: evs.Add, Parallelism: 250, Workers: 16})
	rng := rand.New(rand.NewPCG(1, 2))
	specs := map[string]simSpec{}
	var ids []string
	for i := 0; i < 200; i++ {
		id := fmt.Sprintf("t%03d", i)
		s := simSpec{delay: time.Duration(5+rng.IntN(20)) * time.Second, code: []int{0, 0, 0, 2}[rng.IntN(4)]}
		specs[id] = s
		ids = append(ids, id)
		exectest.Submit(t, ex, id, s.task(id))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	waitRunning(t, env, 20)
	for i := 0; i < 2; i++ {
		if err := env.Cluster.RestartAPIServer(ctx); err != nil {
			t.Fatalf("restart %d: %v", i, err)
		}
		t.Logf("apiserver restart %d done", i+1)
	}
	evs.WaitTerminal(t, 3*time.Minute, ids...)
	checkExactlyOnce(t, evs, st, specs)
	exectest.WaitNoTaskPods(t, env, 2*time.Minute)
}

// waitRunning waits until at least n task pods run.
func waitRunning(t *testing.T, env *clustertest.Env, n int) {
	t.Helper()
	clustertest.Eventually(t, 2*time.Minute, fmt.Sprintf("%d task pods running", n), func(ctx context.Context) error {
		pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if err != nil {
			return err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if running < n {
			return fmt.Errorf("%d running", running)
		}
		return nil
	})
}

// TestFinishedWhileDownAndDeleted: tasks finish while the executor is down,
// and someone deletes their pods meanwhile. The finalizer keeps each pod (and
// its exit code) until a new executor with the same identity and store
// records the outcome.
func TestFinishedWhileDownAndDeleted(t *testing.T) {
	env := clustertest.New(t)
	st := store.NewMemory()
	first := exectest.NewEvents()
	ex, stop := exectest.StartExecutor(t, env, executor.Config{Store: st, OnEvent: first.Add})
	specs := map[string]simSpec{}
	for i := 0; i < 10; i++ {
		id := fmt.Sprintf("d%02d", i)
		specs[id] = simSpec{delay: 4 * time.Second, code: i % 3}
		exectest.Submit(t, ex, id, specs[id].task(id))
	}
	waitRunning(t, env, 10)
	stop()

	// Wait until every main container has exited, then delete every pod.
	clustertest.Eventually(t, time.Minute, "main containers exited", func(ctx context.Context) error {
		pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if s := podstate.Derive(&p, podstate.Policy{MainContainer: "main"}, time.Now()); !s.Terminal() {
				return fmt.Errorf("%s: %s", p.Name, s)
			}
		}
		return nil
	})
	// As a person would: kubectl delete (without waiting: the finalizer
	// holds the pods until an executor records their outcomes).
	b, err := components.NewBuilder(nil)
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := b.Ensure(context.Background(), components.Kubectl)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(kubectl, "--kubeconfig", env.Kubeconfig, "-n", env.Namespace, "delete", "pods",
		"-l", task.ManagedSelector().String(), "--wait=false").CombinedOutput(); err != nil {
		t.Fatalf("kubectl delete: %v\n%s", err, out)
	}
	for id := range specs {
		if len(first.Terminal(id)) != 0 {
			t.Fatalf("%s reported before the executor restart", id)
		}
	}

	second := exectest.NewEvents()
	exectest.StartExecutor(t, env, executor.Config{Store: st, OnEvent: second.Add})
	var ids []string
	for id := range specs {
		ids = append(ids, id)
	}
	second.WaitTerminal(t, 2*time.Minute, ids...)
	checkExactlyOnce(t, second, st, specs)
	exectest.WaitNoTaskPods(t, env, time.Minute)
}
