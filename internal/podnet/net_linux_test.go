//go:build linux

package podnet

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// echoServer answers each line with prefix and the line.
func echoServer(t *testing.T, ln net.Listener, prefix string) {
	t.Helper()
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				fmt.Fprintf(c, "%s %s", prefix, line)
			}()
		}
	}()
}

func ask(c net.Conn) (string, error) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(c, "hi"); err != nil {
		return "", err
	}
	s, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(s), err
}

// inPod runs f in s's namespace.
func inPod(t *testing.T, s *Sandbox, f func()) {
	t.Helper()
	if err := s.n.inNamespace(netns.NsHandle(s.NetNS().Fd()), f); err != nil { //nolint:gosec // a file descriptor fits in int
		t.Fatal(err)
	}
}

// TestNetwork sets up a real bridge and two pods: each listens on one port at its
// own address, reaches the other pod, the host at the gateway and the forwarded
// host loopback address; Close leaves no link behind.
func TestNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	hostLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, hostLn, "host-loopback")
	bridge := BridgeName(t.TempDir())
	n, err := Setup(Config{Bridge: bridge, Forward: []string{hostLn.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = n.Close()
		}
	})
	if !DefaultPool.Contains(n.Subnet().Addr()) || n.Subnet().Bits() != DefaultNodeBits {
		t.Fatalf("subnet %s is not a /%d of %s", n.Subnet(), DefaultNodeBits, DefaultPool)
	}
	gwLn, err := net.Listen("tcp", net.JoinHostPort(n.Gateway().String(), "0"))
	if err != nil {
		t.Fatalf("listen at the gateway %s: %v", n.Gateway(), err)
	}
	echoServer(t, gwLn, "host-gateway")

	var pods [2]*Sandbox
	for i := range pods {
		s, err := n.NewSandbox(fmt.Sprintf("pod-%d-%s", i, bridge))
		if err != nil {
			t.Fatal(err)
		}
		pods[i] = s
		if !n.Subnet().Contains(s.IP) || s.IP == n.Gateway() {
			t.Fatalf("pod %d got %s, not a pod address of %s", i, s.IP, n.Subnet())
		}
		var ln net.Listener
		var lerr error
		inPod(t, s, func() { ln, lerr = net.Listen("tcp", ":8080") })
		if lerr != nil {
			t.Fatalf("pod %d: listen on :8080: %v", i, lerr)
		}
		echoServer(t, ln, fmt.Sprintf("pod-%d", i))
	}
	if pods[0].IP == pods[1].IP {
		t.Fatalf("both pods got %s", pods[0].IP)
	}

	for i, s := range pods {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(s.IP.String(), "8080"), 5*time.Second)
		if err != nil {
			t.Fatalf("host to pod %d at %s: %v", i, s.IP, err)
		}
		if got, err := ask(c); err != nil || got != fmt.Sprintf("pod-%d hi", i) {
			t.Fatalf("host to pod %d: %q, %v", i, got, err)
		}
	}
	dialFromPod := func(s *Sandbox, addr string) string {
		var c net.Conn
		var derr error
		inPod(t, s, func() { c, derr = net.DialTimeout("tcp", addr, 5*time.Second) })
		if derr != nil {
			t.Fatalf("pod at %s: dial %s: %v", s.IP, addr, derr)
		}
		got, err := ask(c)
		if err != nil {
			t.Fatalf("pod at %s: ask %s: %v", s.IP, addr, err)
		}
		return got
	}
	if got := dialFromPod(pods[0], net.JoinHostPort(pods[1].IP.String(), "8080")); got != "pod-1 hi" {
		t.Errorf("pod 0 to pod 1: %q", got)
	}
	if got := dialFromPod(pods[1], "127.0.0.1:8080"); got != "pod-1 hi" {
		t.Errorf("pod 1 to its own loopback: %q", got)
	}
	if got := dialFromPod(pods[1], gwLn.Addr().String()); got != "host-gateway hi" {
		t.Errorf("pod 1 to the host at the gateway: %q", got)
	}
	if got := dialFromPod(pods[0], hostLn.Addr().String()); got != "host-loopback hi" {
		t.Errorf("pod 0 to the forwarded host address: %q", got)
	}

	veth0 := pods[0].veth
	pods[0].Close()
	if _, err := netlink.LinkByName(veth0); err == nil {
		t.Errorf("veth %s still there after its sandbox closed", veth0)
	}
	again, err := n.NewSandbox("pod-again-" + bridge)
	if err != nil {
		t.Fatal(err)
	}
	if again.IP == pods[0].IP {
		t.Errorf("a released address %s was given again at once", again.IP)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	for _, name := range []string{bridge, pods[1].veth, again.veth} {
		if _, err := netlink.LinkByName(name); err == nil {
			t.Errorf("link %s still there after the network closed", name)
		}
	}
	if _, err := n.NewSandbox("late"); err == nil {
		t.Error("a closed network made a sandbox")
	}
}

// TestSetupReplacesStaleBridge: a bridge a killed node left is replaced, and a
// configured subnet is used as it is.
func TestSetupReplacesStaleBridge(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	bridge := BridgeName(t.TempDir())
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridge}}); err != nil {
		t.Fatal(err)
	}
	subnet := netip.MustParsePrefix("10.254.200.0/28")
	n, err := Setup(Config{Bridge: bridge, Subnet: subnet})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Subnet() != subnet || n.Gateway().String() != "10.254.200.1" {
		t.Fatalf("subnet %s gateway %s, want %s and .1", n.Subnet(), n.Gateway(), subnet)
	}
	l, err := netlink.LinkByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != "10.254.200.1/28" {
		t.Fatalf("bridge addresses %v, %v; want 10.254.200.1/28", addrs, err)
	}
}
