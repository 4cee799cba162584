package container

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// ociContainer is a container instance run by an OCI runtime (see OCIRuntime).
type ociContainer struct {
	rt      OCIRuntime
	id      string
	bundle  string
	rootfs  string   // the overlay's mount point, unmounted at the end
	binds   []string // subPath mounts made in State, unmounted at the end
	process specs.Process
	cmd     *exec.Cmd // runc run
	exited  chan struct{}
	waitErr error
}

func (c *ociContainer) runc(args ...string) *exec.Cmd {
	cmd := exec.Command(c.rt.Path, append([]string{"--root", c.rt.Root}, args...)...) //nolint:gosec // the node's runtime
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startOCI starts the container with the OCI runtime and returns once its
// command runs (runc wrote its PID), or with a *StartError when runc could not
// start it.
func (p *Process) startOCI(ctx context.Context) error {
	rt := *p.spec.Runtime
	if err := startWatcher(rt); err != nil {
		return err
	}
	st := p.spec.Rootfs.State
	c := &ociContainer{rt: rt, id: "kt-" + randomID(), bundle: filepath.Join(st, "bundle"), rootfs: filepath.Join(st, "merged"), exited: make(chan struct{})}
	upper, work := filepath.Join(st, "upper"), filepath.Join(st, "work")
	for _, d := range []string{c.rootfs, upper, work, c.bundle} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create root file system: %w", err)
		}
	}
	if err := mountOverlay(c.rootfs, p.spec.Rootfs.Image, upper, work); err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			c.release()
		}
	}()
	mounts, err := c.volumeMounts(st, p.spec.Mounts)
	if err != nil {
		return err
	}
	cg, cgPath, err := runcCgroup(c.id)
	if err != nil {
		return err
	}
	netns := ""
	if p.spec.NetNS != nil {
		netns = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), p.spec.NetNS.Fd())
	}
	s, err := ociSpec(p.spec, c.rootfs, mounts, cgPath, netns)
	if err != nil {
		return err
	}
	c.process = *s.Process
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode the runtime spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(c.bundle, "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("write the runtime spec: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("stdout pipe: %w", err)
	}
	errOutR, errOutW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fmt.Errorf("stderr pipe: %w", err)
	}
	pidFile, logFile := filepath.Join(c.bundle, "pid"), filepath.Join(c.bundle, "runc.log")
	c.cmd = c.runc("--log", logFile, "--log-format", "json", "run", "--keep", "--bundle", c.bundle, "--pid-file", pidFile, c.id)
	c.cmd.Stdout, c.cmd.Stderr = outW, errOutW
	startErr := forkOnLockedThread(c.cmd.Start, nil)
	outW.Close()
	errOutW.Close()
	if startErr != nil {
		outR.Close()
		errOutR.Close()
		return fmt.Errorf("start runc: %w", startErr)
	}
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
	// runc writes the PID file (by rename) once the command runs; it exits
	// without one when it could not start it.
	pid, err := waitPIDFile(ctx, pidFile, c.exited)
	switch {
	case err != nil:
		_ = c.cmd.Process.Kill()
		<-c.exited
		outR.Close()
		errOutR.Close()
		return &StartError{Msg: err.Error()}
	case pid == 0:
		outR.Close()
		errOutR.Close()
		return &StartError{Msg: runcError(logFile, c.waitErr)}
	}
	ok = true
	p.oci, p.cg, p.pid = c, cg, pid
	p.startedAt = time.Now()
	p.log.copyStreams(outR, errOutR)
	return nil
}

