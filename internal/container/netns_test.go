package container

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/kubetask/kubetask/internal/podnet"
)

// interfaces lists the interface names of a /proc/net/dev.
func interfaces(dev string) []string {
	var names []string
	for _, line := range strings.Split(dev, "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(name, "|") {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names
}

// TestNetNSJoinsThePodNetwork: a container given a pod's network namespace sees
// only lo and eth0 there, and so does a command exec'd into it, which also
// sees the container's own host name; a container
// started after it on the same node (the forking thread returned) sees the
// node's network again.
func TestNetNSJoinsThePodNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	bridge := podnet.BridgeName(t.TempDir())
	n, err := podnet.Setup(podnet.Config{Bridge: bridge})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	sb, err := n.NewSandbox("container-test")
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, Spec{
		Command:   sh(`cat /proc/self/net/dev; echo ready; trap 'exit 0' TERM; while :; do sleep 0.1; done`),
		Isolation: IsolationNamespaces,
		NetNS:     sb.NetNS(),
		Hostname:  "pod-a",
	})
	waitLog(t, p, "ready\n")
	if got := interfaces(readAll(t, p, LogOptions{TailLines: -1})); strings.Join(got, ",") != "lo,eth0" {
		t.Errorf("container sees interfaces %v, want lo and eth0", got)
	}
	var out bytes.Buffer
	code, err := p.Exec(context.Background(), sh(`cat /proc/self/net/dev; echo "host $(cat /proc/sys/kernel/hostname)"`), nil, &out, io.Discard)
	if err != nil || code != 0 {
		t.Fatalf("exec: code %d err %v", code, err)
	}
	if got := interfaces(out.String()); strings.Join(got, ",") != "lo,eth0" {
		t.Errorf("exec sees interfaces %v, want lo and eth0", got)
	}
	if !strings.Contains(out.String(), "host pod-a\n") {
		t.Errorf("exec sees host name %q, want pod-a", out.String())
	}
	host := start(t, Spec{Command: sh(`cat /proc/self/net/dev`), Isolation: IsolationNamespaces})
	waitDone(t, host)
	if got := interfaces(readAll(t, host, LogOptions{TailLines: -1})); !strings.Contains(","+strings.Join(got, ",")+",", ","+bridge+",") {
		t.Errorf("a container without a network namespace sees %v, not the node's interfaces (its bridge among them)", got)
	}
}
