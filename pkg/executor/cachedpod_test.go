package executor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/podlog"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/task"
)

var realisticIdent = task.Identity{Namespace: "data", Name: "etl-daily", RunID: "r-000042", Executor: "kubetask-0"}

// realisticPod is podtest.RunningPod of RealisticTask, attempt 0.
func realisticPod(t testing.TB) *corev1.Pod {
	t.Helper()
	p, err := podtest.RunningPod(podtest.RealisticTask(realisticIdent.Name), realisticIdent, 0, 42)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCachedPodView: of a pod as the API server returns it, the executor
// keeps exactly the fields cachedPod lists; this is the whole of it.
func TestCachedPodView(t *testing.T) {
	full := realisticPod(t)
	ann := func(k string) string { return full.Annotations[k] }
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "data", Name: full.Name, UID: full.UID, ResourceVersion: full.ResourceVersion,
			CreationTimestamp: full.CreationTimestamp, Finalizers: []string{task.Finalizer},
			Labels: task.PodLabels(realisticIdent, 0),
			Annotations: map[string]string{
				task.AnnotationTaskNamespace: "data", task.AnnotationTaskName: "etl-daily", task.AnnotationRun: "r-000042",
				task.AnnotationAttempt: "0", task.AnnotationExecutor: "kubetask-0", task.AnnotationMainContainer: ann(task.AnnotationMainContainer),
			},
		},
		Spec: corev1.PodSpec{
			NodeName: full.Spec.NodeName, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{
				{Name: "main", Image: "registry.example.com/data-platform/etl:v2.14.1"},
				{Name: "envoy", Image: "docker.io/envoyproxy/envoy:v1.31.2"},
			},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, StartTime: full.Status.StartTime,
			Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: full.CreationTimestamp}},
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: "main", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: full.Status.ContainerStatuses[0].State.Running.StartedAt}}},
				{Name: "envoy", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: full.Status.ContainerStatuses[1].State.Running.StartedAt}}},
			},
		},
	}
	if diff := cmp.Diff(want, compactPod(full).pod()); diff != "" {
		t.Errorf("cached view (-want +got):\n%s", diff)
	}
}

// TestCachedPodKeepsKubetaskMetadata: every label and annotation kubetask
// puts on a pod, or reads, is kept (a key added to BuildPod and not to
// sharedKeys or ownKeys fails here); others are not.
func TestCachedPodKeepsKubetaskMetadata(t *testing.T) {
	tk := podtest.RealisticTask("etl-daily")
	tk.Spec.Result = &task.Result{From: task.ResultFromFile, Path: "/out/result.json"}
	tk.Default()
	pod, err := task.BuildPod(tk, realisticIdent, 3)
	if err != nil {
		t.Fatal(err)
	}
	// What a release adds; an empty value is kept as set, too.
	for _, released := range []string{"true", ""} {
		pod.Labels[task.LabelReleased] = released
		got := compactPod(pod).pod()
		for _, m := range []struct {
			kind      string
			full, got map[string]string
		}{{"label", pod.Labels, got.Labels}, {"annotation", pod.Annotations, got.Annotations}} {
			for k, v := range m.full {
				ours := strings.HasPrefix(k, task.Prefix) || k == task.LabelManagedBy
				if g, ok := m.got[k]; ours && (!ok || g != v) {
					t.Errorf("%s %s=%q not kept (got %q, %v)", m.kind, k, v, g, ok)
				} else if !ours && ok {
					t.Errorf("%s %s of the template kept", m.kind, k)
				}
			}
		}
		if id, n, err := task.IdentityFromPod(got); err != nil || id != realisticIdent || n != 3 {
			t.Errorf("IdentityFromPod of the cached pod = %v, %d, %v", id, n, err)
		}
	}
}

