//go:build linux

package podnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Network is a node's pod network: its bridge, subnet and the sandboxes made in it.
// Safe for concurrent use.
type Network struct {
	cfg    Config
	log    *slog.Logger
	host   netns.NsHandle
	bridge netlink.Link
	subnet netip.Prefix

	mu        sync.Mutex
	ipam      *ipam
	sandboxes map[*Sandbox]struct{}
	closed    bool
}

// Sandbox is the network of one pod: a namespace with lo and eth0 up, eth0
// holding IP, a default route through the node's gateway, and the Network's
// forwarders listening inside.
type Sandbox struct {
	// IP is the pod's address.
	IP netip.Addr

	n     *Network
	id    string
	veth  string
	file  *os.File // the namespace; the Sandbox owns it
	lns   []net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	once  sync.Once
}

// Setup creates the node's bridge with the gateway's address (the first of the
// subnet) and returns the network. It needs root.
func Setup(cfg Config) (*Network, error) {
	if cfg.Bridge == "" {
		return nil, errors.New("pod network: no bridge name")
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("pod network: needs root (network namespaces, veth pairs, a bridge)")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("pod network: open the host's network namespace: %w", err)
	}
	n, err := setup(cfg, host)
	if err != nil {
		_ = host.Close()
		return nil, fmt.Errorf("pod network: %w", err)
	}
	return n, nil
}

func setup(cfg Config, host netns.NsHandle) (*Network, error) {
	// Nodes starting at the same time on this machine must not pick one subnet.
	unlock, err := lockMachine()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if old, err := netlink.LinkByName(cfg.Bridge); err == nil {
		if err := netlink.LinkDel(old); err != nil {
			return nil, fmt.Errorf("remove the stale bridge %s: %w", cfg.Bridge, err)
		}
	}
	subnet := cfg.Subnet.Masked()
	if !subnet.IsValid() {
		taken, err := hostPrefixes()
		if err != nil {
			return nil, err
		}
		if subnet, err = pickSubnet(DefaultPool, DefaultNodeBits, subnetStart(cfg.Bridge), taken); err != nil {
			return nil, err
		}
	}
	m, err := newIPAM(subnet)
	if err != nil {
		return nil, err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: cfg.Bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("create bridge %s: %w", cfg.Bridge, err)
	}
	link, err := netlink.LinkByName(cfg.Bridge)
	if err == nil {
		err = netlink.AddrAdd(link, &netlink.Addr{IPNet: ipNet(gateway(subnet), subnet.Bits())})
	}
	if err == nil {
		err = netlink.LinkSetUp(link)
	}
	if err != nil {
		_ = netlink.LinkDel(br)
		return nil, fmt.Errorf("set up bridge %s with %s: %w", cfg.Bridge, gateway(subnet), err)
	}
	return &Network{cfg: cfg, log: cfg.Logger, host: host, bridge: link, subnet: subnet, ipam: m, sandboxes: map[*Sandbox]struct{}{}}, nil
}

// lockMachine takes a lock shared by every node of this machine.
func lockMachine() (func(), error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "kubetask-podnet.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the pod network lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil { //nolint:gosec // a file descriptor fits in int
		f.Close()
		return nil, fmt.Errorf("take the pod network lock: %w", err)
	}
	return func() { f.Close() }, nil
}

// hostPrefixes lists the host's IPv4 addresses (with their subnets) and routes.
func hostPrefixes() ([]netip.Prefix, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list the host's addresses: %w", err)
	}
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list the host's routes: %w", err)
	}
	var out []netip.Prefix
	add := func(n *net.IPNet) {
		if n == nil {
			return
		}
		a, ok := netip.AddrFromSlice(n.IP.To4())
		ones, _ := n.Mask.Size()
		if ok && ones > 0 {
			out = append(out, netip.PrefixFrom(a, ones).Masked())
		}
	}
	for _, a := range addrs {
		add(a.IPNet)
	}
	for _, r := range routes {
		add(r.Dst) // the default route has none
	}
	return out, nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

// Subnet is the node's pod subnet.
func (n *Network) Subnet() netip.Prefix { return n.subnet }

// Gateway is the bridge's address: where pods reach the host.
func (n *Network) Gateway() netip.Addr { return gateway(n.subnet) }

// NewSandbox makes the network of the pod id (its UID): a namespace, a veth
// pair between it and the bridge, a free address. Close releases all of it.
func (n *Network) NewSandbox(id string) (*Sandbox, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, errors.New("pod network closed")
	}
	ip, err := n.ipam.allocate()
	n.mu.Unlock()
	if err != nil {
		return nil, err
	}
	s := &Sandbox{IP: ip, n: n, id: id, veth: vethName(id), conns: map[net.Conn]struct{}{}}
	if err := s.setup(); err != nil {
		s.Close()
		return nil, fmt.Errorf("pod network of %s: %w", id, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		go s.Close()
		return nil, errors.New("pod network closed")
	}
	n.sandboxes[s] = struct{}{}
	return s, nil
}

