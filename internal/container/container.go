package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Isolation selects how much of a container environment a process gets.
type Isolation int

const (
	// IsolationAuto uses IsolationNamespaces when the node runs as root on Linux and
	// IsolationNone otherwise.
	IsolationAuto Isolation = iota
	// IsolationNone runs the command as a plain child process in its own process group.
	// Mounts are ignored.
	IsolationNone
	// IsolationNamespaces runs the command as PID 1 of a new PID namespace with a
	// private mount namespace holding the spec's bind mounts. Requires root.
	IsolationNamespaces
)

// DefaultPath is the PATH given to a command whose environment has none, as container
// runtimes do for images that set no PATH.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Mount makes HostPath (or SubPath inside it) visible at ContainerPath inside the
// container's mount namespace. A missing ContainerPath is created as an empty
// directory (or an empty file when the source is a file) to serve as the mount
// point: inside the image's root for a container with a Rootfs (never through a
// link that leads out of it), on the host otherwise.
//
// The source is opened by handle and mounted from the handle (open_tree and
// move_mount), so nothing can swap a path component for a link between its
// resolution and the mount.
type Mount struct {
	HostPath string `json:"hostPath"`
	// SubPath, when set, is a path inside HostPath (a directory) to mount
	// instead of HostPath itself, as a volumeMount's subPath. It is resolved
	// inside HostPath as if HostPath were the root: a symbolic link in it,
	// whatever its target, never leads out (the kubelet's fix of
	// CVE-2017-1002101). A missing SubPath is created there as a directory,
	// also without following a link out.
	SubPath       string `json:"subPath,omitempty"`
	ContainerPath string `json:"containerPath"`
	// ReadOnly makes the mount and every mount below it read-only.
	ReadOnly bool `json:"readOnly,omitempty"`
}

// Spec describes one container instance.
type Spec struct {
	// Command is the argv to run: the container's command followed by its args.
	// Command[0] is looked up in the PATH of Env when it contains no slash.
	Command []string
	// Env holds KEY=VALUE pairs, already resolved. DefaultPath is added when no PATH is set.
	Env []string
	// WorkingDir is created if it does not exist. Empty means "/".
	WorkingDir string
	// Mounts are applied in order, only under IsolationNamespaces.
	Mounts []Mount
	// LogPath is the CRI-format log file to create for this instance. Required.
	LogPath string
	// Isolation defaults to IsolationAuto.
	Isolation Isolation
	// Rootfs, when set, runs the command in an image's root file system instead of
	// the host's (IsolationNamespaces only; Start fails otherwise).
	Rootfs *Rootfs
	// User, when set, is who the command runs as; nil keeps the node's user.
	User *User
	// NetNS, when set, is the network namespace the container joins (its pod's,
	// see package podnet), and exec'd commands with it; nil keeps the node's
	// network. Needs root on Linux. The caller keeps it open while the
	// container runs.
	NetNS *os.File
	// Hostname, when set, gives the container a UTS namespace of its own
	// with this host name (the kubelet gives a pod's containers the pod's
	// name), also for exec'd commands. IsolationNamespaces only; ignored
	// otherwise.
	Hostname string
	// Security confines a container with a Rootfs as containerd confines a
	// Kubernetes container (see Security). Ignored for host processes.
	Security Security
	// Limits, when set on a container with a Rootfs, put it in a cgroup of
	// its own with these limits (see Limits). Ignored for host processes.
	Limits Limits
	// Runtime, when set on a container with a Rootfs, runs it with that OCI
	// runtime (runc) from a runtime spec made as containerd makes one for a
	// Kubernetes container, instead of the node's own init (see OCIRuntime).
	// Ignored for host processes.
	Runtime *OCIRuntime
}

