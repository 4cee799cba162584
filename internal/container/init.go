package container

import (
	"encoding/json"
	"fmt"
	"os"
)

// initEnvVar carries the init configuration from the node to its re-exec'd child.
const initEnvVar = "_KUBETASK_CONTAINER_INIT"

// initArgv0 names the init child in process listings until it execs the command.
const initArgv0 = "kubetask-container-init"

// selfExe is the node's own binary; a child started from it runs the init hook.
const selfExe = "/proc/self/exe"

// initConfig is what the init child needs to prepare the container and exec its command.
type initConfig struct {
	Argv     []string `json:"argv"`
	Dir      string   `json:"dir,omitempty"`
	Mounts   []Mount  `json:"mounts,omitempty"`
	Isolated bool     `json:"isolated,omitempty"`
	Rootfs   *Rootfs  `json:"rootfs,omitempty"`
	Hostname string   `json:"hostname,omitempty"`
	User     *User    `json:"user,omitempty"`
	// Join, when non-zero, is the host PID of a container whose namespaces an exec'd
	// command enters instead of preparing its own.
	Join int `json:"join,omitempty"`
	// JoinNet also enters the container's network namespace (it has its own).
	JoinNet bool `json:"joinNet,omitempty"`
	// JoinUTS also enters its UTS namespace (it has its own host name).
	JoinUTS bool `json:"joinUTS,omitempty"`
	// NSEnter is the node's nsenter, found in the node's PATH: the exec'd child
	// has the container's environment, whose PATH is the image's.
	NSEnter string `json:"nsenter,omitempty"`
	// Security confines a container of an image (Rootfs set, or Confined for an
	// exec'd command).
	Security Security `json:"security,omitempty"`
	// Confined marks a command exec'd into a container of an image: nsenter
	// (PID, network, UTS namespaces) runs the init again, which enters the
	// mount namespace itself (EnterMount) and confines the command as the
	// container's PID 1 is confined.
	Confined bool `json:"confined,omitempty"`
	// EnterMount is set for that second init: the host PID whose mount
	// namespace it enters.
	EnterMount int `json:"enterMount,omitempty"`
	// Cgroups are the container's cgroup directories, joined first.
	Cgroups []string `json:"cgroups,omitempty"`
}

func (c initConfig) encode() (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encode container init config: %w", err)
	}
	return initEnvVar + "=" + string(b), nil
}

// init turns this process into a container's init when the node started it as one.
// It never returns in that case: it execs the command or reports why it could not
// on file descriptor 3 and exits 127.
func init() {
	raw, ok := os.LookupEnv(initEnvVar)
	if !ok {
		return
	}
	_ = os.Unsetenv(initEnvVar)
	errPipe := os.NewFile(3, "start-error")
	var cfg initConfig
	err := json.Unmarshal([]byte(raw), &cfg)
	if err == nil {
		err = runInit(cfg) // returns only on failure
	}
	if _, werr := errPipe.WriteString(err.Error()); werr != nil {
		// No start-error pipe (an exec): tell the caller on stderr, as a shell would.
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(127)
}
