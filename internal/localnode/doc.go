// Package localnode is a Kubernetes node, built on virtual-kubelet, whose pods run
// each container as a local process (package container): from the image's own
// root file system, in its own mount and PID namespaces, when the image is in
// the node's image store (Config.ImageDir, package imagestore: `kubetask cluster
// load-image`), with the image's entrypoint, cmd, env, working directory and
// user as the kubelet combines them with the container's (resolveImageRun);
// otherwise the container's command and args run on the host. A pod of a
// loaded image gets a network of its own (package podnet: a namespace, a veth
// pair on the node's bridge, an address of the node's pod subnet, the
// apiserver's loopback address forwarded into it); other pods share the node's.
//
// Run registers the node, keeps its lease and status fresh, serves the kubelet API
// (logs, exec) over HTTPS with a self-signed certificate, and runs the pods bound to
// it the way the kubelet does: init containers in order, native sidecars,
// restart policies with back-off, the kubelet's container and pod statuses and
// conditions, termination messages, emptyDir volumes, graceful deletion and
// activeDeadlineSeconds. docs/local-node.md lists what differs from a real kubelet.
//
// All state lives in memory. When the node process stops, every container process
// dies with it. Pods that a restarted node finds bound to it and already started by
// an earlier instance are marked Failed, their unfinished containers terminated with
// reason ContainerStatusUnknown and exit code 137, as the kubelet reports lost
// containers; pods that never started run normally.
package localnode