// Security is how a container run from an image is confined, as the defaults
// a Kubernetes node gets from containerd and runc confine it (the zero value
// is the default: the default capabilities, masked and read-only paths):
//
//   - capabilities: the bounding set (and, for uid 0, the permitted and
//     effective sets) is Capabilities, or DefaultCapabilities when nil; a
//     non-root user has none, and a set-user-ID root file gains only these;
//   - /proc's sensitive files masked (MaskedPaths), /proc/sys and the others of
//     ReadonlyPaths read-only, /sys a fresh sysfs, read-only;
//   - no_new_privs when NoNewPrivileges (allowPrivilegeEscalation: false): a
//     set-user-ID file runs as its caller;
//   - the root file system read-only when ReadOnlyRootFilesystem.
//
// Privileged lifts the masks and read-only paths and keeps every capability.
type Security struct {
	Capabilities           []string `json:"capabilities,omitempty"`
	NoNewPrivileges        bool     `json:"noNewPrivileges,omitempty"`
	ReadOnlyRootFilesystem bool     `json:"readOnlyRootFilesystem,omitempty"`
	Privileged             bool     `json:"privileged,omitempty"`
	// SeccompUnconfined runs the container without a seccomp filter
	// (seccompProfile: Unconfined). Otherwise, under an OCI runtime, it gets
	// containerd's default profile (RuntimeDefault), as on a kubelet with
	// seccompDefault; the node's own init applies no filter.
	SeccompUnconfined bool `json:"seccompUnconfined,omitempty"`
}

// DefaultCapabilities are the capabilities containerd gives a container
// (its oci.defaultUnixCaps), which Kubernetes' securityContext.capabilities
// adds to and drops from.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// MaskedPaths and ReadonlyPaths are containerd's defaults for an
// unprivileged container.
var (
	MaskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
		"/sys/firmware", "/sys/devices/virtual/powercap",
	}
	ReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// Limits are a container's resource limits, held by a cgroup of its own.
type Limits struct {
	// MemoryBytes is the memory limit (swap included: none is allowed); a
	// container over it is killed by the kernel and its Result says OOMKilled.
	MemoryBytes int64
	// MilliCPU is the CPU limit in thousandths of a CPU (a CFS quota per
	// 100 ms period).
	MilliCPU int64
}

// Rootfs is the root file system of a container run from an image: an overlay
// whose read-only lower layer is the image's unpacked root (shared by every
// container of the image, never written) and whose writable upper layer lives in
// State, so that each container instance starts from the image as it is. Inside
// it the container gets a fresh /proc of its PID namespace, a /dev on tmpfs with
// the host's null, zero, full, random, urandom and tty, /dev/shm, /sys read-only,
// and the Spec's Mounts (ContainerPath resolved inside the root); then it
// pivot_roots into it, so nothing of the host's file system stays reachable.
type Rootfs struct {
	// Image is the image's unpacked root file system.
	Image string
	// State is a directory of this instance (created if missing) holding the
	// overlay's upper and work directories and its mount point.
	State string
}

// User is a numeric user and groups to run a command as, as a container runtime
// sets them: groups first, then the group ID, then the user ID.
type User struct {
	UID, GID uint32
	// Groups are the supplementary group IDs (none when empty).
	Groups []uint32
}

// Result is the outcome of a container instance that has exited.
type Result struct {
	// ExitCode is the command's exit status, or 128+signal when a signal killed it.
	ExitCode int
	// Signal is the signal that killed the command, or 0.
	Signal syscall.Signal
	// StartedAt is when the command began to run; FinishedAt when it was reaped.
	StartedAt, FinishedAt time.Time
	// OOMKilled reports that the kernel's OOM killer killed a process of the
	// container's cgroup (a container with Limits.MemoryBytes). Always false
	// for a container without a cgroup.
	OOMKilled bool
}

// StartError reports that a command could not be started at all (for example its
// executable does not exist). The kubelet reports this as a terminated container with
// reason StartError and exit code 128.
type StartError struct {
	Msg string
}

func (e *StartError) Error() string { return e.Msg }

