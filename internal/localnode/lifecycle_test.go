package localnode

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corev1listers "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
)

// The tests in this file drive the provider's lifecycle entry points (CreatePod,
// UpdatePod, DeletePod, GetPodStatus) directly, as virtual-kubelet does, without
// an API server: containers are real host processes (re-execs of this test
// binary, in their own namespaces when run as root), timers run on a fake
// clock, and the API is a fake clientset behind the node's status-only client.
// test/integration/cluster/localnode_test.go proves the same node against a real
// control plane.

// sink stands in for virtual-kubelet's status updates: it keeps every status the
// provider publishes and writes it, as virtual-kubelet does, with UpdateStatus
// on the copy of the pod it cached when the pod was created, through the
// node's client.
type sink struct {
	t      *testing.T
	client statusOnlyClient

	mu      sync.Mutex
	cached  map[string]*corev1.Pod   // by name: the pod as created
	history map[string][]*corev1.Pod // by name: every published pod
	changed chan struct{}            // closed and replaced at each publish
}

func (s *sink) publish(pod *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.history[pod.Name] = append(s.history[pod.Name], pod.DeepCopy())
	close(s.changed)
	s.changed = make(chan struct{})
	if stale := s.cached[pod.Name]; stale != nil {
		stale = stale.DeepCopy()
		stale.Status = pod.Status
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := s.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, stale, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			s.t.Errorf("status write of %s: %v", pod.Name, err)
		}
	}
}

// harness is one provider with a fake clock, a fake API and a status sink.
type harness struct {
	t      *testing.T
	p      *provider
	clock  *clocktesting.FakeClock
	api    *fake.Clientset
	pods   cache.Indexer // the provider's pod lister reads this
	sink   *sink
	cancel context.CancelFunc
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	api := fake.NewClientset()
	h := &harness{
		t:     t,
		clock: clocktesting.NewFakeClock(time.Now()), // near the processes' real timestamps
		api:   api,
		pods:  cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
	}
	h.sink = &sink{t: t, client: statusOnlyClient{api}, cached: map[string]*corev1.Pod{}, history: map[string][]*corev1.Pod{}, changed: make(chan struct{})}
	h.p = newProvider(providerConfig{
		nodeName: "unit",
		dir:      t.TempDir(),
		client:   statusOnlyClient{api},
		log:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		apiHost:  "127.0.0.1",
		apiPort:  "6443",
		cpu:      resource.MustParse("4"),
		memory:   resource.MustParse("8Gi"),
		clock:    h.clock,
	})
	h.p.pods = corev1listers.NewPodLister(h.pods)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.p.start(ctx)
	h.p.NotifyPods(ctx, h.sink.publish)
	t.Cleanup(func() {
		cancel()
		h.p.shutdown(0) // kills what still runs and waits for every pod worker
	})
	return h
}

// pod builds a pod as the API server would hand it to the node: bound, with a
// UID, restartPolicy Never and the finalizer a controller such as kubetask sets.
func testPod(name string, containers ...corev1.Container) *corev1.Pod {
	grace := int64(30)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "unit", UID: types.UID("uid-" + name),
			Finalizers: []string{"kubetask.dev/outcome"},
		},
		Spec: corev1.PodSpec{
			NodeName:                      "unit",
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    containers,
		},
	}
}

func shCtr(name, script string) corev1.Container {
	return corev1.Container{Name: name, Image: "busybox", Command: []string{"sh", "-c", script}}
}

func nativeSidecar(name, script string) corev1.Container {
	c := shCtr(name, script)
	always := corev1.ContainerRestartPolicyAlways
	c.RestartPolicy = &always
	return c
}

// trapTERM runs until SIGTERM, then exits 0 (as PID 1 it needs the trap).
const trapTERM = `trap 'exit 0' TERM; while :; do sleep 0.1; done`

