package podnet

import (
	"log/slog"
	"net/netip"
)

// Config configures a node's pod network.
type Config struct {
	// Bridge is the name of the node's bridge (see BridgeName). Required. A
	// bridge of that name already there is taken for one a killed node left, and
	// replaced.
	Bridge string
	// Subnet is the node's pod subnet; the zero value picks a free /24 of
	// DefaultPool (one that overlaps no address or route of the host).
	Subnet netip.Prefix
	// Forward lists TCP addresses on the host's loopback ("127.0.0.1:6443") that
	// every pod reaches at the same address inside its namespace.
	Forward []string
	// Logger receives the forwarders' errors; default slog.Default().
	Logger *slog.Logger
}
