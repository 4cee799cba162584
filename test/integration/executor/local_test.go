package executor

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// TestOutcomesOnLocalNode: exit codes decide, an envoy-like sidecar that
// never exits does not hold the task, and every pod is cleaned up.
func TestOutcomesOnLocalNode(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	st := store.NewMemory()
	reg := prometheus.NewRegistry()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{Store: st, OnEvent: evs.Add, Registerer: reg})

	forever := `trap 'exit 0' TERM; while :; do sleep 1; done`
	cases := map[string]struct {
		task   *task.Task
		phase  podstate.Phase
		reason podstate.Reason
		code   int32
	}{
		"ok":             {exectest.LocalTask("ok", "echo hi", ""), podstate.Succeeded, podstate.ReasonCompleted, 0},
		"exit-3":         {exectest.LocalTask("exit3", "exit 3", ""), podstate.Failed, podstate.ReasonExitCode, 3},
		"sidecar-ok":     {exectest.LocalTask("side", "sleep 1; exit 0", forever), podstate.Succeeded, podstate.ReasonCompleted, 0},
		"sidecar-exit-4": {exectest.LocalTask("side4", "exit 4", "sleep 100000"), podstate.Failed, podstate.ReasonExitCode, 4},
	}
	var ids []string
	for id, tc := range cases {
		exectest.Submit(t, ex, id, tc.task)
		ids = append(ids, id)
	}
	evs.WaitTerminal(t, 2*time.Minute, ids...)
	for id, tc := range cases {
		term := evs.Terminal(id)
		if len(term) != 1 {
			t.Errorf("%s: %d terminal events, want exactly 1: %+v", id, len(term), term)
			continue
		}
		ev := term[0]
		if podstate.Phase(ev.Phase) != tc.phase || podstate.Reason(ev.Reason) != tc.reason || exectest.ExitCode(ev) != tc.code {
			t.Errorf("%s: got %s/%s exit %d (%s), want %s/%s exit %d", id, ev.Phase, ev.Reason, exectest.ExitCode(ev), ev.Message, tc.phase, tc.reason, tc.code)
		}
	}
	exectest.WaitNoTaskPods(t, env, time.Minute)
	gauge := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kubetask_tasks" {
			for _, m := range mf.Metric {
				gauge[m.Label[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	if gauge["Succeeded"] != 2 || gauge["Failed"] != 2 || gauge["Pending"] != 0 || gauge["Running"] != 0 {
		t.Errorf("kubetask_tasks = %v, want 2 Succeeded, 2 Failed, none Pending or Running", gauge)
	}
}

// TestKeepStopsSidecars: with cleanup Keep the pod stays but nothing in it runs.
func TestKeepStopsSidecars(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{OnEvent: evs.Add})
	tk := exectest.LocalTask("keep", "exit 0", `trap 'exit 0' TERM; while :; do sleep 1; done`)
	tk.Spec.Cleanup = task.CleanupKeep
	exectest.Submit(t, ex, "keep", tk)
	evs.WaitTerminal(t, time.Minute, "keep")
	if ev := evs.Terminal("keep")[0]; ev.Phase != string(podstate.Succeeded) {
		t.Fatalf("outcome %+v, want Succeeded", ev)
	}
	name := podName(t, ex, "keep", 0)
	clustertest.Eventually(t, time.Minute, "kept pod has stopped every container", func(ctx context.Context) error {
		p, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.Finalizers) > 0 {
			return fmt.Errorf("finalizers %v still there", p.Finalizers)
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.State.Terminated == nil {
				return fmt.Errorf("container %s not terminated: %+v", c.Name, c.State)
			}
		}
		return nil
	})
}

// TestRetryOnExitCode: a task that retries its own non-zero exit gets a new
// pod per attempt and one recorded outcome per attempt.
func TestRetryOnExitCode(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	st := store.NewMemory()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{Store: st, OnEvent: evs.Add})
	// Fails on the first attempt, succeeds on the second.
	tk := exectest.LocalTask("flaky", `[ "$ATTEMPT" != 0 ] || exit 7`, "")
	tk.Spec.Retries = task.Retries{Limit: ptr.To[int32](2), Backoff: "1s", RetryOn: []string{"ExitCode"}}
	exectest.Submit(t, ex, "flaky", tk)
	evs.WaitTerminal(t, 2*time.Minute, "flaky")
	att := evs.AttemptsFinished("flaky")
	if len(att) != 2 || att[0].Attempt != 0 || exectest.ExitCode(att[0]) != 7 || att[1].Attempt != 1 || att[1].Phase != "Succeeded" {
		t.Fatalf("attempt outcomes %+v, want attempt 0 exit 7 then attempt 1 Succeeded", att)
	}
	rec := exectest.Record(t, st, "flaky")
	if len(rec.Attempts) != 2 || !rec.Terminal || rec.Phase != "Succeeded" {
		t.Errorf("record %+v", rec)
	}
	exectest.WaitNoTaskPods(t, env, time.Minute)
}

