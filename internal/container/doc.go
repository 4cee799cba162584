// Package container runs one Kubernetes container as a local host process.
//
// The command runs on the host's file system, or, with Spec.Rootfs, on an overlay
// of an unpacked image's root file system into which it pivot_roots (Rootfs), as
// Spec.User when set, with the container's environment and working directory.
// Each container instance gets
//   - its own process group, so SIGTERM and SIGKILL reach every process it started;
//   - a log file in the CRI format (`<RFC3339Nano> stdout|stderr F|P <text>`), the
//     format the kubelet reads, so logs support follow, timestamps, since, tail and
//     byte limits (see ReadLog);
//   - when the node runs as root on Linux (IsolationNamespaces): a private mount
//     namespace in which volumes and the termination-message file are bind-mounted at
//     their container paths, and a private PID namespace in which the command is PID 1.
//     The kernel kills every process of a PID namespace when its PID 1 dies, and PID 1
//     is killed (Pdeathsig) when the node process dies, so no process outlives the node.
//     As in a real container, PID 1 ignores SIGTERM unless it installs a handler.
//   - without root (IsolationNone): plain child processes; mounts are not applied and
//     the termination message is read from the host file named by the spec instead.
//
// Start does not block on the command. The process is started through a re-exec of
// the current binary (see the init hook in init_linux.go): the child sets up the mounts
// and working directory, then execs the command, reporting a failure to start over a
// close-on-exec pipe so that "executable file not found" becomes a start error rather
// than an exit code.
//
// A container of an image with Spec.Runtime set runs under that OCI runtime
// (runc) instead, from a runtime spec made as containerd makes one (see
// OCIRuntime); host processes never do.
//
// A container of an image with limits, or any under runc, has a cgroup of its
// own, and Result.OOMKilled reports the kernel's OOM killer; host processes
// have none, and their OOMKilled is always false.
package container
