package container

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"
)

func lockThread() { runtime.LockOSThread() }

// enterNetNS moves the calling (locked) thread into the network namespace ns and
// returns how to move it back.
func enterNetNS(ns *os.File) (back func() error, err error) {
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return nil, fmt.Errorf("open the node's network namespace: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil { //nolint:gosec // a file descriptor fits in int
		self.Close()
		return nil, fmt.Errorf("enter the pod's network namespace: %w", err)
	}
	return func() error {
		defer self.Close()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil { //nolint:gosec // a file descriptor fits in int
			return fmt.Errorf("return to the node's network namespace: %w", err)
		}
		return nil
	}, nil
}

func resolveIsolation(iso Isolation) (bool, error) {
	switch iso {
	case IsolationNone:
		return false, nil
	case IsolationNamespaces:
		if os.Geteuid() != 0 {
			return false, errors.New("namespace isolation needs root")
		}
		return true, nil
	default:
		return os.Geteuid() == 0, nil
	}
}

func sysProcAttr(isolated, uts bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if isolated {
		a.Cloneflags = syscall.CLONE_NEWNS | syscall.CLONE_NEWPID
	}
	if uts {
		a.Cloneflags |= syscall.CLONE_NEWUTS
	}
	return a
}

// runInit prepares the container inside the init child and execs the command.
func runInit(cfg initConfig) error {
	if len(cfg.Argv) == 0 {
		return errors.New("no command to run")
	}
	if cfg.Join != 0 {
		return joinAndExec(cfg)
	}
	if cfg.Isolated && cfg.Hostname != "" {
		if err := syscall.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("set the host name %q: %w", cfg.Hostname, err)
		}
	}
	if cfg.Isolated {
		if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make mounts private: %w", err)
		}
		if cfg.Rootfs != nil {
			if err := enterRootfs(cfg); err != nil {
				return err
			}
		} else {
			for _, m := range cfg.Mounts {
				if err := bindMount(m); err != nil {
					return err
				}
			}
			// A fresh /proc shows the container's own PID namespace, so ps and kill -1 work.
			_ = syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "")
		}
	}
	return chdirAndExec(cfg)
}

// enterRootfs mounts the image's overlay with the container's /proc, /dev, /sys
// and mounts, and makes it the root (see Rootfs).
func enterRootfs(cfg initConfig) error {
	r := cfg.Rootfs
	root := filepath.Join(r.State, "merged")
	upper, work := filepath.Join(r.State, "upper"), filepath.Join(r.State, "work")
	for _, d := range []string{root, upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create root file system: %w", err)
		}
	}
	opts := "lowerdir=" + r.Image + ",upperdir=" + upper + ",workdir=" + work
	if err := syscall.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount the image's root file system (overlay %s): %w", opts, err)
	}
	in := func(p string) (string, error) {
		t, err := securejoin.SecureJoin(root, p)
		if err != nil {
			return "", fmt.Errorf("resolve %q in the image: %w", p, err)
		}
		return t, nil
	}
	const nodev = syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC
	proc, err := in("/proc")
	if err != nil {
		return err
	}
	if err := mkdirMount("proc", proc, "proc", nodev, ""); err != nil {
		return err
	}
	dev, err := in("/dev")
	if err != nil {
		return err
	}
	if err := mkdirMount("tmpfs", dev, "tmpfs", syscall.MS_NOSUID|syscall.MS_STRICTATIME, "mode=755,size=65536k"); err != nil {
		return err
	}
	for _, name := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := bindMount(Mount{HostPath: "/dev/" + name, ContainerPath: filepath.Join(dev, name)}); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("create /dev/%s: %w", name, err)
		}
	}
	if err := mkdirMount("shm", filepath.Join(dev, "shm"), "tmpfs", nodev, "mode=1777,size=65536k"); err != nil {
		return err
	}
	// Optional extras: a kernel without them still runs most commands.
	_ = mkdirMount("devpts", filepath.Join(dev, "pts"), "devpts", syscall.MS_NOSUID|syscall.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
	if sys, err := in("/sys"); err == nil {
		if mkdirMount("/sys", sys, "", syscall.MS_BIND|syscall.MS_REC, "") == nil {
			_ = syscall.Mount("", sys, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, "")
		}
	}
	for _, m := range cfg.Mounts {
		t, err := in(m.ContainerPath)
		if err != nil {
			return err
		}
		m.ContainerPath = t
		if err := bindMount(m); err != nil {
			return err
		}
	}
	// pivot_root(".", ".") stacks the old root under the new one; detaching it
	// leaves only the image (runc does the same).
	if err := os.Chdir(root); err != nil {
		return fmt.Errorf("enter the root file system: %w", err)
	}
	if err := syscall.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := syscall.Unmount(".", syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	return os.Chdir("/")
}

func mkdirMount(source, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("create mount point %q: %w", target, err)
	}
	if err := syscall.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s at %q: %w", fstype, target, err)
	}
	return nil
}