// waitPIDFile returns the PID in the file path once it is there, or 0 when
// exited is closed without it; an error when ctx ends first. It waits for
// inotify events of the file's directory (runc renames the file into it),
// so the command's start is seen at once and nothing wakes in between;
// without inotify it looks every millisecond.
func waitPIDFile(ctx context.Context, path string, exited <-chan struct{}) (int, error) {
	var events <-chan struct{}
	if fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK); err == nil {
		if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
			_ = unix.Close(fd)
		} else {
			f := os.NewFile(uintptr(fd), "inotify") // non-blocking: Close ends a Read
			// Closing an inotify instance waits for an SRCU grace period
			// of the kernel (4-5 ms here): not on the container's start.
			defer func() { go f.Close() }()
			ch := make(chan struct{}, 1)
			go func() {
				defer close(ch)
				buf := make([]byte, 4096)
				for {
					if _, err := f.Read(buf); err != nil {
						return
					}
					select {
					case ch <- struct{}{}:
					default:
					}
				}
			}()
			events = ch
		}
	}
	for {
		if pid := readPID(path); pid != 0 {
			return pid, nil
		}
		var tick <-chan time.Time
		if events == nil {
			tick = time.After(time.Millisecond)
		}
		select {
		case _, ok := <-events:
			if !ok {
				events = nil // inotify failed: look every millisecond
			}
		case <-tick:
		case <-exited:
			return readPID(path), nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// runcError is the last error runc logged, else how it ended.
func runcError(logFile string, waitErr error) string {
	b, _ := os.ReadFile(logFile)
	msg := ""
	for _, l := range bytes.Split(b, []byte("\n")) {
		var e struct{ Level, Msg string }
		if json.Unmarshal(l, &e) == nil && e.Level == "error" && e.Msg != "" {
			msg = e.Msg
		}
	}
	if msg == "" {
		msg = fmt.Sprintf("runc: %v", waitErr)
	}
	return msg
}

// waitOCI waits for runc run to return the container's exit status, reads
// whether the OOM killer ended it, and deletes the container. When the
// container's cgroup shows that none of its processes is left (the usual
// end: its PID 1 exited, which ends every process of its PID namespace), the
// result comes first and `runc delete` after it, as containerd reports a
// task's exit before the kubelet removes the container: the delete (8-16 ms
// here) is not on the path to a pod's end. Otherwise (runc itself was
// killed) the container is deleted, and so killed, before the result.
func (p *Process) waitOCI() {
	c := p.oci
	<-c.exited
	res := Result{StartedAt: p.startedAt, FinishedAt: time.Now()}
	var ee *exec.ExitError
	switch {
	case c.waitErr == nil:
	case errors.As(c.waitErr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.Signal, res.ExitCode = ws.Signal(), 128+int(ws.Signal())
		} else {
			// runc returns 128+n for a command killed by signal n.
			res.ExitCode = ee.ExitCode()
			if res.ExitCode > 128 && res.ExitCode < 128+65 {
				res.Signal = syscall.Signal(res.ExitCode - 128)
			}
		}
	default:
		res.ExitCode = 128
	}
	p.log.drain(2 * time.Second)
	res.OOMKilled = p.cg.oomKilled()
	defer close(p.released)
	if p.cg.empty() {
		deleting.Add(1)
		defer deleting.Done()
		c.unmount()
		p.result = res
		close(p.done)
		c.delete()
		p.cg.remove()
		return
	}
	c.release()
	p.cg.remove()
	p.result = res
	close(p.done)
}

// deleting counts the containers whose result is out and whose deletion
// from runc is not done (see waitOCI).
var deleting sync.WaitGroup

// WaitDeleted returns once every container this process ran under an OCI
// runtime and whose result is out has been deleted from the runtime (its
// state and cgroup gone), or with ctx's error when ctx ends first. A node
// calls it when it stops, after its containers' ends, so that nothing of
// them outlives it.
func WaitDeleted(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		deleting.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release deletes the container (and whatever runs in it) and unmounts what
// the node mounted for it.
func (c *ociContainer) release() {
	c.delete()
	c.unmount()
}

// delete removes the container from runc, killing whatever runs in it.
func (c *ociContainer) delete() {
	_ = c.runc("delete", "--force", c.id).Run()
}

// unmount unmounts what the node mounted for the container: its subPaths
// and root.
func (c *ociContainer) unmount() {
	for _, b := range slices.Backward(c.binds) {
		_ = unix.Unmount(b, unix.MNT_DETACH)
	}
	_ = unix.Unmount(c.rootfs, unix.MNT_DETACH)
}

// signalOCI sends sig with runc kill: SIGKILL to every process of the
// container, any other signal to its main process (as containerd stops one).
func (p *Process) signalOCI(sig syscall.Signal) error {
	args := []string{"kill"}
	if sig == syscall.SIGKILL {
		args = append(args, "--all")
	}
	out, err := p.oci.runc(append(args, p.oci.id, strconv.Itoa(int(sig)))...).CombinedOutput()
	if err != nil && !p.Exited() {
		select {
		case <-p.oci.exited: // it ended meanwhile
			return nil
		default:
		}
		return fmt.Errorf("runc kill %s: %w: %s", p.oci.id, err, bytes.TrimSpace(out))
	}
	return nil
}

// execOCI runs argv in the container with runc exec, as the container's
// process runs (user, environment, working directory, capabilities,
// no_new_privs, seccomp). A command runc cannot start exits 127, runc's
// reason on stderr.
func (p *Process) execOCI(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	c := p.oci
	proc := c.process
	proc.Args = argv
	b, err := json.Marshal(proc)
	if err != nil {
		return 0, fmt.Errorf("encode exec process: %w", err)
	}
	name := filepath.Join(c.bundle, "exec-"+randomID())
	if err := os.WriteFile(name+".json", b, 0o600); err != nil {
		return 0, fmt.Errorf("write exec process: %w", err)
	}
	defer func() { _ = os.Remove(name + ".json"); _ = os.Remove(name + ".pid") }()
	cmd := exec.CommandContext(ctx, c.rt.Path, "--root", c.rt.Root, "exec", "--process", name+".json", "--pid-file", name+".pid", c.id) //nolint:gosec // the node's runtime
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.Cancel = func() error {
		if pid := readPID(name + ".pid"); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return cmd.Process.Kill()
	}
	// A stdin that never ends must not keep Wait from returning after the command exits.
	cmd.WaitDelay = time.Second
	if err := forkOnLockedThread(cmd.Start, nil); err != nil {
		return 0, fmt.Errorf("start exec: %w", err)
	}
	err = cmd.Wait()
	if readPID(name+".pid") == 0 {
		return 127, ctx.Err()
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), ctx.Err()
		}
		return ee.ExitCode(), nil
	case errors.Is(err, exec.ErrWaitDelay):
		return cmd.ProcessState.ExitCode(), nil
	default:
		return 0, fmt.Errorf("exec: %w", err)
	}
}

// volumeMounts are the container's mounts for the runtime spec. A subPath
// is resolved inside its volume by handle (see Mount.SubPath) and mounted
// from its handle at a path of the instance's State, which the runtime then
// bind-mounts, as the kubelet hands a runtime its subPaths: the runtime never
// resolves a path inside a volume.
func (c *ociContainer) volumeMounts(state string, mounts []Mount) ([]specs.Mount, error) {
	var out []specs.Mount
	for i, m := range mounts {
		src := m.HostPath
		if m.SubPath != "" {
			h, err := openSource(m)
			if err != nil {
				return nil, err
			}
			src, err = c.bindSubPath(h, filepath.Join(state, "subpaths", strconv.Itoa(i)), m)
			h.Close()
			if err != nil {
				return nil, err
			}
		}
		opts := []string{"rbind", "rprivate"}
		if m.ReadOnly {
			opts = append(opts, "ro", "rro")
		}
		out = append(out, specs.Mount{Destination: m.ContainerPath, Type: "bind", Source: src, Options: opts})
	}
	return out, nil
}

func (c *ociContainer) bindSubPath(h *os.File, target string, m Mount) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(h.Fd()), &st); err != nil { //nolint:gosec // a file descriptor fits in int
		return "", fmt.Errorf("mount source %q: %w", m.HostPath, err)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return "", fmt.Errorf("create subPath mount point: %w", err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("create subPath mount point: %w", err)
		}
	} else if f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644); err != nil {
		return "", fmt.Errorf("create subPath mount point: %w", err)
	} else {
		_ = f.Close()
	}
	t, err := os.OpenFile(target, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open subPath mount point: %w", err)
	}
	defer t.Close()
	if err := moveBind(h, t, Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath}); err != nil {
		return "", err
	}
	c.binds = append(c.binds, target)
	return target, nil
}

