package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
)

// Simulated nodes carry these marks. kwok manages exactly the nodes with
// SimNodeAnnotation; the scheduler places a pod on one only when the pod
// tolerates SimNodeTaint and selects SimNodeLabel (see docs/sim-nodes.md).
const (
	// SimNodeAnnotation (value "fake") selects the nodes kwok manages.
	SimNodeAnnotation = "kwok.x-k8s.io/node"
	// SimNodeTaintKey is the key of the NoSchedule taint (value "fake") that
	// keeps ordinary pods off simulated nodes.
	SimNodeTaintKey = "kwok.x-k8s.io/node"
	// SimNodeLabel (value "sim") is the label a pod's nodeSelector uses.
	SimNodeLabel = "kubetask.dev/node"
	// SimNodeTypeLabel (value "kwok") is kwok's customary node label.
	SimNodeTypeLabel = "type"
	// SimNodePods is the pod capacity of each simulated node.
	SimNodePods = 1000
)

// simNodeName is the name of the i-th simulated node.
func simNodeName(i int) string { return fmt.Sprintf("sim-%d", i) }

// SimNodeToleration is the toleration a pod needs to run on a simulated node.
func SimNodeToleration() corev1.Toleration {
	return corev1.Toleration{Key: SimNodeTaintKey, Operator: corev1.TolerationOpEqual, Value: "fake", Effect: corev1.TaintEffectNoSchedule}
}

// SimNodeSelector is the nodeSelector that keeps a pod on simulated nodes.
func SimNodeSelector() map[string]string { return map[string]string{SimNodeLabel: "sim"} }

// AddSimNodes adds n kwok-simulated nodes named sim-<i>, numbering on from
// earlier calls, and returns once all of them are Ready. kwok starts on the
// first call and runs until Stop. Each node has capacity for SimNodePods
// pods, 1000 CPUs and 1Ti memory, the SimNode* label, annotation and taint,
// and runs its pods as the stages in kwokstages describe.
func (c *Cluster) AddSimNodes(ctx context.Context, n int) error {
	if n < 0 {
		return fmt.Errorf("adding simulated nodes: count %d is negative", n)
	}
	if n == 0 {
		return nil
	}
	kwok, err := c.ensureKwok(ctx)
	if err != nil {
		return err
	}
	c.mu.Lock()
	first := c.simNodes
	c.simNodes += n
	c.mu.Unlock()
	names := make([]string, 0, n)
	for i := first; i < first+n; i++ {
		name := simNodeName(i)
		if err := c.createSimNode(ctx, name); err != nil {
			return err
		}
		names = append(names, name)
	}
	c.log.Info("waiting for simulated nodes", "count", n, "first", names[0])
	return c.waitReady(ctx, kwok, func(ctx context.Context) error {
		for _, name := range names {
			if err := c.nodeReady(ctx, name); err != nil {
				return err
			}
		}
		return nil
	})
}

// SimNodeNames lists the simulated nodes added so far, in order.
func (c *Cluster) SimNodeNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := make([]string, c.simNodes)
	for i := range names {
		names[i] = simNodeName(i)
	}
	return names
}

func (c *Cluster) createSimNode(ctx context.Context, name string) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("1k"),
		corev1.ResourceMemory: resource.MustParse("1Ti"),
		corev1.ResourcePods:   *resource.NewQuantity(SimNodePods, resource.DecimalSI),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{SimNodeAnnotation: "fake", "node.alpha.kubernetes.io/ttl": "0"},
			Labels: map[string]string{
				SimNodeTypeLabel:                "kwok",
				SimNodeLabel:                    "sim",
				corev1.LabelHostname:            name,
				corev1.LabelOSStable:            "linux",
				corev1.LabelArchStable:          "amd64",
				"kubernetes.io/role":            "agent",
				"node-role.kubernetes.io/agent": "",
			},
		},
		Spec: corev1.NodeSpec{
			Taints: []corev1.Taint{{Key: SimNodeTaintKey, Value: "fake", Effect: corev1.TaintEffectNoSchedule}},
		},
		// The apiserver keeps a new node's status; kwok's node-initialize
		// stage then reports this capacity and marks the node Ready.
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
	_, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// A cluster restarted on old etcd data still has its simulated nodes.
		old, gerr := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("reading existing node %s: %w", name, gerr)
		}
		if old.Annotations[SimNodeAnnotation] != "fake" {
			return fmt.Errorf("creating simulated node %s: a node that kwok does not manage has that name", name)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating simulated node %s: %w", name, err)
	}
	return nil
}

// ensureKwok starts kwok unless it is running, waits until it serves its
// health endpoint, and returns its process.
func (c *Cluster) ensureKwok(ctx context.Context) (*process, error) {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil, errors.New("adding simulated nodes: the cluster is stopped")
	}
	if c.kwok != nil && c.kwok.running() {
		// Possibly still starting: the caller's wait for Ready nodes covers that.
		p := c.kwok
		c.mu.Unlock()
		return p, nil
	}
	if c.cfg.Binaries.Kwok == "" {
		c.mu.Unlock()
		return nil, errors.New("adding simulated nodes: no kwok binary (Config.Binaries.Kwok; build it with components.Builder)")
	}
	addr := "127.0.0.1:" + strconv.Itoa(c.ports.Kwok)
	p, err := c.startKwokLocked(addr)
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, p, plainHealthz("http://"+addr+"/healthz")); err != nil {
		return nil, err
	}
	return p, nil
}

// startKwokLocked writes the stage file and starts kwok; c.mu must be held
// so that concurrent callers start only one.
func (c *Cluster) startKwokLocked(addr string) (*process, error) {
	stages := c.path("kwok-stages.yaml")
	if err := os.WriteFile(stages, kwokstages.YAML, 0o600); err != nil {
		return nil, fmt.Errorf("writing kwok stages: %w", err)
	}
	p := c.newProcess("kwok", c.cfg.Binaries.Kwok, []string{
		"--kubeconfig=" + c.kubeconfig,
		"--config=" + stages,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=" + SimNodeAnnotation + "=fake",
		"--server-address=" + addr,
		// kwok renews each node's Lease every duration/4 = 5s, well inside
		// the controller-manager's 20s node-monitor grace period.
		"--node-lease-duration-seconds=20",
		// Pod IPs come from here; kwok's default overlaps the service range.
		"--cidr=10.128.0.0/12",
	})
	c.log.Info("starting kwok", "address", addr)
	if err := p.start(); err != nil {
		return nil, err
	}
	c.kwok = p
	return p, nil
}

// plainHealthz checks an HTTP health endpoint without TLS.
func plainHealthz(url string) func(context.Context) error {
	return healthCheck(&http.Client{Timeout: 5 * time.Second}, url)
}
