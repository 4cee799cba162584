package executor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// TestMainThatHandlesSIGTERMKeepsItsOutcome (issue 9, defect b): a pod
// deleted by someone else whose main container handles SIGTERM and exits 0
// is Succeeded, not DeletedExternally, and is not retried.
func TestMainThatHandlesSIGTERMKeepsItsOutcome(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{OnEvent: evs.Add})
	tk := exectest.LocalTask("graceful", `trap 'echo stopping; sleep 1; exit 0' TERM; while :; do sleep 0.2; done`, "")
	tk.Spec.Retries = task.Retries{Limit: ptr.To[int32](2), Backoff: "1s", RetryOn: []string{task.RetryOnInfrastructure}}
	exectest.Submit(t, ex, "graceful", tk)
	name := podName(t, ex, "graceful", 0)
	waitState(t, ex, "graceful", "Running/Running")
	if err := env.Client.CoreV1().Pods(env.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	evs.WaitTerminal(t, time.Minute, "graceful")
	ev := evs.Terminal("graceful")[0]
	if ev.Phase != string(podstate.Succeeded) || ev.Attempt != 0 {
		t.Errorf("outcome %s/%s attempt %d (%s), want Succeeded on attempt 0", ev.Phase, ev.Reason, ev.Attempt, ev.Message)
	}
	exectest.WaitNoTaskPods(t, env, time.Minute)
}

// TestRetryStartsOnlyOnceThePreviousPodStopped (defect b): after an
// external deletion of a pod whose main container ignores SIGTERM, the next
// attempt's pod is created only once no container of the previous one runs.
func TestRetryStartsOnlyOnceThePreviousPodStopped(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	var mu sync.Mutex
	var violations []string
	ctx := context.Background()
	check := func(ev executor.Event) {
		if ev.Type != executor.EventPodCreated || ev.Attempt == 0 {
			return
		}
		// Attempt n's pod was just created: attempt n-1's must have stopped.
		_, created, _ := strings.Cut(ev.Pod, "/")
		previous := strings.TrimSuffix(created, "-"+strconv.Itoa(ev.Attempt)) + "-" + strconv.Itoa(ev.Attempt-1)
		prev, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, previous, metav1.GetOptions{})
		if err == nil && !podstate.Stopped(prev) {
			mu.Lock()
			violations = append(violations, fmt.Sprintf("attempt %d created while attempt %d's pod runs (phase %s, deleting %v)", ev.Attempt, ev.Attempt-1, prev.Status.Phase, prev.DeletionTimestamp != nil))
			mu.Unlock()
		}
	}
	ex, _ := exectest.StartExecutor(t, env, executor.Config{OnEvent: func(ev executor.Event) { check(ev); evs.Add(ev) }})
	tk := exectest.LocalTask("stubborn", `trap '' TERM; if [ "$ATTEMPT" = 0 ]; then while :; do sleep 0.2; done; fi`, "")
	tk.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](3)
	tk.Spec.Retries = task.Retries{Limit: ptr.To[int32](2), Backoff: "1s", RetryOn: []string{task.RetryOnInfrastructure}}
	exectest.Submit(t, ex, "stubborn", tk)
	waitState(t, ex, "stubborn", "Running/Running")
	if err := env.Client.CoreV1().Pods(env.Namespace).Delete(ctx, podName(t, ex, "stubborn", 0), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, ex, "stubborn", "Running/Stopping")
	evs.WaitTerminal(t, 2*time.Minute, "stubborn")
	att := evs.AttemptsFinished("stubborn")
	if len(att) != 2 || att[0].Reason != string(podstate.ReasonDeletedExternally) || att[1].Phase != string(podstate.Succeeded) {
		t.Errorf("attempts %+v, want DeletedExternally then Succeeded", att)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	exectest.WaitNoTaskPods(t, env, time.Minute)
}

// TestSameInstanceIDNeverRunsTwice (defect c): a second executor with the
// same InstanceID (and a store that does not know the first one's tasks)
// waits for the first instead of deleting its pods.
func TestSameInstanceIDNeverRunsTwice(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	first, stopFirst := exectest.StartExecutor(t, env, executor.Config{InstanceID: "twin", OnEvent: evs.Add})
	exectest.Submit(t, first, "work", exectest.LocalTask("work", "sleep 4; echo done", ""))
	waitState(t, first, "work", "Running/Running")
	second, _ := exectest.StartExecutor(t, env, executor.Config{InstanceID: "twin", Store: store.NewMemory(),
		LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond})
	evs.WaitTerminal(t, time.Minute, "work")
	if ev := evs.Terminal("work")[0]; ev.Phase != string(podstate.Succeeded) {
		t.Fatalf("the first executor's task ended %s/%s (%s): the second one interfered", ev.Phase, ev.Reason, ev.Message)
	}
	if second.CachedPod(env.Namespace, podName(t, first, "work", 0)) != nil {
		t.Error("the second executor watches pods while the first holds the lease")
	}
	stopFirst()
	// The second takes over and runs tasks.
	exectest.Submit(t, second, "after", exectest.LocalTask("after", "exit 0", ""))
	waitTerminalRecord(t, second, "after", time.Minute)
}