// TestCachedPodOwnsItsMemory: a cachedPod refers to nothing of the pod it
// was made from but (immutable) strings, so the decoded pod can be
// collected, and a change to it does not show in the cache.
func TestCachedPodOwnsItsMemory(t *testing.T) {
	full := realisticPod(t)
	full.Spec.Containers[0].RestartPolicy = ptrTo(corev1.ContainerRestartPolicyOnFailure)
	full.Spec.Containers[0].RestartPolicyRules = []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart,
		ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{42}}}}
	full.DeletionTimestamp, full.DeletionGracePeriodSeconds = &metav1.Time{Time: podtest.T0}, ptrTo(int64(30))
	full.Spec.ActiveDeadlineSeconds = ptrTo(int64(600))
	c := compactPod(full)
	before := c.pod()
	full.Labels[task.LabelRun], full.Annotations[task.AnnotationRun] = "changed", "changed"
	full.Finalizers[0] = "changed"
	*full.Spec.Containers[0].RestartPolicy = corev1.ContainerRestartPolicyAlways
	full.Spec.Containers[0].RestartPolicyRules[0].ExitCodes.Values[0] = 1
	full.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.Time{}
	full.Status.StartTime.Time = time.Time{}
	full.Status.Conditions[4].LastTransitionTime = metav1.Time{}
	full.DeletionTimestamp.Time, *full.DeletionGracePeriodSeconds, *full.Spec.ActiveDeadlineSeconds = time.Time{}, 0, 0
	if diff := cmp.Diff(before, c.pod()); diff != "" {
		t.Errorf("a change to the source pod shows in the cache (-before +after):\n%s", diff)
	}
}

// TestCachedPodKeepsWhatIsRead: on pods in the states the executor decides
// on, everything that reads a cached pod answers on the cached view as on
// the whole pod.
func TestCachedPodKeepsWhatIsRead(t *testing.T) {
	base := realisticPod(t)
	at := base.Status.StartTime.Add(time.Minute)
	terminated := func(code int32, msg string) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Completed", Message: msg,
			StartedAt: *base.Status.StartTime, FinishedAt: metav1.NewTime(at), ContainerID: "containerd://x"}}
	}
	cases := map[string]func(p *corev1.Pod){
		"running": func(*corev1.Pod) {},
		"main exited 0 with a result, sidecar runs": func(p *corev1.Pod) {
			p.Status.ContainerStatuses[0].State = terminated(0, `{"rows":12}`)
		},
		"main restarted after exit 3": func(p *corev1.Pod) {
			p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
			p.Status.ContainerStatuses[0].RestartCount = 1
			p.Status.ContainerStatuses[0].LastTerminationState = terminated(3, "boom")
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s"}}
		},
		"evicted while being deleted": func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
				Reason: "EvictionByEvictionAPI", Message: "Eviction API: evicting", LastTransitionTime: metav1.NewTime(at)})
			p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &metav1.Time{Time: at.Add(30 * time.Second)}, ptrTo(int64(30))
		},
		"stopped by kubetask, failed": func(p *corev1.Pod) {
			p.Spec.ActiveDeadlineSeconds = ptrTo(int64(61))
			p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
			p.Status.ContainerStatuses[0].State = terminated(0, "")
			p.Status.ContainerStatuses[1].State = terminated(143, "")
		},
		"released and kept": func(p *corev1.Pod) {
			p.Labels[task.LabelReleased] = "true"
			p.Finalizers = []string{"example.com/other"}
		},
		"finalizer second": func(p *corev1.Pod) { p.Finalizers = []string{"example.com/other", task.Finalizer} },
		"gated, unscheduled": func(p *corev1.Pod) {
			p.Spec.NodeName, p.Status = "", corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
				Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonSchedulingGated, Message: "blocked"}}}
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}}
		},
		"image pull failing, with a native sidecar": func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "istio-proxy", Image: "istio/proxyv2:1.24", RestartPolicy: ptrTo(corev1.ContainerRestartPolicyAlways)}}
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "istio-proxy", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image"}}
		},
		"adopted from another executor": func(p *corev1.Pod) {
			p.Labels[task.LabelExecutor], p.Annotations[task.AnnotationExecutor] = "kubetask-old", "kubetask-old"
		},
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			p := base.DeepCopy()
			edit(p)
			for _, pol := range []podstate.Policy{{MainContainer: "main"}, {MainContainer: "main", StartupTimeout: time.Minute, RunTimeout: 30 * time.Second}, {}} {
				checkSameAnswers(t, p, pol, at)
			}
		})
	}
}

// FuzzCachedPod: on arbitrary pods (podtest.Arbitrary, FuzzDerive's), with
// arbitrary kubetask metadata (meta), everything that reads a cached pod
// answers on the cached view as on the whole pod. FuzzDerive's seeds and
// pseudo-random inputs are its seeds; run `go test -fuzz FuzzCachedPod
// ./pkg/executor` to look further.
func FuzzCachedPod(f *testing.F) {
	seeds, _ := filepath.Glob("../podstate/testdata/fuzz/FuzzDerive/*")
	for i, file := range seeds {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		lit, ok := strings.CutPrefix(lines[len(lines)-1], "[]byte(")
		data, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
		if !ok || err != nil {
			f.Fatalf("seed %s: %q", file, lines[len(lines)-1])
		}
		f.Add([]byte(data), uint16(i*37))
	}
	r := rand.New(rand.NewPCG(13, 13))
	for range 1500 {
		data := make([]byte, r.IntN(64))
		for i := range data {
			data[i] = byte(r.UintN(256))
		}
		f.Add(data, uint16(r.UintN(1<<16)))
	}
	f.Fuzz(func(t *testing.T, data []byte, meta uint16) {
		pod, p, now := podtest.Arbitrary(data)
		if pod == nil {
			return
		}
		withMeta(pod, meta)
		checkSameAnswers(t, pod, p, now)
	})
}