// Process is one running (or exited) container instance.
// All methods are safe for concurrent use.
type Process struct {
	spec      Spec
	isolated  bool
	cmd       *exec.Cmd
	pid       int
	startedAt time.Time
	log       *logWriter
	cg        *cgroup       // nil: none (no limits, or a host process)
	oci       *ociContainer // nil: started by the node's init

	done   chan struct{}
	result Result
	// released is closed once nothing of the instance is left: for a
	// container of an OCI runtime, after Done, once runc deleted it and
	// its cgroup is gone.
	released chan struct{}
}

// Start starts the container instance described by spec and returns once the
// command runs (its executable has been exec'd). A command that cannot be started
// yields a *StartError. ctx bounds only the start itself, not the process's life.
func Start(ctx context.Context, spec Spec) (*Process, error) {
	if len(spec.Command) == 0 || spec.Command[0] == "" {
		return nil, &StartError{Msg: "no command to run"}
	}
	if spec.LogPath == "" {
		return nil, errors.New("container spec without log path")
	}
	isolated, err := resolveIsolation(spec.Isolation)
	if err != nil {
		return nil, err
	}
	if spec.Rootfs != nil && !isolated {
		return nil, errors.New("running a container from an image root file system needs namespace isolation (root on Linux)")
	}
	lw, err := createLog(spec.LogPath)
	if err != nil {
		return nil, err
	}
	p := &Process{spec: spec, isolated: isolated, log: lw, done: make(chan struct{}), released: make(chan struct{})}
	if err := p.start(ctx); err != nil {
		lw.close()
		return nil, err
	}
	go p.wait()
	return p, nil
}

func withDefaultPath(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			return env
		}
	}
	return append(append([]string(nil), env...), "PATH="+DefaultPath)
}

func (p *Process) start(ctx context.Context) error {
	if p.spec.Rootfs != nil && p.spec.Runtime != nil {
		return p.startOCI(ctx)
	}
	cfg := initConfig{
		Argv:     p.spec.Command,
		Dir:      p.spec.WorkingDir,
		Isolated: p.isolated,
		User:     p.spec.User,
	}
	if p.isolated {
		cfg.Mounts = p.spec.Mounts
		cfg.Rootfs = p.spec.Rootfs
		cfg.Hostname = p.spec.Hostname
	}
	if cfg.Rootfs != nil {
		cfg.Security = p.spec.Security
		if p.spec.Limits != (Limits{}) {
			cg, err := newCgroup(p.spec.Limits)
			if err != nil {
				return fmt.Errorf("container cgroup: %w", err)
			}
			p.cg = cg
			cfg.Cgroups = cg.dirs
		}
	}
	cfgEnv, err := cfg.encode()
	if err != nil {
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("start pipe: %w", err)
	}
	defer errR.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		errW.Close()
		return fmt.Errorf("stdout pipe: %w", err)
	}
	errOutR, errOutW, err := os.Pipe()
	if err != nil {
		errW.Close()
		outR.Close()
		outW.Close()
		return fmt.Errorf("stderr pipe: %w", err)
	}
	cmd := &exec.Cmd{
		Path:        selfExe,
		Args:        []string{initArgv0},
		Env:         append(withDefaultPath(p.spec.Env), cfgEnv),
		Stdout:      outW,
		Stderr:      errOutW,
		ExtraFiles:  []*os.File{errW},
		SysProcAttr: sysProcAttr(p.isolated, p.isolated && p.spec.Hostname != ""),
	}
	startErr := forkOnLockedThread(cmd.Start, p.spec.NetNS)
	errW.Close()
	outW.Close()
	errOutW.Close()
	if startErr != nil {
		outR.Close()
		errOutR.Close()
		p.cg.remove()
		return fmt.Errorf("start container init: %w", startErr)
	}
	p.cmd = cmd
	p.pid = cmd.Process.Pid

	// The init child closes its end of the pipe by exec'ing the command (close-on-exec),
	// or writes why it could not and exits.
	msgCh := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(errR, 4096))
		msgCh <- b
	}()
	var msg []byte
	select {
	case msg = <-msgCh:
	case <-ctx.Done():
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		msg = <-msgCh
		if len(msg) == 0 {
			msg = []byte(ctx.Err().Error())
		}
	}
	p.startedAt = time.Now()
	if len(msg) > 0 {
		_ = cmd.Wait()
		outR.Close()
		errOutR.Close()
		p.cg.remove()
		return &StartError{Msg: string(msg)}
	}
	p.log.copyStreams(outR, errOutR)
	return nil
}

