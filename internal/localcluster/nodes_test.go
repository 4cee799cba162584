package localcluster

import (
	"slices"
	"strings"
	"testing"
)

// TestLocalNodeArgs: a cluster's NodeRuntime reaches each local node as
// --runtime; without one the node decides by its own default.
func TestLocalNodeArgs(t *testing.T) {
	c := &Cluster{cfg: Config{Dir: "/c", NodeRuntime: "init"}, kubeconfig: "/c/kubeconfig", pki: &pki{CACert: "/c/ca.crt"}}
	got := c.localNodeArgs("local-0", "/c/nodes/local-0")
	for _, want := range []string{"--runtime=init", "--name=local-0", "--dir=/c/nodes/local-0", "--images=/c/images", "--client-ca-file=/c/ca.crt"} {
		if !slices.Contains(got, want) {
			t.Errorf("args %q: want %s", got, want)
		}
	}
	c.cfg.NodeRuntime = ""
	if got := c.localNodeArgs("local-0", "/c/nodes/local-0"); slices.ContainsFunc(got, func(a string) bool { return strings.HasPrefix(a, "--runtime") }) {
		t.Errorf("args %q: want no --runtime", got)
	}
}