// runcCgroup is the container's cgroup as runc makes it from cgroupsPath:
// on cgroup v1, kubetask/<id> under the node's own cgroup of each hierarchy;
// on v2, /kubetask/<id> (the node's own cgroup holds processes, so it cannot
// delegate controllers).
func runcCgroup(id string) (*cgroup, string, error) {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		dir := filepath.Join(cgroupRoot, "kubetask", id)
		return &cgroup{v2: true, dirs: []string{dir}, mem: dir}, "/kubetask/" + id, nil
	}
	own, err := ownCgroupsV1()
	if err != nil {
		return nil, "", err
	}
	cg := &cgroup{}
	for _, ctrl := range []string{"memory", "cpu"} {
		if path, ok := own[ctrl]; ok {
			dir := filepath.Join(cgroupRoot, ctrl, path, "kubetask", id)
			cg.dirs = append(cg.dirs, dir)
			if ctrl == "memory" {
				cg.mem = dir
			}
		}
	}
	return cg, "kubetask/" + id, nil
}

// ociSpec is the runtime spec of a container of an image, as containerd's
// default spec and its CRI plugin make one for a Kubernetes container:
// containerd's default mounts (/proc, /dev, /dev/pts, /dev/shm, /dev/mqueue,
// /sys read-only) and the CRI's /sys/fs/cgroup read-only; masked and
// read-only paths; the default capability set or the container's, none
// effective for a user other than root; no_new_privs as asked; containerd's
// default RLIMIT_NOFILE (1024); PID, IPC, UTS and mount namespaces of its
// own and the pod's network namespace; a cgroup with the limits; devices
// denied but runc's defaults; the default seccomp profile (moby's, which
// containerd's is derived from). A
// privileged container keeps every capability, a writable /sys, no masks and
// no seccomp filter.
func ociSpec(spec Spec, root string, volumes []specs.Mount, cgroupsPath, netns string) (*specs.Spec, error) {
	sec := spec.Security
	caps := DefaultCapabilities
	switch {
	case sec.Privileged:
		caps = CapabilityNames()
	case sec.Capabilities != nil:
		caps = sec.Capabilities
	}
	if _, err := capMask(caps); err != nil {
		return nil, err
	}
	caps = slices.Clone(caps)
	for i := range caps {
		caps[i] = strings.ToUpper(caps[i])
	}
	slices.Sort(caps)
	u := User{}
	if spec.User != nil {
		u = *spec.User
	}
	lc := &specs.LinuxCapabilities{Bounding: caps}
	if u.UID == 0 {
		lc.Permitted, lc.Effective = caps, caps
	}
	cwd := spec.WorkingDir
	if cwd == "" {
		cwd = "/"
	}
	nsOpts := []string{"nosuid", "noexec", "nodev"}
	sysOpts := append(slices.Clone(nsOpts), "ro")
	if sec.Privileged {
		sysOpts = slices.Clone(nsOpts)
	}
	s := &specs.Spec{
		Version:  "1.0.2-dev",
		Root:     &specs.Root{Path: root, Readonly: sec.ReadOnlyRootFilesystem},
		Hostname: spec.Hostname,
		Process: &specs.Process{
			Args:            spec.Command,
			Env:             withDefaultPath(spec.Env),
			Cwd:             filepath.Join("/", cwd),
			User:            specs.User{UID: u.UID, GID: u.GID, AdditionalGids: u.Groups},
			Capabilities:    lc,
			NoNewPrivileges: sec.NoNewPrivileges,
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
		},
		Mounts: append([]specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: nsOpts},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: nsOpts},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: sysOpts},
		}, volumes...),
		Linux: &specs.Linux{
			CgroupsPath: cgroupsPath,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			},
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace}},
		},
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		// The CRI's read-only /sys/fs/cgroup: on cgroup v1 runc 1.1 leaves
		// the tmpfs that holds the hierarchies writable, so it is left out
		// there (the fresh sysfs's /sys/fs/cgroup stays empty).
		cg := specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: append(slices.Clone(nsOpts), "relatime", "ro")}
		s.Mounts = slices.Insert(s.Mounts, 6, cg)
	}
	if netns != "" {
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: netns})
	}
	if lim := spec.Limits; lim.MemoryBytes > 0 {
		m := lim.MemoryBytes
		s.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &m}
		if swapAccounting() {
			s.Linux.Resources.Memory.Swap = &m // no swap, as the kubelet asks
		}
	}
	if lim := spec.Limits; lim.MilliCPU > 0 {
		q, period := max(lim.MilliCPU*100, 1000), uint64(100000)
		s.Linux.Resources.CPU = &specs.LinuxCPU{Quota: &q, Period: &period}
	}
	if !sec.Privileged {
		s.Linux.MaskedPaths, s.Linux.ReadonlyPaths = slices.Clone(MaskedPaths), slices.Clone(ReadonlyPaths)
		if !sec.SeccompUnconfined {
			// The default profile of Docker and containerd (containerd's
			// contrib/seccomp is derived from it), from its own small module:
			// containerd's package links grpc, ttrpc and 13 other modules into
			// every kubetask binary (test/costs).
			p, err := seccomp.GetDefaultProfile(s)
			if err != nil {
				return nil, fmt.Errorf("the default seccomp profile: %w", err)
			}
			s.Linux.Seccomp = p
		}
	}
	return s, nil
}