// trapped returns a script that runs handler on SIGTERM and otherwise keeps
// running, and the file it creates once its trap is installed. The shell is
// PID 1 of its container, which ignores a SIGTERM that arrives before the trap
// is installed (as in a real container, whose PID 1 without a handler lives
// until SIGKILL): a test that signals it waits for the file first
// (waitFile), or the signal may be lost on a busy machine.
func trapped(t *testing.T, handler string) (script, ready string) {
	ready = filepath.Join(t.TempDir(), "trap-installed")
	return fmt.Sprintf(`trap '%s' TERM; touch %s; while :; do sleep 0.1; done`, handler, ready), ready
}

// create stores the pod in the fake API and the lister, hands it to the
// provider, then removes its finalizer from the API, as a controller that has
// recorded what it needed would: the node's later status writes, made from
// copies that still carry it, must not bring it back.
func (h *harness) create(p *corev1.Pod) {
	h.t.Helper()
	ctx := context.Background()
	if _, err := h.api.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	if err := h.pods.Add(p.DeepCopy()); err != nil {
		h.t.Fatal(err)
	}
	h.sink.mu.Lock()
	h.sink.cached[p.Name] = p.DeepCopy()
	h.sink.mu.Unlock()
	if err := h.p.CreatePod(ctx, p.DeepCopy()); err != nil {
		h.t.Fatalf("CreatePod: %v", err)
	}
	if _, err := h.api.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// wait waits until the latest published status of the pod satisfies cond, and
// returns that pod.
func (h *harness) wait(name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	h.t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		h.sink.mu.Lock()
		hist := h.sink.history[name]
		ch := h.sink.changed
		h.sink.mu.Unlock()
		var last *corev1.Pod
		if len(hist) > 0 {
			last = hist[len(hist)-1]
			if cond(last) {
				return last
			}
		}
		select {
		case <-ch:
		case <-deadline.C:
			h.t.Fatalf("pod %s: %s: not reached in 30s; last status:\n%s", name, what, dump(last))
		}
	}
}

func dump(p *corev1.Pod) string {
	if p == nil {
		return "(none published)"
	}
	b, _ := json.MarshalIndent(p.Status, "", "  ")
	return string(b)
}

// checkNoFinalizerCameBack checks that the API object lost its finalizer for good.
func (h *harness) checkNoFinalizerCameBack(name string) {
	h.t.Helper()
	p, err := h.api.CoreV1().Pods("unit").Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		h.t.Fatal(err)
	}
	if len(p.Finalizers) != 0 {
		h.t.Errorf("pod %s: finalizers %v came back with a status write", name, p.Finalizers)
	}
}

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func ctrStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

func ctrTerminated(p *corev1.Pod, name string) *corev1.ContainerStateTerminated {
	if s := ctrStatus(p, name); s != nil {
		return s.State.Terminated
	}
	return nil
}

