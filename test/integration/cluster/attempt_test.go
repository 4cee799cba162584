package cluster

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/task"
)

// TestReleaseSeen: the one-request finalizer removal works on an up-to-date
// copy (and labels a kept pod released), and falls back correctly when the
// finalizers moved since the copy.
func TestReleaseSeen(t *testing.T) {
	env := clustertest.New(t)
	ctx := context.Background()
	pods := env.Client.CoreV1().Pods(env.Namespace)
	mk := func(name string) *corev1.Pod {
		clustertest.CreateIdlePod(t, env, name)
		p, err := pods.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":["`+task.Finalizer+`"]}}`), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	fresh := mk("fresh")
	if err := attempt.ReleaseSeen(ctx, env.Client, fresh, true); err != nil {
		t.Fatal(err)
	}
	if p, _ := pods.Get(ctx, "fresh", metav1.GetOptions{}); len(p.Finalizers) != 0 || p.Labels[task.LabelReleased] != "true" {
		t.Errorf("after ReleaseSeen: finalizers %v, labels %v", p.Finalizers, p.Labels)
	}

	stale := mk("stale")
	// Someone adds a finalizer in front of ours after we saw the pod.
	if _, err := pods.Patch(ctx, "stale", types.JSONPatchType, []byte(`[{"op":"add","path":"/metadata/finalizers/0","value":"example.com/other"}]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := attempt.ReleaseSeen(ctx, env.Client, stale, true); err != nil {
		t.Fatal(err)
	}
	p, err := pods.Get(ctx, "stale", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(p.Finalizers, task.Finalizer) || !slices.Contains(p.Finalizers, "example.com/other") {
		t.Errorf("finalizers %v: want only example.com/other", p.Finalizers)
	}
	if p.Labels[task.LabelReleased] != "true" {
		t.Errorf("labels %v: want %s", p.Labels, task.LabelReleased)
	}
	if _, err := pods.Patch(ctx, "stale", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