// TestPodDeletedExternally: a running task's pod deleted by someone else is
// reported DeletedExternally (the finalizer kept it visible) and retried.
func TestPodDeletedExternally(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{OnEvent: evs.Add})
	tk := exectest.LocalTask("victim", `trap 'exit 143' TERM; [ "$ATTEMPT" != 0 ] || while :; do sleep 1; done`, "")
	tk.Spec.Retries = task.Retries{Limit: ptr.To[int32](1), Backoff: "1s"}
	exectest.Submit(t, ex, "victim", tk)
	name := podName(t, ex, "victim", 0)
	clustertest.Eventually(t, time.Minute, "pod running", func(ctx context.Context) error {
		p, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != "Running" {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	if err := env.Client.CoreV1().Pods(env.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	evs.WaitTerminal(t, 2*time.Minute, "victim")
	att := evs.AttemptsFinished("victim")
	if len(att) != 2 || att[0].Reason != string(podstate.ReasonDeletedExternally) || att[1].Phase != string(podstate.Succeeded) {
		t.Fatalf("attempts %+v, want DeletedExternally then Succeeded", att)
	}
	exectest.WaitNoTaskPods(t, env, time.Minute)
}

// TestSubmitIsIdempotentAndValidates: a second Submit of an ID returns the
// first record; a bad task or ID is refused before anything is stored.
func TestSubmitIsIdempotentAndValidates(t *testing.T) {
	env := clustertest.New(t)
	st := store.NewMemory()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{Store: st})
	first, err := ex.Submit(context.Background(), "same", exectest.LocalTask("one", "true", ""))
	if err != nil {
		t.Fatal(err)
	}
	second, err := ex.Submit(context.Background(), "same", exectest.LocalTask("two", "false", ""))
	if err != nil {
		t.Fatal(err)
	}
	if second.Name != first.Name || second.Name != "one" {
		t.Errorf("second submit returned %q, want the first task %q", second.Name, first.Name)
	}
	bad := exectest.LocalTask("bad", "true", "")
	bad.Spec.MainContainer = "nope"
	if _, err := ex.Submit(context.Background(), "bad", bad); err == nil {
		t.Error("a task naming a missing main container was accepted")
	}
	for _, id := range []string{"a/b", "tab\tinside", " padded "} {
		if _, err := ex.Submit(context.Background(), id, exectest.LocalTask("x", "true", "")); !errors.Is(err, executor.ErrInvalidTask) {
			t.Errorf("ID %q that task.ValidateID refuses: %v, want ErrInvalidTask", id, err)
		}
	}
	if _, err := st.Get(context.Background(), "bad"); err == nil {
		t.Error("a refused task was stored")
	}
}

// TestCancel: cancelling a running task stops its pod and ends the task
// Failed/Cancelled, not retried; cancelling it again does nothing.
func TestCancel(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	st := store.NewMemory()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{Store: st, OnEvent: evs.Add})
	tk := exectest.LocalTask("endless", `trap 'exit 143' TERM; while :; do sleep 1; done`, "")
	tk.Spec.Retries = task.Retries{Limit: ptr.To[int32](3), Backoff: "1s", RetryOn: []string{"Infrastructure", "ExitCode"}}
	exectest.Submit(t, ex, "endless", tk)
	clustertest.Eventually(t, time.Minute, "task running", func(ctx context.Context) error {
		r, err := ex.Get(ctx, "endless")
		if err != nil {
			return err
		}
		if r.Phase != string(podstate.Running) {
			return fmt.Errorf("phase %s", r.Phase)
		}
		return nil
	})
	if err := ex.Cancel(context.Background(), "endless"); err != nil {
		t.Fatal(err)
	}
	evs.WaitTerminal(t, time.Minute, "endless")
	if ev := evs.Terminal("endless"); len(ev) != 1 || ev[0].Reason != string(podstate.ReasonCancelled) {
		t.Fatalf("terminal events %+v, want one Cancelled", ev)
	}
	if err := ex.Cancel(context.Background(), "endless"); err != nil {
		t.Errorf("cancelling a finished task: %v", err)
	}
	if r := exectest.Record(t, st, "endless"); len(r.Attempts) != 1 {
		t.Errorf("%d attempts recorded, want 1 (a cancelled task is not retried)", len(r.Attempts))
	}
	exectest.WaitNoTaskPods(t, env, time.Minute)
}
