package task

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDeepCopySharesNothing: changing every reference-typed field of a copy
// leaves the original as it was.
func TestDeepCopySharesNothing(t *testing.T) {
	limit := int32(3)
	orig := &Task{}
	orig.Name, orig.Labels = "t", map[string]string{"a": "b"}
	orig.Spec.Retries = Retries{Limit: &limit, RetryOn: []string{"ExitCode"}}
	orig.Spec.Result = &Result{From: ResultFromFile, Path: "/out/r"}
	orig.Spec.Logs.Containers = []string{"main"}
	orig.Spec.Placement = &Placement{ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "eu"}}}
	orig.Spec.Template.Labels = map[string]string{"x": "y"}
	orig.Spec.Template.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"true"}}}
	snapshot := orig.DeepCopy()
	if !reflect.DeepEqual(snapshot, orig) {
		t.Fatalf("copy differs from the original")
	}
	c := orig.DeepCopy()
	c.Labels["a"] = "changed"
	*c.Spec.Retries.Limit = 9
	c.Spec.Retries.RetryOn[0] = "changed"
	c.Spec.Result.Path = "/changed"
	c.Spec.Logs.Containers[0] = "changed"
	c.Spec.Placement.ClusterSelector.MatchLabels["region"] = "changed"
	c.Spec.Template.Labels["x"] = "changed"
	c.Spec.Template.Spec.Containers[0].Command[0] = "changed"
	if !reflect.DeepEqual(snapshot, orig) {
		t.Errorf("changing the copy changed the original")
	}
}