func ctrRunning(p *corev1.Pod, name string) bool {
	s := ctrStatus(p, name)
	return s != nil && s.State.Running != nil
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// wantTerminated checks a container's terminated state the way the kubelet
// reports it: exit code, reason, and start and finish times in order.
func wantTerminated(t *testing.T, p *corev1.Pod, name string, code int32) {
	t.Helper()
	tm := ctrTerminated(p, name)
	if tm == nil {
		t.Errorf("container %s not terminated: %+v", name, ctrStatus(p, name))
		return
	}
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	if tm.ExitCode != code || tm.Reason != reason {
		t.Errorf("container %s: exit code %d reason %q, want %d %q", name, tm.ExitCode, tm.Reason, code, reason)
	}
	if tm.StartedAt.IsZero() || tm.FinishedAt.IsZero() || tm.FinishedAt.Before(&tm.StartedAt) {
		t.Errorf("container %s: startedAt %v finishedAt %v", name, tm.StartedAt, tm.FinishedAt)
	}
	if !strings.HasPrefix(tm.ContainerID, "kubetask://") {
		t.Errorf("container %s: containerID %q", name, tm.ContainerID)
	}
}

func TestPodLifecycle(t *testing.T) {
	cases := map[string]struct {
		pod func(dir string) *corev1.Pod
		// until is the state the case waits for.
		until func(*corev1.Pod) bool
		check func(t *testing.T, p *corev1.Pod, dir string)
	}{
		"exit 0: Succeeded": {
			pod:   func(string) *corev1.Pod { return testPod("ok", shCtr("main", "echo done")) },
			until: terminal,
			check: func(t *testing.T, p *corev1.Pod, _ string) {
				if p.Status.Phase != corev1.PodSucceeded {
					t.Errorf("phase %s, want Succeeded", p.Status.Phase)
				}
				wantTerminated(t, p, "main", 0)
				if c := podCondition(p, corev1.PodReady); c == nil || c.Status != corev1.ConditionFalse || c.Reason != reasonPodCompleted {
					t.Errorf("Ready condition %+v, want False/PodCompleted", c)
				}
			},
		},
		"non-zero exit: Failed with the code": {
			pod:   func(string) *corev1.Pod { return testPod("fail", shCtr("main", "exit 3")) },
			until: terminal,
			check: func(t *testing.T, p *corev1.Pod, _ string) {
				if p.Status.Phase != corev1.PodFailed {
					t.Errorf("phase %s, want Failed", p.Status.Phase)
				}
				wantTerminated(t, p, "main", 3)
			},
		},
		"executable not found: StartError 128, Failed": {
			pod: func(string) *corev1.Pod {
				return testPod("notfound", corev1.Container{Name: "main", Image: "busybox", Command: []string{"kubetask-no-such-command"}})
			},
			until: terminal,
			check: func(t *testing.T, p *corev1.Pod, _ string) {
				tm := ctrTerminated(p, "main")
				if p.Status.Phase != corev1.PodFailed || tm == nil || tm.ExitCode != 128 || tm.Reason != "StartError" || tm.FinishedAt.IsZero() {
					t.Errorf("phase %s, terminated %+v; want Failed, StartError 128", p.Status.Phase, tm)
				}
			},
		},
		"args without a command run alone (kubectl run --image=busybox -- ...)": {
			pod: func(string) *corev1.Pod {
				return testPod("args-only", corev1.Container{Name: "main", Image: "busybox", Args: []string{"sh", "-c", "exit 4"}})
			},
			until: terminal,
			check: func(t *testing.T, p *corev1.Pod, _ string) {
				if p.Status.Phase != corev1.PodFailed {
					t.Errorf("phase %s, want Failed", p.Status.Phase)
				}
				wantTerminated(t, p, "main", 4)
			},
		},
		"neither command nor args: CreateContainerError, Pending": {
			pod: func(string) *corev1.Pod {
				return testPod("no-command", corev1.Container{Name: "main", Image: "nginx"})
			},
			until: func(p *corev1.Pod) bool {
				s := ctrStatus(p, "main")
				return s != nil && s.State.Waiting != nil && s.State.Waiting.Reason == "CreateContainerError"
			},
			check: func(t *testing.T, p *corev1.Pod, _ string) {
				if p.Status.Phase != corev1.PodPending {
					t.Errorf("phase %s, want Pending", p.Status.Phase)
				}
				if msg := ctrStatus(p, "main").State.Waiting.Message; !strings.Contains(msg, "no command and no args") {
					t.Errorf("message %q", msg)
				}
			},
		},
		"regular sidecar keeps the pod Running after main exits": {
			pod: func(string) *corev1.Pod {
				return testPod("regular-sidecar", shCtr("main", "exit 3"), shCtr("proxy", trapTERM))
			},
			until: func(p *corev1.Pod) bool { return ctrTerminated(p, "main") != nil && ctrRunning(p, "proxy") },
			check: func(t *testing.T, p *corev1.Pod, _ string) {
				if p.Status.Phase != corev1.PodRunning {
					t.Errorf("phase %s, want Running", p.Status.Phase)
				}
				wantTerminated(t, p, "main", 3)
				if c := podCondition(p, corev1.PodReady); c == nil || c.Status != corev1.ConditionFalse || c.Reason != reasonContainersNotReady {
					t.Errorf("Ready condition %+v, want False/ContainersNotReady", c)
				}
			},
		},
		"OnFailure restarts with restartCount and lastState": {
			pod: func(dir string) *corev1.Pod {
				p := testPod("onfailure", shCtr("main", fmt.Sprintf(`if [ -e %[1]s/once ]; then exit 0; fi; touch %[1]s/once; exit 1`, dir)))
				p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
				return p
			},
			until: terminal,
			check: func(t *testing.T, p *corev1.Pod, _ string) {
				if p.Status.Phase != corev1.PodSucceeded {
					t.Errorf("phase %s, want Succeeded", p.Status.Phase)
				}
				wantTerminated(t, p, "main", 0)
				s := ctrStatus(p, "main")
				if last := s.LastTerminationState.Terminated; s.RestartCount != 1 || last == nil || last.ExitCode != 1 || last.Reason != "Error" {
					t.Errorf("restartCount %d lastState %+v, want 1 and exit 1", s.RestartCount, s.LastTerminationState)
				}
			},
		},
		"native sidecars are stopped in reverse order after the regular containers exit": {
			pod: func(dir string) *corev1.Pod {
				stopOn := func(name string) string {
					return fmt.Sprintf(`trap 'echo %s >> %s/order; exit 0' TERM; while :; do sleep 0.1; done`, name, dir)
				}
				p := testPod("native", shCtr("main", "exit 0"))
				p.Spec.InitContainers = []corev1.Container{nativeSidecar("first", stopOn("first")), nativeSidecar("second", stopOn("second"))}
				return p
			},
			until: terminal,
			check: func(t *testing.T, p *corev1.Pod, dir string) {
				if p.Status.Phase != corev1.PodSucceeded {
					t.Errorf("phase %s, want Succeeded", p.Status.Phase)
				}
				for _, n := range []string{"main", "first", "second"} {
					wantTerminated(t, p, n, 0)
				}
				order, err := os.ReadFile(filepath.Join(dir, "order"))
				if err != nil || string(order) != "second\nfirst\n" {
					t.Errorf("sidecars stopped in order %q (%v), want second then first", order, err)
				}
			},
		},
		"failed init container fails the pod; main never starts": {
			pod: func(dir string) *corev1.Pod {
				p := testPod("init-fails", shCtr("main", "touch "+dir+"/main-ran"))
				p.Spec.InitContainers = []corev1.Container{shCtr("setup", "exit 2")}
				return p
			},
			until: terminal,
			check: func(t *testing.T, p *corev1.Pod, dir string) {
				if p.Status.Phase != corev1.PodFailed {
					t.Errorf("phase %s, want Failed", p.Status.Phase)
				}
				wantTerminated(t, p, "setup", 2)
				if s := ctrStatus(p, "main"); s == nil || s.State.Waiting == nil || s.State.Waiting.Reason != "PodInitializing" {
					t.Errorf("main status %+v, want waiting PodInitializing", s)
				}
				if c := podCondition(p, corev1.PodInitialized); c == nil || c.Status != corev1.ConditionFalse || c.Reason != reasonNotInitialized {
					t.Errorf("Initialized condition %+v, want False/%s", c, reasonNotInitialized)
				}
				if _, err := os.Stat(filepath.Join(dir, "main-ran")); err == nil {
					t.Error("main ran although its init container failed")
				}
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			dir := t.TempDir()
			p := tc.pod(dir)
			h.create(p)
			got := h.wait(p.Name, "the awaited state", tc.until)
			tc.check(t, got, dir)
			if st, err := h.p.GetPodStatus(context.Background(), p.Namespace, p.Name); err != nil || st.Phase != got.Status.Phase {
				t.Errorf("GetPodStatus = %v, %v; want phase %s", st, err, got.Status.Phase)
			}
			h.checkNoFinalizerCameBack(p.Name)
		})
	}
}

// deletePod marks the pod deleted in the fake API and the lister, as the API
// server does for a graceful delete, and tells the provider, as
// virtual-kubelet does.
func (h *harness) deletePod(name string, grace int64) {
	h.t.Helper()
	ctx := context.Background()
	p, err := h.api.CoreV1().Pods("unit").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	now := metav1.NewTime(h.clock.Now())
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, &grace
	if _, err := h.api.CoreV1().Pods("unit").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	if err := h.pods.Update(p.DeepCopy()); err != nil {
		h.t.Fatal(err)
	}
	if err := h.p.DeletePod(ctx, p.DeepCopy()); err != nil {
		h.t.Fatalf("DeletePod: %v", err)
	}
}

// waitGoneFromAPI waits until the node has deleted the pod object.
func (h *harness) waitGoneFromAPI(name string) {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := h.api.CoreV1().Pods("unit").Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("pod %s still in the API 30s after its processes stopped (err %v)", name, err)
		}
		time.Sleep(20 * time.Millisecond) // poll interval of a condition with a deadline
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear in 30s", path)
		}
		time.Sleep(20 * time.Millisecond) // poll interval of a condition with a deadline
	}
}