// withMeta gives pod kubetask metadata as meta's bits choose: the identity
// labels and annotations (consistent or not), the template's own, the
// released label, finalizers in some order, a resourceVersion.
func withMeta(pod *corev1.Pod, meta uint16) {
	bit := func(i int) bool { return meta&(1<<i) != 0 }
	id := task.Identity{Namespace: pod.Namespace, Name: "job", RunID: "run-1", Executor: "ex"}
	if bit(0) || bit(9) {
		pod.Name = task.PodName(id, 2)
		pod.Labels = task.PodLabels(id, 2)
		pod.Annotations = map[string]string{task.AnnotationTaskNamespace: id.Namespace, task.AnnotationTaskName: id.Name,
			task.AnnotationRun: id.RunID, task.AnnotationAttempt: "2", task.AnnotationExecutor: id.Executor, task.AnnotationMainContainer: "base"}
	}
	if bit(1) {
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Labels["team"], pod.Annotations["prometheus.io/scrape"] = "data", "true"
	}
	if bit(2) && pod.Labels != nil {
		pod.Labels[task.LabelReleased] = "true"
	}
	if bit(3) && pod.Labels != nil {
		pod.Labels[task.LabelAttempt] = "7" // disagrees with the annotation
	}
	if bit(4) && pod.Labels != nil {
		pod.Labels[task.LabelExecutor], pod.Annotations[task.AnnotationExecutor] = "old", "old"
	}
	if bit(5) && pod.Labels != nil {
		pod.Labels[task.LabelRun] = "" // present, empty
	}
	switch (meta >> 6) & 3 {
	case 1:
		pod.Finalizers = []string{task.Finalizer}
	case 2:
		pod.Finalizers = []string{"example.com/a", task.Finalizer}
	case 3:
		pod.Finalizers = []string{task.Finalizer, "example.com/a", "example.com/b"}
	}
	if bit(8) {
		pod.ResourceVersion = "12345"
	}
}

