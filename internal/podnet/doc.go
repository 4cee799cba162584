// Package podnet gives pods of a local node a network of their own, as the
// reference bridge CNI plugin does: a Linux bridge per node holding the first
// address of the node's pod subnet (the pods' gateway), and per pod a network
// namespace whose eth0 is one end of a veth pair, the other end attached to the
// bridge, with an address from the subnet (IPAM) and a default route through the
// gateway. Pods reach each other and the host at the gateway's address; the host
// reaches every pod at its address.
//
// There is no kube-proxy: addresses on the host's loopback that pods need (the
// apiserver) are forwarded into each pod's namespace at the same address, so
// that 127.0.0.1:port inside the pod reaches 127.0.0.1:port on the host.
//
// Everything a Network creates (bridge, veth pairs, namespaces, forwarders) is
// removed by Sandbox.Close and Network.Close; a bridge left by a node that was
// killed is replaced when a node with the same bridge name starts. Linux and
// root only (Setup fails otherwise).
package podnet
