package localnode

import (
	"fmt"
	"slices"
	"strings"
)

// The runtimes that run the containers of loaded images (Config.Runtime).
const (
	// RuntimeRunc runs them with runc (found on PATH), from an OCI spec made
	// as containerd makes one: the default when runc is installed.
	RuntimeRunc = "runc"
	// RuntimeInit runs them with the node's own init (package container):
	// the same containment but for the seccomp filter.
	RuntimeInit = "init"
	// RuntimeEnvVar names the runtime when Config.Runtime is empty.
	RuntimeEnvVar = "KUBETASK_NODE_RUNTIME"
)

// Runtimes are the values a user chooses a runtime by (the CLI's --runtime).
var Runtimes = []string{RuntimeRunc, RuntimeInit}

// ValidateRuntimeFlag checks the value of a --runtime flag: empty (the
// default: see Config.Runtime), runc or init.
func ValidateRuntimeFlag(v string) error {
	if v == "" || slices.Contains(Runtimes, v) {
		return nil
	}
	return fmt.Errorf("--runtime must be %s or %s, got %q", RuntimeRunc, RuntimeInit, v)
}

// runtimeChoice is what chooseRuntime decided.
type runtimeChoice struct {
	// name is RuntimeInit, or the runtime asked for (runc, or a path).
	name string
	// path is the OCI runtime's binary; empty for the init.
	path string
	// warning, when set, says why the node fell back to the init although
	// it runs images.
	warning string
}

// chooseRuntime decides what runs the containers of loaded images, from the
// runtime asked for (Config.Runtime, else $KUBETASK_NODE_RUNTIME):
//   - "init": the node's init;
//   - "runc" or a path to a runc binary: that runtime, or an error naming
//     the fix when it is not found (asked for explicitly, it must not be
//     silently replaced by a weaker one);
//   - nothing: runc when it is on PATH, as a real node runs its containers,
//     else the node's init, with a warning when the node can run images at
//     all (images: an image store, root on Linux) so that a user sees why
//     the containers have no seccomp filter.
func chooseRuntime(asked string, images bool, lookPath func(string) (string, error)) (runtimeChoice, error) {
	switch asked {
	case RuntimeInit:
		return runtimeChoice{name: RuntimeInit}, nil
	case "":
		path, err := lookPath(RuntimeRunc)
		if err == nil {
			return runtimeChoice{name: RuntimeRunc, path: path}, nil
		}
		c := runtimeChoice{name: RuntimeInit}
		if images {
			c.warning = "runc is not on PATH: containers of loaded images run under the node's own init, without a seccomp filter; install runc (Debian: apt-get install runc) or choose --runtime init (" + RuntimeEnvVar + "=init) to silence this"
		}
		return c, nil
	default:
		path, err := lookPath(asked)
		if err != nil {
			return runtimeChoice{}, fmt.Errorf("container runtime %q: %w; install runc (Debian: apt-get install runc) or choose --runtime init (%s=init)", asked, err, RuntimeEnvVar)
		}
		return runtimeChoice{name: asked, path: path}, nil
	}
}

// runtimeVersion is what the node reports as its container runtime
// (status.nodeInfo.containerRuntimeVersion, the CONTAINER-RUNTIME column of
// kubectl get nodes -o wide), as a kubelet reports containerd's
// ("containerd://1.7.24"): "runc://<version>" from the output of runc
// --version for runc, "kubetask-init://<kubetask's version>" for the node's
// own init. An output it cannot read says "unknown".
func runtimeVersion(name, out string) string {
	if name == RuntimeInit {
		return "kubetask-init://" + out
	}
	first, _, _ := strings.Cut(out, "\n")
	v, ok := strings.CutPrefix(strings.TrimSpace(first), "runc version ")
	if !ok || v == "" || strings.ContainsAny(v, " \t") {
		v = "unknown"
	}
	return "runc://" + v
}