// TestDeletionTermThenKillAfterGrace: a graceful delete sends SIGTERM at once
// and SIGKILL only when the grace period has passed (on the fake clock); once
// the processes are gone the node writes the final status and deletes the
// object with grace 0, and a second DeletePod (the object is gone) forgets the
// pod and removes its files.
func TestDeletionTermThenKillAfterGrace(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	dir := t.TempDir()
	term := filepath.Join(dir, "got-term")
	// Notes SIGTERM and keeps running: only SIGKILL ends it.
	stubborn, stubbornReady := trapped(t, "touch "+term)
	polite, politeReady := trapped(t, "exit 0")
	h.create(testPod("stubborn", shCtr("main", stubborn)))
	h.create(testPod("polite", shCtr("main", polite)))
	for _, n := range []string{"stubborn", "polite"} {
		h.wait(n, "running", func(p *corev1.Pod) bool { return ctrRunning(p, "main") })
	}
	waitFile(t, stubbornReady)
	waitFile(t, politeReady)

	h.deletePod("polite", 30)
	h.deletePod("stubborn", 30)
	// The polite pod ends on SIGTERM without the clock moving.
	got := h.wait("polite", "terminal", terminal)
	wantTerminated(t, got, "main", 0)
	h.waitGoneFromAPI("polite")

	waitFile(t, term)
	w := h.p.worker("unit", "stubborn")
	w.mu.Lock()
	alive, finished := len(w.liveProcs()), w.finished
	w.mu.Unlock()
	if alive != 1 || finished {
		t.Fatalf("after SIGTERM, before the grace period: %d live processes, finished %v; want the process still running", alive, finished)
	}
	h.clock.Step(29 * time.Second)
	if p, _ := h.p.GetPod(context.Background(), "unit", "stubborn"); ctrTerminated(p, "main") != nil {
		t.Fatalf("killed before the grace period ended: %+v", ctrStatus(p, "main"))
	}
	h.clock.Step(time.Second)
	got = h.wait("stubborn", "terminal", terminal)
	if p := got.Status.Phase; p != corev1.PodFailed {
		t.Errorf("phase %s, want Failed (SIGKILL)", p)
	}
	wantTerminated(t, got, "main", 137)
	h.waitGoneFromAPI("stubborn")

	var deletes []k8stesting.DeleteAction
	for _, a := range h.api.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok && a.GetResource().Resource == "pods" {
			deletes = append(deletes, d)
		}
	}
	for _, d := range deletes {
		o := d.GetDeleteOptions()
		if o.GracePeriodSeconds == nil || *o.GracePeriodSeconds != 0 || o.Preconditions == nil || o.Preconditions.UID == nil {
			t.Errorf("delete of %s with %+v; want grace 0 and a UID precondition", d.GetName(), o)
		}
	}
	if len(deletes) != 2 {
		t.Errorf("%d pod deletions, want 2", len(deletes))
	}

	// virtual-kubelet calls DeletePod again once the object is gone.
	for _, n := range []string{"stubborn", "polite"} {
		p := testPod(n)
		if err := h.pods.Delete(p); err != nil {
			t.Fatal(err)
		}
		wdir := h.p.worker("unit", n).dir
		if err := h.p.DeletePod(context.Background(), p); err != nil {
			t.Fatalf("DeletePod after the object is gone: %v", err)
		}
		if _, err := h.p.GetPodStatus(context.Background(), "unit", n); err == nil {
			t.Errorf("%s still known to the provider", n)
		}
		if _, err := os.Stat(wdir); !os.IsNotExist(err) {
			t.Errorf("pod directory %s left: %v", wdir, err)
		}
	}
}

