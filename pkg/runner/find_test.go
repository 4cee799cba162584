package runner

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/pkg/task"
)

func testTask(t *testing.T) *task.Task {
	t.Helper()
	tk, err := task.Parse([]byte(`{"apiVersion":"kubetask.dev/v1alpha1","kind":"Task","metadata":{"name":"t"},
"spec":{"template":{"spec":{"containers":[{"name":"base","image":"busybox","command":["true"]}]}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestSelectPods(t *testing.T) {
	tk := testTask(t)
	id := task.Identity{Namespace: "ns", Name: "t", RunID: "cli-abc", Executor: "cli"}
	other := id
	other.RunID = "cli-other"
	pod := func(id task.Identity, attempt int, finalizer bool, mutate ...func(*corev1.Pod)) corev1.Pod {
		p, err := task.BuildPod(tk, id, attempt)
		if err != nil {
			t.Fatal(err)
		}
		if !finalizer {
			p.Finalizers = nil
		}
		for _, m := range mutate {
			m(p)
		}
		return *p
	}
	forged := func(p *corev1.Pod) { p.Annotations[task.AnnotationRun] = "cli-abc"; p.Name = "forged" }
	for name, tc := range map[string]struct {
		pods     []corev1.Pod
		wantOpen []string
		wantNext int
	}{
		"none":                        {nil, nil, 0},
		"a finished attempt":          {[]corev1.Pod{pod(id, 0, false)}, nil, 1},
		"an unfinished attempt":       {[]corev1.Pod{pod(id, 0, true)}, []string{task.PodName(id, 0)}, 1},
		"finished and unfinished":     {[]corev1.Pod{pod(id, 0, false), pod(id, 1, true)}, []string{task.PodName(id, 1)}, 2},
		"two unfinished (ambiguous)":  {[]corev1.Pod{pod(id, 1, true), pod(id, 0, true)}, []string{task.PodName(id, 0), task.PodName(id, 1)}, 2},
		"another run is ignored":      {[]corev1.Pod{pod(other, 3, true)}, nil, 0},
		"a pod with a forged name":    {[]corev1.Pod{pod(other, 0, true, forged)}, nil, 0},
		"an unmanaged pod is ignored": {[]corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Name: "x", Finalizers: []string{task.Finalizer}}}}, nil, 0},
	} {
		t.Run(name, func(t *testing.T) {
			open, next := selectPods(tc.pods, id)
			var names []string
			for _, p := range open {
				names = append(names, p.Name)
			}
			if d := cmp.Diff(tc.wantOpen, names); d != "" {
				t.Errorf("open (-want +got):\n%s", d)
			}
			if next != tc.wantNext {
				t.Errorf("next attempt %d, want %d", next, tc.wantNext)
			}
		})
	}
}

func TestStoppedAt(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	at := func(sec int) *metav1.Time {
		v := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, sec, 0, time.UTC))
		return &v
	}
	zero, five := int64(0), int64(5)
	running := []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	exited := []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}}}
	pod := func(phase corev1.PodPhase, node string, del *metav1.Time, grace *int64, st []corev1.ContainerStatus) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: del, DeletionGracePeriodSeconds: grace},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase, ContainerStatuses: st}}
	}
	for name, tc := range map[string]struct {
		pod  *corev1.Pod
		want bool
	}{
		"gone":                                  {nil, true},
		"never scheduled":                       {pod(corev1.PodPending, "", nil, nil, nil), true},
		"running":                               {pod(corev1.PodRunning, "n", nil, nil, running), false},
		"failed":                                {pod(corev1.PodFailed, "n", nil, nil, running), true},
		"deleting, containers still running":    {pod(corev1.PodRunning, "n", at(15), &five, running), false},
		"deleting, kubelet confirmed (grace 0)": {pod(corev1.PodRunning, "n", at(15), &zero, running), true},
		"deleting, deadline long passed":        {pod(corev1.PodRunning, "n", at(5), &five, running), true},
		"deleting, deadline just passed":        {pod(corev1.PodRunning, "n", at(9), &five, running), false},
		"deleting, every container exited":      {pod(corev1.PodRunning, "n", at(15), &five, exited), true},
		"not deleting, every container exited":  {pod(corev1.PodRunning, "n", nil, nil, exited), false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := stoppedAt(func() time.Time { return now })(tc.pod); got != tc.want {
				t.Errorf("stopped = %v, want %v", got, tc.want)
			}
		})
	}
}