func (s *Sandbox) setup() error {
	ns, err := s.n.newNamespace()
	if err != nil {
		return err
	}
	s.file = os.NewFile(uintptr(ns), "netns-"+s.id)
	if old, err := netlink.LinkByName(s.veth); err == nil {
		_ = netlink.LinkDel(old) // a pod of the same UID on a killed node
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.veth, MasterIndex: s.n.bridge.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth pair %s: %w", s.veth, err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return fmt.Errorf("set %s up: %w", s.veth, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("enter the pod's network namespace: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("set lo up in the pod: %w", err)
	}
	eth0, err := h.LinkByName("eth0")
	if err == nil {
		err = h.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(s.IP, s.n.subnet.Bits())})
	}
	if err == nil {
		err = h.LinkSetUp(eth0)
	}
	if err == nil {
		err = h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: s.n.Gateway().AsSlice()})
	}
	if err != nil {
		return fmt.Errorf("set up eth0 with %s in the pod: %w", s.IP, err)
	}
	for _, addr := range s.n.cfg.Forward {
		var ln net.Listener
		var lerr error
		if err := s.n.inNamespace(ns, func() { ln, lerr = net.Listen("tcp", addr) }); err != nil {
			return err
		}
		if lerr != nil {
			return fmt.Errorf("listen on %s in the pod to forward it: %w", addr, lerr)
		}
		s.lns = append(s.lns, ln)
		s.wg.Add(1)
		go s.forward(ln, addr)
	}
	return nil
}

// newNamespace creates a network namespace without entering it.
func (n *Network) newNamespace() (netns.NsHandle, error) {
	var ns netns.NsHandle
	var nerr error
	err := n.onLockedThread(func() (restore bool) {
		ns, nerr = netns.New() // unshare: this thread is in it now
		return nerr == nil
	})
	if nerr != nil {
		return 0, fmt.Errorf("create a network namespace: %w", nerr)
	}
	if err != nil {
		_ = ns.Close()
		return 0, err
	}
	return ns, nil
}

// inNamespace runs f with the calling thread in ns (sockets it opens stay there).
func (n *Network) inNamespace(ns netns.NsHandle, f func()) error {
	var serr error
	err := n.onLockedThread(func() bool {
		if serr = netns.Set(ns); serr != nil {
			return false
		}
		f()
		return true
	})
	if serr != nil {
		return fmt.Errorf("enter the pod's network namespace: %w", serr)
	}
	return err
}

// onLockedThread runs f on a thread of its own and, when f says so, moves the
// thread back to the host's namespace. A thread that cannot be moved back is
// left locked, so the Go runtime ends it instead of running other goroutines in
// the pod's namespace.
func (n *Network) onLockedThread(f func() (restore bool)) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if !f() {
			runtime.UnlockOSThread()
			errc <- nil
			return
		}
		if err := netns.Set(n.host); err != nil {
			errc <- fmt.Errorf("return to the host's network namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	return <-errc
}

// forward accepts connections in the pod and joins each with a connection to
// the same address on the host, until the listener closes.
func (s *Sandbox) forward(ln net.Listener, target string) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.pipe(c, target)
		}()
	}
}

func (s *Sandbox) pipe(c net.Conn, target string) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	u, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		s.n.log.Warn("pod network: forward a connection to the host", "pod", s.id, "target", target, "err", err)
		return
	}
	defer u.Close()
	if !s.track(c, u) {
		return
	}
	defer s.untrack(c, u)
	done := make(chan struct{}, 2)
	half := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go half(u, c)
	go half(c, u)
	<-done
	<-done
}

func (s *Sandbox) track(cs ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		return false
	}
	for _, c := range cs {
		s.conns[c] = struct{}{}
	}
	return true
}

func (s *Sandbox) untrack(cs ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		delete(s.conns, c)
	}
}

// NetNS is the pod's network namespace, for processes to join; it stays open
// until Close.
func (s *Sandbox) NetNS() *os.File { return s.file }

// Close stops the forwarders, removes the veth pair, closes the namespace (it
// goes away with the last process in it) and releases the address.
func (s *Sandbox) Close() {
	s.once.Do(func() {
		for _, ln := range s.lns {
			_ = ln.Close()
		}
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.conns = nil
		s.mu.Unlock()
		s.wg.Wait()
		if l, err := netlink.LinkByName(s.veth); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				s.n.log.Warn("pod network: remove veth", "veth", s.veth, "err", err)
			}
		}
		if s.file != nil {
			_ = s.file.Close()
		}
		s.n.mu.Lock()
		s.n.ipam.release(s.IP)
		delete(s.n.sandboxes, s)
		s.n.mu.Unlock()
	})
}

// Close closes every sandbox and removes the bridge.
func (n *Network) Close() error {
	n.mu.Lock()
	n.closed = true
	ss := make([]*Sandbox, 0, len(n.sandboxes))
	for s := range n.sandboxes {
		ss = append(ss, s)
	}
	n.mu.Unlock()
	for _, s := range ss {
		s.Close()
	}
	err := netlink.LinkDel(n.bridge)
	_ = n.host.Close()
	if err != nil {
		return fmt.Errorf("pod network: remove bridge %s: %w", n.cfg.Bridge, err)
	}
	return nil
}
