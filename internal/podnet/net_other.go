//go:build !linux

package podnet

import (
	"errors"
	"net/netip"
	"os"
)

// Network is a node's pod network; only on Linux.
type Network struct{}

// Sandbox is the network of one pod; only on Linux.
type Sandbox struct {
	// IP is the pod's address.
	IP netip.Addr
}

// Setup fails: pod networks need Linux.
func Setup(Config) (*Network, error) {
	return nil, errors.New("pod network: needs Linux (network namespaces)")
}

// Subnet is the node's pod subnet.
func (n *Network) Subnet() netip.Prefix { return netip.Prefix{} }

// Gateway is the bridge's address.
func (n *Network) Gateway() netip.Addr { return netip.Addr{} }

// NewSandbox fails off Linux.
func (n *Network) NewSandbox(string) (*Sandbox, error) {
	return nil, errors.New("pod network: needs Linux")
}

// NetNS is nil off Linux.
func (s *Sandbox) NetNS() *os.File { return nil }

// Close does nothing off Linux.
func (s *Sandbox) Close() {}

// Close does nothing off Linux.
func (n *Network) Close() error { return nil }