// TestLoweringActiveDeadlineEndsPod: UpdatePod with a lower
// activeDeadlineSeconds takes effect on the running pod: when it passes (on the
// fake clock) the containers get SIGTERM and the pod ends Failed,
// DeadlineExceeded.
func TestLoweringActiveDeadlineEndsPod(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	hour := int64(3600)
	script, ready := trapped(t, "exit 0")
	p := testPod("deadline", shCtr("main", script))
	p.Spec.ActiveDeadlineSeconds = &hour
	h.create(p)
	h.wait("deadline", "running", func(p *corev1.Pod) bool { return ctrRunning(p, "main") })
	waitFile(t, ready) // the SIGTERM at the deadline would be lost before it

	ten := int64(10)
	p = p.DeepCopy()
	p.Spec.ActiveDeadlineSeconds = &ten
	if err := h.p.UpdatePod(context.Background(), p); err != nil {
		t.Fatalf("UpdatePod: %v", err)
	}
	h.clock.Step(9 * time.Second)
	if got, _ := h.p.GetPod(context.Background(), "unit", "deadline"); !ctrRunning(got, "main") {
		t.Fatalf("stopped before the deadline: %s", dump(got))
	}
	h.clock.Step(time.Second)
	got := h.wait("deadline", "terminal", terminal)
	if got.Status.Phase != corev1.PodFailed || got.Status.Reason != reasonDeadlineExceeded || got.Status.Message != messageDeadlineExceeded {
		t.Errorf("phase %s reason %q message %q, want Failed %s", got.Status.Phase, got.Status.Reason, got.Status.Message, reasonDeadlineExceeded)
	}
	wantTerminated(t, got, "main", 0) // it exits 0 on SIGTERM
	h.checkNoFinalizerCameBack("deadline")
}

