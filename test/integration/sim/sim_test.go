package sim

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestSimNodesReady(t *testing.T) {
	env := clustertest.New(t)
	names := env.Cluster.SimNodeNames()
	// TestAddSimNodes may have added more; the three from TestMain come first.
	if len(names) < 3 || names[0] != "sim-0" || names[1] != "sim-1" || names[2] != "sim-2" {
		t.Fatalf("SimNodeNames() = %v, want sim-0, sim-1, sim-2 first", names)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range names {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading node %s: %v", name, err)
		}
		ready := false
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if !ready {
			t.Errorf("node %s is not Ready: %v", name, n.Status.Conditions)
		}
		if n.Labels[localcluster.SimNodeLabel] != "sim" || n.Labels["type"] != "kwok" || n.Annotations[localcluster.SimNodeAnnotation] != "fake" {
			t.Errorf("node %s: labels %v annotations %v", name, n.Labels, n.Annotations)
		}
		if len(n.Spec.Taints) != 1 || !tolerates(n.Spec.Taints[0]) {
			t.Errorf("node %s: taints %v not tolerated by the sim toleration", name, n.Spec.Taints)
		}
		if got := n.Status.Allocatable.Pods().Value(); got != localcluster.SimNodePods {
			t.Errorf("node %s: %d allocatable pods, want %d", name, got, localcluster.SimNodePods)
		}
	}
}

func TestPodWithoutAnnotationsRuns(t *testing.T) {
	env := clustertest.New(t)
	createPod(t, env, simPod("plain", nil, "main", "sidecar"))
	p := waitPod(t, env, "plain", 30*time.Second, allRunning)
	if !isSimNode(env, p.Spec.NodeName) {
		t.Fatalf("pod runs on %q, not a simulated node", p.Spec.NodeName)
	}
	if p.Status.PodIP == "" || p.Status.StartTime == nil {
		t.Errorf("podIP %q startTime %v: want both set", p.Status.PodIP, p.Status.StartTime)
	}
	holds(t, env, "plain", 3*time.Second, allRunning)
}

func tolerates(taint corev1.Taint) bool {
	tol := localcluster.SimNodeToleration()
	return tol.Key == taint.Key && tol.Value == taint.Value && tol.Effect == taint.Effect
}

// TestAddSimNodes: a later call continues the numbering and returns with the
// new node Ready; a pod pinned to it runs.
func TestAddSimNodes(t *testing.T) {
	env := clustertest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before := len(env.Cluster.SimNodeNames())
	if err := env.Cluster.AddSimNodes(ctx, 1); err != nil {
		t.Fatalf("AddSimNodes: %v", err)
	}
	names := env.Cluster.SimNodeNames()
	want := fmt.Sprintf("sim-%d", before)
	if len(names) != before+1 || names[before] != want {
		t.Fatalf("SimNodeNames() = %v, want %s appended", names, want)
	}
	if err := env.Cluster.AddSimNodes(ctx, -1); err == nil {
		t.Errorf("AddSimNodes(-1) succeeded, want an error")
	}
	pod := simPod("pinned", nil, "main")
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: want}
	createPod(t, env, pod)
	if p := waitPod(t, env, "pinned", 30*time.Second, allRunning); p.Spec.NodeName != want {
		t.Errorf("pod on %q, want %s", p.Spec.NodeName, want)
	}
}
