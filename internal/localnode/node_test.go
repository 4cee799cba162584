package localnode

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestRemoveLegacyTaint: a node started on a Node object that still has the
// taint of earlier versions loses that taint and keeps the others.
func TestRemoveLegacyTaint(t *testing.T) {
	other := corev1.Taint{Key: "example.com/dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule}
	api := fake.NewClientset(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "local-0"},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{legacyTaint, other}},
	})
	if err := removeLegacyTaint(context.Background(), api, "local-0"); err != nil {
		t.Fatal(err)
	}
	n, err := api.CoreV1().Nodes().Get(context.Background(), "local-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(n.Spec.Taints, []corev1.Taint{other}) {
		t.Errorf("taints %v, want only %v", n.Spec.Taints, other)
	}
	// Nothing to do: no write.
	before := len(api.Actions())
	if err := removeLegacyTaint(context.Background(), api, "local-0"); err != nil {
		t.Fatal(err)
	}
	for _, a := range api.Actions()[before:] {
		if a.GetVerb() != "get" {
			t.Errorf("unexpected %s on a node without the taint", a.GetVerb())
		}
	}
}
