package localcluster

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AddLocalNode starts one more local process node (kubetask node run) named
// local-<i> and waits until it is Ready.
func (c *Cluster) AddLocalNode(ctx context.Context) error {
	c.mu.Lock()
	name := localNodeName(len(c.nodes))
	dir := filepath.Join(c.cfg.Dir, "nodes", name)
	p := c.newProcess("node-"+name, c.cfg.KubetaskBinary, c.localNodeArgs(name, dir))
	c.nodes = append(c.nodes, p)
	c.mu.Unlock()
	c.log.Info("starting local node", "node", name)
	if err := p.start(); err != nil {
		return err
	}
	return c.waitReady(ctx, p, func(ctx context.Context) error { return c.nodeReady(ctx, name) })
}

// localNodeArgs are the arguments of `kubetask node run` for the local node
// name with its directory dir.
func (c *Cluster) localNodeArgs(name, dir string) []string {
	args := []string{"node", "run", "--kubeconfig=" + c.kubeconfig, "--client-ca-file=" + c.pki.CACert, "--name=" + name, "--dir=" + dir, "--images=" + c.ImageDir()}
	if c.cfg.NodeRuntime != "" {
		args = append(args, "--runtime="+c.cfg.NodeRuntime)
	}
	return args
}

func (c *Cluster) nodeReady(ctx context.Context, name string) error {
	n, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("node %s is not Ready", name)
}

// ImagesDirName is the directory, in a cluster's directory, of its image store
// (package imagestore): `kubetask cluster load-image` writes it, every local
// node runs the pods whose image is in it from the image.
const ImagesDirName = "images"

// ImageDir is the cluster's image store, shared by its local nodes.
func (c *Cluster) ImageDir() string { return filepath.Join(c.cfg.Dir, ImagesDirName) }

// KubetaskBinary is the kubetask executable the local nodes run (the one
// `kubetask cluster load-image` of the same build is).
func (c *Cluster) KubetaskBinary() string { return c.cfg.KubetaskBinary }

// ImageDir is the image store of the cluster in the directory (see ImagesDirName).
func (d StateDir) ImageDir() string { return d.file(ImagesDirName) }

// LocalNodeNames lists the local process nodes started so far.
func (c *Cluster) LocalNodeNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := make([]string, len(c.nodes))
	for i := range c.nodes {
		names[i] = localNodeName(i)
	}
	return names
}

// localNodeName is the node name of local node i.
func localNodeName(i int) string { return fmt.Sprintf("local-%d", i) }

// localNode returns local node i's process.
func (c *Cluster) localNode(i int) (*process, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.nodes) {
		return nil, fmt.Errorf("no local node %d", i)
	}
	return c.nodes[i], nil
}

// StopLocalNode stops local node i's process (its pods' processes die with
// it); the node turns NotReady when its lease expires.
func (c *Cluster) StopLocalNode(ctx context.Context, i int) error {
	p, err := c.localNode(i)
	if err != nil {
		return err
	}
	return p.stop(ctx, 10*time.Second)
}

// StartLocalNode starts local node i's process again after StopLocalNode.
func (c *Cluster) StartLocalNode(ctx context.Context, i int) error {
	p, err := c.localNode(i)
	if err != nil {
		return err
	}
	if p.running() {
		return nil
	}
	if err := p.start(); err != nil {
		return err
	}
	return c.waitReady(ctx, p, func(ctx context.Context) error { return c.nodeReady(ctx, localNodeName(i)) })
}
