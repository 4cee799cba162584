package runner

import (
	"testing"

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