// setUser switches to the container's user: groups, then group, then user.
func setUser(u *User) error {
	if u == nil {
		return nil
	}
	groups := make([]int, len(u.Groups))
	for i, g := range u.Groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(int(u.GID)); err != nil {
		return fmt.Errorf("setgid %d: %w", u.GID, err)
	}
	if err := syscall.Setuid(int(u.UID)); err != nil {
		return fmt.Errorf("setuid %d: %w", u.UID, err)
	}
	// A change of credentials clears the parent-death signal: set it again, or
	// the container would outlive the node.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("set the parent-death signal: %w", err)
	}
	return nil
}

func chdirAndExec(cfg initConfig) error {
	dir := cfg.Dir
	if dir == "" {
		dir = "/"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create working directory: %w", err)
	}
	if err := setUser(cfg.User); err != nil {
		return err
	}
	if err := os.Chdir(dir); err != nil {
		return fmt.Errorf("chdir to working directory %q: %w", dir, err)
	}
	path, err := exec.LookPath(cfg.Argv[0])
	if err != nil {
		return err
	}
	syscall.CloseOnExec(3)
	if err := syscall.Exec(path, cfg.Argv, os.Environ()); err != nil {
		return fmt.Errorf("exec %q: %w", cfg.Argv[0], err)
	}
	return nil
}

func bindMount(m Mount) error {
	st, err := os.Stat(m.HostPath)
	if err != nil {
		return fmt.Errorf("mount source: %w", err)
	}
	target := m.ContainerPath
	if _, err := os.Lstat(target); errors.Is(err, os.ErrNotExist) {
		if st.IsDir() {
			err = os.MkdirAll(target, 0o755)
		} else {
			if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
				var f *os.File
				if f, err = os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
					err = f.Close()
				}
			}
		}
		if err != nil {
			return fmt.Errorf("create mount point %q: %w", target, err)
		}
	}
	if err := syscall.Mount(m.HostPath, target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind mount %q at %q: %w", m.HostPath, target, err)
	}
	if m.ReadOnly {
		if err := syscall.Mount("", target, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make %q read-only: %w", target, err)
		}
	}
	return nil
}

// joinAndExec enters the mount and PID namespaces of a running container through
// nsenter (setns into a mount namespace is not possible from a multi-threaded Go
// process, and joining a PID namespace only affects children).
func joinAndExec(cfg initConfig) error {
	nsenter := cfg.NSEnter
	if nsenter == "" {
		return errors.New("exec into an isolated container needs nsenter (util-linux) in the node's PATH")
	}
	dir := cfg.Dir
	if dir == "" {
		dir = "/"
	}
	argv := []string{"nsenter", "--target", strconv.Itoa(cfg.Join), "--mount", "--pid", "--wd=" + dir}
	if cfg.JoinNet {
		argv = append(argv, "--net")
	}
	if cfg.JoinUTS {
		argv = append(argv, "--uts")
	}
	if u := cfg.User; u != nil {
		// nsenter sets no supplementary groups of its own: the exec'd command gets
		// the user and group, not the container's extra groups.
		argv = append(argv, "--setgid="+strconv.FormatUint(uint64(u.GID), 10), "--setuid="+strconv.FormatUint(uint64(u.UID), 10))
	}
	argv = append(append(argv, "--"), cfg.Argv...)
	syscall.CloseOnExec(3)
	return syscall.Exec(nsenter, argv, os.Environ())
}