// wait reaps the process, kills what is left of its process group (as a runtime
// does when a container's main process exits) and closes the log.
func (p *Process) wait() {
	if p.oci != nil {
		p.waitOCI()
		return
	}
	defer close(p.released)
	err := p.cmd.Wait()
	finished := time.Now()
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	res := Result{StartedAt: p.startedAt, FinishedAt: finished}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.Signal = ws.Signal()
			res.ExitCode = 128 + int(ws.Signal())
		} else {
			res.ExitCode = ee.ExitCode()
		}
	default:
		res.ExitCode = 128
	}
	// Output still buffered in the pipes belongs to the log; a background process
	// that escaped the group may hold them open, so do not wait for it forever.
	p.log.drain(2 * time.Second)
	res.OOMKilled = p.cg.oomKilled()
	p.cg.remove()
	p.result = res
	close(p.done)
}

// PID returns the host process ID of the container's main process.
func (p *Process) PID() int { return p.pid }

// Isolated reports whether the process runs in its own mount and PID namespaces.
func (p *Process) Isolated() bool { return p.isolated }

// StartedAt returns when the command began to run.
func (p *Process) StartedAt() time.Time { return p.startedAt }

// Done is closed once the process has exited and its log is complete.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether Done is closed.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Result returns the outcome; valid only after Done is closed.
func (p *Process) Result() Result {
	<-p.done
	return p.result
}

// Signal sends sig to every process in the container's process group.
// Signalling an exited container is not an error.
func (p *Process) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return nil
	}
	if p.oci != nil {
		return p.signalOCI(sig)
	}
	if err := syscall.Kill(-p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal container process group %d: %w", p.pid, err)
	}
	return nil
}

// Stop sends SIGTERM to the process group, waits up to grace for the process to exit,
// then sends SIGKILL, and returns once the process has exited. If ctx ends first, the
// process is killed at once. A zero grace kills at once.
func (p *Process) Stop(ctx context.Context, grace time.Duration) Result {
	if grace > 0 {
		_ = p.Signal(syscall.SIGTERM)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.done:
			return p.result
		case <-t.C:
		case <-ctx.Done():
		}
	}
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
	return p.result
}

// Kill sends SIGKILL to the process group and waits for the process to exit.
func (p *Process) Kill() Result {
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
	return p.result
}

// forker runs fork+exec on one OS thread that never exits: Pdeathsig fires when the
// thread that forked a child exits, not when the process does, so forking from an
// arbitrary (possibly short-lived) runtime thread could kill containers at random.
// A child that joins a network namespace is forked with the thread in it (a child
// gets the namespaces of the thread that forked it), and the thread returns to
// the node's namespace at once.
var forker struct {
	once sync.Once
	reqs chan func()
	// stuck is set when the thread could not return to the node's network
	// namespace: no container is started from it after that.
	stuck error
}

func forkOnLockedThread(start func() error, netns *os.File) error {
	forker.once.Do(func() {
		forker.reqs = make(chan func())
		go func() {
			lockThread()
			for f := range forker.reqs {
				f()
			}
		}()
	})
	errc := make(chan error, 1)
	forker.reqs <- func() {
		if forker.stuck != nil {
			errc <- forker.stuck
			return
		}
		if netns == nil {
			errc <- start()
			return
		}
		back, err := enterNetNS(netns)
		if err != nil {
			errc <- err
			return
		}
		err = start()
		if rerr := back(); rerr != nil {
			forker.stuck = rerr
			if err == nil {
				err = rerr
			}
		}
		errc <- err
	}
	return <-errc
}