// swapAccounting reports whether the memory cgroup limits swap (v1's memsw
// files; v2 always has memory.swap.max below the root when swap is on).
func swapAccounting() bool {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		return true // runc ignores a missing memory.swap.max when asked for none
	}
	_, err := os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes"))
	return err == nil
}

// watchEnvVar makes the node's binary the watcher of a runc root (see
// startWatcher): "launch" starts the watcher and exits, "watch" is it.
const (
	watchEnvVar     = "_KUBETASK_OCI_WATCH"
	watchRuncEnvVar = "_KUBETASK_OCI_WATCH_RUNC"
	watchRootEnvVar = "_KUBETASK_OCI_WATCH_ROOT"
)

var watcher struct {
	mu    sync.Mutex
	roots map[string]*os.File // runc root -> the write end the watcher reads
}

// startWatcher starts, once per runc root, a process outside the node's
// session that waits for the node to end (the end of a pipe only the node
// holds) and then kills and deletes every container left in the root: runc
// is killed with the node, but a container does not die with its runc. It
// is started through a launcher that exits at once, so it is no child of the
// node.
func startWatcher(rt OCIRuntime) error {
	watcher.mu.Lock()
	defer watcher.mu.Unlock()
	if watcher.roots[rt.Root] != nil {
		return nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("watcher pipe: %w", err)
	}
	defer r.Close()
	cmd := exec.Command(selfExe)
	cmd.Args = []string{"kubetask-oci-watch"}
	cmd.Env = append(os.Environ(), watchEnvVar+"=launch", watchRuncEnvVar+"="+rt.Path, watchRootEnvVar+"="+rt.Root)
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if out, err := cmd.CombinedOutput(); err != nil {
		w.Close()
		return fmt.Errorf("start the runc watcher: %w: %s", err, out)
	}
	if watcher.roots == nil {
		watcher.roots = map[string]*os.File{}
	}
	watcher.roots[rt.Root] = w // held open for the node's life
	return nil
}

