package container

// OCIRuntime is an OCI runtime (runc) that runs containers of images in
// place of the node's own init. For each container instance the node mounts
// the image's overlay (see Rootfs) at the root of a bundle in the instance's
// State, writes the runtime spec there (see ociSpec) and runs
//
//	runc --root Root run --keep --bundle State/bundle ID
//
// in the foreground, the container's stdout and stderr going to the log
// through runc; `runc kill` signals it, `runc exec` runs commands in it, and
// `runc delete --force` removes it once its result (exit code, OOM kill,
// read from its cgroup) is known. The container is the child of runc, which
// is killed with the node; a watcher process of the node (started with the
// first container) kills and deletes whatever is left under Root when the
// node dies without stopping its containers.
type OCIRuntime struct {
	// Path is the runtime's binary.
	Path string
	// Root is the runtime's state directory (runc --root), one per node.
	Root string
}