// TestStatusWriteReplacesOnlyStatus: virtual-kubelet writes status with
// UpdateStatus on its cached copy of the pod; through the node's client that
// write changes .status and nothing else, so a finalizer removed since the copy
// was cached stays removed.
func TestStatusWriteReplacesOnlyStatus(t *testing.T) {
	stored := testPod("p")
	stored.Finalizers = nil // removed by a controller after the node cached its copy
	api := fake.NewClientset(stored)
	stale := testPod("p")
	stale.Labels = map[string]string{"stale": "yes"}
	stale.Status.Phase = corev1.PodSucceeded

	if _, err := (statusOnlyClient{api}).CoreV1().Pods("unit").UpdateStatus(context.Background(), stale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	acts := api.Actions()
	got, err := api.CoreV1().Pods("unit").Get(context.Background(), "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Finalizers) != 0 || len(got.Labels) != 0 {
		t.Errorf("metadata after the status write: finalizers %v labels %v; want both unchanged (empty)", got.Finalizers, got.Labels)
	}
	if got.Status.Phase != corev1.PodSucceeded {
		t.Errorf("phase %s, want the written Succeeded", got.Status.Phase)
	}
	last, ok := acts[len(acts)-1].(k8stesting.PatchAction)
	if !ok || last.GetSubresource() != "status" || last.GetPatchType() != types.JSONPatchType {
		t.Fatalf("last action %#v, want a JSON patch of the status subresource", acts[len(acts)-1])
	}
	var ops []map[string]any
	if err := json.Unmarshal(last.GetPatch(), &ops); err != nil {
		t.Fatal(err)
	}
	if len(ops) != 1 || ops[0]["op"] != "replace" || ops[0]["path"] != "/status" {
		t.Errorf("patch %s, want one replace of /status", last.GetPatch())
	}
}
