package podnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// ipam hands out the addresses of one IPv4 subnet: the first host address is the
// gateway's, the network and broadcast addresses are never given, and an address
// is free again once released. Not safe for concurrent use.
type ipam struct {
	prefix netip.Prefix
	used   map[netip.Addr]bool
	next   netip.Addr // where the search for a free address starts
}

func newIPAM(prefix netip.Prefix) (*ipam, error) {
	prefix = prefix.Masked()
	if !prefix.Addr().Is4() || prefix.Bits() > 30 {
		return nil, fmt.Errorf("pod subnet %s: need an IPv4 subnet of at least 4 addresses (/30 or larger)", prefix)
	}
	return &ipam{prefix: prefix, used: map[netip.Addr]bool{}, next: gateway(prefix).Next()}, nil
}

// gateway is the first host address of prefix: the bridge's.
func gateway(prefix netip.Prefix) netip.Addr { return prefix.Masked().Addr().Next() }

// broadcast is the last address of prefix.
func broadcast(prefix netip.Prefix) netip.Addr {
	a := prefix.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(a[:]) | (uint32(1)<<(32-prefix.Bits()) - 1)
	binary.BigEndian.PutUint32(a[:], v)
	return netip.AddrFrom4(a)
}

// errExhausted reports that every address of the subnet is in use.
var errExhausted = errors.New("no free address left in the pod subnet")

// allocate returns a free address, searching round-robin from after the last one
// given, so that an address just released is not reused at once (a peer that
// still holds a connection to the old pod does not reach a new one).
func (m *ipam) allocate() (netip.Addr, error) {
	first, last := gateway(m.prefix).Next(), broadcast(m.prefix).Prev()
	a := m.next
	for range 1 << (32 - m.prefix.Bits()) {
		if a.Compare(last) > 0 || a.Compare(first) < 0 {
			a = first
		}
		if !m.used[a] {
			m.used[a] = true
			m.next = a.Next()
			return a, nil
		}
		a = a.Next()
	}
	return netip.Addr{}, fmt.Errorf("%w (%s: %d addresses)", errExhausted, m.prefix, len(m.used))
}

// release frees a; releasing a free address does nothing.
func (m *ipam) release(a netip.Addr) { delete(m.used, a) }
