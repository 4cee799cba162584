package podnet

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net/netip"
)

// DefaultPool is where nodes without a configured pod subnet pick theirs: the
// range the flannel and Calico examples use for pods, split into one /24 per node.
var DefaultPool = netip.MustParsePrefix("10.244.0.0/16")

// DefaultNodeBits is the size of a node's pod subnet picked from a pool: /24,
// 253 pods with a network of their own.
const DefaultNodeBits = 24

// pickSubnet returns the first subnet of size bits in pool, searching round-robin
// from the one numbered start, that overlaps none of taken (the host's addresses
// and routes, other nodes' bridges among them).
func pickSubnet(pool netip.Prefix, bits int, start uint32, taken []netip.Prefix) (netip.Prefix, error) {
	pool = pool.Masked()
	if !pool.Addr().Is4() || bits < pool.Bits() || bits > 30 {
		return netip.Prefix{}, fmt.Errorf("pod subnet pool %s: cannot split it into IPv4 /%d subnets", pool, bits)
	}
	n := uint32(1) << (bits - pool.Bits())
	base := pool.Addr().As4()
	b := binary.BigEndian.Uint32(base[:])
	for i := range n {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], b+((start+i)%n)<<(32-bits))
		cand := netip.PrefixFrom(netip.AddrFrom4(a), bits)
		free := true
		for _, t := range taken {
			if t.Overlaps(cand) {
				free = false
				break
			}
		}
		if free {
			return cand, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free /%d left in the pod subnet pool %s: every one overlaps an address or route of the host", bits, pool)
}

// shortHash is 8 hex digits of s's FNV-1a hash: with a prefix it makes interface
// names, which Linux limits to 15 bytes.
func shortHash(s string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return fmt.Sprintf("%08x", h.Sum32())
}

// BridgeName is the bridge of the node whose directory is dir: "kt" and a hash
// of dir, the same each time the node starts there.
func BridgeName(dir string) string { return "kt" + shortHash(dir) }

// vethName is the host end of the veth pair of the pod sandbox id.
func vethName(id string) string { return "ktv" + shortHash(id) }

// subnetStart is where a node's search for a free subnet begins: a hash of its
// bridge name, so that nodes starting together rarely try the same one and a
// node that restarts gets its subnet back.
func subnetStart(bridge string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(bridge))
	return h.Sum32()
}