// TestKeptPodsLeaveTheCache (defect k): a kept pod, once released, is
// labelled released and no longer in the executor's cache or relists.
func TestKeptPodsLeaveTheCache(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{OnEvent: evs.Add})
	tk := exectest.LocalTask("kept", "exit 0", `trap 'exit 0' TERM; while :; do sleep 1; done`)
	tk.Spec.Cleanup = task.CleanupKeep
	exectest.Submit(t, ex, "kept", tk)
	evs.WaitTerminal(t, time.Minute, "kept")
	name := podName(t, ex, "kept", 0)
	clustertest.Eventually(t, time.Minute, "kept pod released and out of the cache", func(ctx context.Context) error {
		p, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Labels[task.LabelReleased] != "true" || len(p.Finalizers) > 0 {
			return fmt.Errorf("labels %v, finalizers %v", p.Labels, p.Finalizers)
		}
		if ex.CachedPod(env.Namespace, name) != nil {
			return errors.New("still in the executor's cache")
		}
		return nil
	})
}

// TestScheduleTimeoutWaitsBehindSchedulingGates (defect j): a pod held by a
// queue's scheduling gate for longer than the schedule timeout is not failed;
// once the gate is removed it runs.
func TestScheduleTimeoutWaitsBehindSchedulingGates(t *testing.T) {
	env := clustertest.New(t)
	evs := exectest.NewEvents()
	ended := make(chan struct{})
	var once sync.Once
	ex, _ := exectest.StartExecutor(t, env, executor.Config{OnEvent: func(ev executor.Event) {
		evs.Add(ev)
		if ev.Terminal {
			once.Do(func() { close(ended) })
		}
	}})
	tk := exectest.LocalTask("queued", "exit 0", "")
	tk.Spec.Timeouts.Schedule = "2s"
	tk.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/queue"}}
	exectest.Submit(t, ex, "queued", tk)
	waitState(t, ex, "queued", "Pending/Scheduling")
	// Held for twice the schedule timeout (the scenario itself is about time).
	select {
	case <-time.After(4 * time.Second):
	case <-ended:
		t.Fatalf("ended while gated: %+v", evs.Terminal("queued"))
	}
	ctx := context.Background()
	name := podName(t, ex, "queued", 0)
	if _, err := env.Client.CoreV1().Pods(env.Namespace).Patch(ctx, name, "application/merge-patch+json",
		[]byte(`{"spec":{"schedulingGates":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	evs.WaitTerminal(t, time.Minute, "queued")
	if ev := evs.Terminal("queued")[0]; ev.Phase != string(podstate.Succeeded) {
		t.Errorf("outcome %s/%s: %s", ev.Phase, ev.Reason, ev.Message)
	}
}

// TestUnreadableResultEndsTheTask (defect a): when the executor may not exec
// into the result holder (RBAC without pods/exec), the task ends
// Failed/ResultFailed with the cause, and its pod is cleaned up.
func TestUnreadableResultEndsTheTask(t *testing.T) {
	env := clustertest.New(t)
	cfg := restrictedConfig(t, env)
	evs := exectest.NewEvents()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{RESTConfig: cfg, OnEvent: evs.Add, ExecTimeout: 5 * time.Second})
	tk := exectest.LocalTask("result", "echo 42 > /out/result", "")
	tk.Spec.Result = &task.Result{From: task.ResultFromFile, Path: "/out/result"}
	exectest.Submit(t, ex, "result", tk)
	t.Cleanup(func() {
		if r, err := ex.Get(context.Background(), "result"); err == nil && !r.Terminal {
			t.Logf("state %s/%s: %s", r.Phase, r.Reason, r.Message)
		}
	})
	evs.WaitTerminal(t, time.Minute, "result")
	ev := evs.Terminal("result")[0]
	if ev.Reason != string(podstate.ReasonResultFailed) {
		t.Errorf("outcome %s/%s (%s), want Failed/ResultFailed", ev.Phase, ev.Reason, ev.Message)
	}
	exectest.WaitNoTaskPods(t, env, time.Minute)
}

// restrictedConfig returns a REST config for a ServiceAccount that may do
// what the executor does with pods and leases, but not exec into pods.
func restrictedConfig(t *testing.T, env *clustertest.Env) *rest.Config {
	t.Helper()
	ctx := context.Background()
	ns := env.Namespace
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "no-exec"}}
	if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "no-exec"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete", "patch", "update"}},
		{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	}}
	if _, err := env.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "no-exec"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "no-exec"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "no-exec", Namespace: ns}}}
	if _, err := env.Client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "no-exec", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg
}

// podName is the name of the pod of attempt of task id (run by ex): the
// name of its task, the hash of its identity and its record's nonce, and
// the attempt.
func podName(t *testing.T, ex *executor.Executor, id string, attempt int) string {
	t.Helper()
	rec, err := ex.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return task.PodName(task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: id, Executor: rec.Executor, Nonce: rec.Nonce}, attempt)
}

// waitState waits until Get reports state ("Phase/Reason") for id.
func waitState(t *testing.T, ex *executor.Executor, id, state string) {
	t.Helper()
	clustertest.Eventually(t, time.Minute, id+" "+state, func(ctx context.Context) error {
		r, err := ex.Get(ctx, id)
		if err != nil {
			return err
		}
		if got := r.Phase + "/" + r.Reason; got != state {
			return fmt.Errorf("state %s (%s)", got, r.Message)
		}
		return nil
	})
}

func waitTerminalRecord(t *testing.T, ex *executor.Executor, id string, timeout time.Duration) {
	t.Helper()
	clustertest.Eventually(t, timeout, id+" terminal", func(ctx context.Context) error {
		r, err := ex.Get(ctx, id)
		if err != nil {
			return err
		}
		if !r.Terminal {
			return fmt.Errorf("state %s/%s", r.Phase, r.Reason)
		}
		return nil
	})
}