func init() {
	mode, ok := os.LookupEnv(watchEnvVar)
	if !ok {
		return
	}
	switch mode {
	case "launch":
		cmd := exec.Command(selfExe)
		cmd.Args = []string{"kubetask-oci-watch"}
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, watchEnvVar+"=") }), watchEnvVar+"=watch")
		cmd.ExtraFiles = []*os.File{os.NewFile(3, "node")}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	case "watch":
		signalIgnore()
		_, _ = io.Copy(io.Discard, os.NewFile(3, "node")) // until the node ends
		rt := OCIRuntime{Path: os.Getenv(watchRuncEnvVar), Root: os.Getenv(watchRootEnvVar)}
		c := &ociContainer{rt: rt}
		out, _ := c.runc("list", "-q").Output()
		for _, id := range strings.Fields(string(out)) {
			var state struct {
				Bundle string `json:"bundle"`
			}
			b, _ := c.runc("state", id).Output()
			_ = json.Unmarshal(b, &state)
			if state.Bundle != "" {
				_ = unix.Unmount(filepath.Join(filepath.Dir(state.Bundle), "merged"), unix.MNT_DETACH)
			}
			_ = c.runc("kill", "--all", id, "KILL").Run()
			_ = c.runc("delete", "--force", id).Run()
		}
		os.Exit(0)
	}
}

// signalIgnore keeps the watcher alive through the signals that stop its
// node (a terminal's SIGINT, a SIGHUP): it must outlive the node.
func signalIgnore() {
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGPIPE)
}