// checkSameAnswers fails t unless every reader of cached pods gives the
// same answer on compactPod(full).pod() as on full: podstate, podlog,
// task.IdentityFromPod, attempt's result reading and API calls, the
// executor's own checks.
func checkSameAnswers(t *testing.T, full *corev1.Pod, p podstate.Policy, now time.Time) {
	t.Helper()
	c := compactPod(full)
	view := c.pod()
	if again := compactPod(view).pod(); !cmp.Equal(view, again) {
		t.Fatalf("compacting the view changes it:\n%s", cmp.Diff(view, again))
	}
	same := func(what string, a, b any) {
		t.Helper()
		if !cmp.Equal(a, b) {
			t.Fatalf("%s differs on the cached pod (-whole +cached):\n%s", what, cmp.Diff(a, b))
		}
	}
	for _, pol := range []podstate.Policy{p, {MainContainer: p.MainContainer}} {
		same("podstate.Derive", podstate.Derive(full, pol, now), podstate.Derive(view, pol, now))
	}
	same("podstate.Stopped", podstate.Stopped(full), podstate.Stopped(view))
	secsA, okA := podstate.StopDeadlineSeconds(full, now)
	secsB, okB := podstate.StopDeadlineSeconds(view, now)
	same("podstate.StopDeadlineSeconds", []any{secsA, okA}, []any{secsB, okB})
	same("podstate.DefaultMainContainer", podstate.DefaultMainContainer(&full.Spec), podstate.DefaultMainContainer(&view.Spec))

	names := []string{"missing", task.ResultContainer}
	for _, l := range [][]corev1.Container{full.Spec.Containers, full.Spec.InitContainers} {
		for _, ctr := range l {
			names = append(names, ctr.Name)
		}
	}
	for _, l := range [][]corev1.ContainerStatus{full.Status.ContainerStatuses, full.Status.InitContainerStatuses} {
		for _, st := range l {
			names = append(names, st.Name)
		}
	}
	for _, n := range names {
		same("podlog.ProgressOf "+n, podlog.ProgressOf(full, n), podlog.ProgressOf(view, n))
		tk := &task.Task{}
		tk.Spec.MainContainer = n
		tk.Spec.Result = &task.Result{From: task.ResultFromTerminationMessage, MaxBytes: "4Ki"}
		ra, ea := attempt.ReadResult(context.Background(), nil, full, tk)
		rb, eb := attempt.ReadResult(context.Background(), nil, view, tk)
		same("attempt.ReadResult "+n, []any{ra, fmt.Sprint(ea)}, []any{rb, fmt.Sprint(eb)})
		same("mainFinishedAt "+n, mainFinishedAt(full, n), mainFinishedAt(view, n))
		same("stoppingPhase "+n, stoppingPhase(full, tk), stoppingPhase(view, tk))
	}
	same("attempt.ResultRetryable", attempt.ResultRetryable(errors.New("reset"), full), attempt.ResultRetryable(errors.New("reset"), view))

	idA, nA, errA := task.IdentityFromPod(full)
	idB, nB, errB := task.IdentityFromPod(view)
	// (Which disagreeing label an error names depends on map order.)
	same("task.IdentityFromPod", []any{idA, nA, errA == nil}, []any{idB, nB, errB == nil})
	same("metadata", []any{full.Namespace, full.Name, full.ResourceVersion, full.Labels[task.LabelRun], full.Labels[task.LabelExecutor],
		full.Labels[task.LabelReleased], hasFinalizer(full), slices.Index(full.Finalizers, task.Finalizer)},
		[]any{view.Namespace, view.Name, view.ResourceVersion, view.Labels[task.LabelRun], view.Labels[task.LabelExecutor],
			view.Labels[task.LabelReleased], hasFinalizer(view), slices.Index(view.Finalizers, task.Finalizer)})
	wantRun := full.Annotations[task.AnnotationRun] // the exact ID
	if wantRun == "" {
		wantRun = full.Labels[task.LabelRun]
	}
	if c.key() != full.Namespace+"/"+full.Name || c.run() != wantRun {
		t.Fatalf("key %q, run %q", c.key(), c.run())
	}
	same("scheduling gates", []any{len(full.Spec.SchedulingGates) > 0, gatedCondition(full)}, []any{len(view.Spec.SchedulingGates) > 0, gatedCondition(view)})
	for _, kind := range []actionKind{actDelete, actStop, actRelease} {
		for _, mark := range []bool{false, true} {
			a := &podAction{kind: kind, pod: full, at: now, mark: mark}
			b := &podAction{kind: kind, pod: view, at: now, mark: mark}
			same(fmt.Sprintf("podAction.reflected %s", kind), a.reflected(full), b.reflected(view))
		}
	}
	// The API calls made from a cached pod: ReleaseSeen's patch names the
	// finalizer's index and adds a labels map when it sees none; Stop's
	// patch or deletion. The executor releases only pods with
	// task.LabelManagedBy (its caches select them, IdentityFromPod requires
	// it): for those the view has labels when the pod has.
	if full.Labels[task.LabelManagedBy] == task.ManagedByValue {
		for _, mark := range []bool{false, true} {
			same(fmt.Sprintf("attempt.ReleaseSeen(mark %v)", mark),
				calls(t, func(cs *fake.Clientset) error { return attempt.ReleaseSeen(context.Background(), cs, full, mark) }),
				calls(t, func(cs *fake.Clientset) error { return attempt.ReleaseSeen(context.Background(), cs, view, mark) }))
		}
	}
	same("attempt.Stop",
		calls(t, func(cs *fake.Clientset) error { return attempt.Stop(context.Background(), cs, full, now) }),
		calls(t, func(cs *fake.Clientset) error { return attempt.Stop(context.Background(), cs, view, now) }))
}

// calls returns the API requests do makes (verb, name, patch), each answered
// with success.
func calls(t *testing.T, do func(*fake.Clientset) error) []string {
	t.Helper()
	cs := fake.NewClientset()
	cs.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) { return true, &corev1.Pod{}, nil })
	if err := do(cs); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range cs.Actions() {
		s := a.GetVerb()
		if n, ok := a.(interface{ GetName() string }); ok {
			s += " " + n.GetName()
		}
		if p, ok := a.(k8stesting.PatchAction); ok {
			s += " " + string(p.GetPatch())
		}
		out = append(out, s)
	}
	return out
}

func ptrTo[T any](v T) *T { return &v }
