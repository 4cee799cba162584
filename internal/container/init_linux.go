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
	// Capabilities, no_new_privs and a mount namespace entered with setns
	// belong to a thread: the one that execs the command.
	runtime.LockOSThread()
	if err := joinCgroups(cfg.Cgroups); err != nil {
		return err
	}
	if cfg.EnterMount != 0 {
		return enterMountAndExec(cfg)
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
				if err := mountOnHost(m); err != nil {
					return err
				}
			}
			// A fresh /proc shows the container's own PID namespace, so ps and kill -1 work.
			_ = syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "")
		}
	}
	return chdirAndExec(cfg)
}

// mountOverlay mounts the image's overlay at target: lower read-only,
// upper the instance's writable layer. The layer is thrown away with the
// instance, so it is mounted volatile (Linux 5.10+: no sync of the upper file
// system, at unmount either; without it unmounting costs a journal commit of
// the disk the layer is on, 6-8 ms here on the path to a container's result),
// as an ephemeral container layer can be; a kernel that refuses the option
// gets the plain mount.
func mountOverlay(target, lower, upper, work string) error {
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	err := unix.Mount("overlay", target, "overlay", 0, opts+",volatile")
	if errors.Is(err, unix.EINVAL) {
		err = unix.Mount("overlay", target, "overlay", 0, opts)
	}
	if err != nil {
		return fmt.Errorf("mount the image's root file system (overlay %s): %w", opts, err)
	}
	return nil
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
	if err := mountOverlay(root, r.Image, upper, work); err != nil {
		return err
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
		if err := bindPath("/dev/"+name, filepath.Join(dev, name)); err != nil {
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
	sys, err := in("/sys")
	if err != nil {
		return err
	}
	if err := mountSys(sys, cfg.Security.Privileged); err != nil {
		return err
	}
	if err := mountVolumes(root, cfg.Mounts); err != nil {
		return err
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
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if cfg.Security.Privileged {
		return nil
	}
	return confineMounts()
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
	if cfg.Rootfs != nil && cfg.Security.ReadOnlyRootFilesystem {
		if err := syscall.Mount("", "/", "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make the root file system read-only: %w", err)
		}
	}
	return confineAndExec(cfg, dir, cfg.Rootfs != nil)
}

// confineAndExec switches to the container's user, in dir, confined when
// confine is set (a container of an image, see Security), and execs the command.
func confineAndExec(cfg initConfig, dir string, confine bool) error {
	var keep uint64
	if confine {
		var err error
		if keep, err = capsOf(cfg.Security); err != nil {
			return err
		}
		if err := dropBoundingSet(keep); err != nil {
			return err
		}
		if cfg.Security.NoNewPrivileges {
			if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
				return fmt.Errorf("set no_new_privs: %w", err)
			}
		}
	}
	if err := setUser(cfg.User); err != nil {
		return err
	}
	if confine && (cfg.User == nil || cfg.User.UID == 0) {
		if err := setCapabilities(keep); err != nil {
			return err
		}
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

// bindPath bind-mounts the host's file at target, a path the node made (in the
// container's fresh /dev): no one else can have put a link on its way.
func bindPath(source, target string) error {
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("create mount point %q: %w", target, err)
	}
	_ = f.Close()
	if err := syscall.Mount(source, target, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %q at %q: %w", source, target, err)
	}
	return nil
}

// mountVolumes mounts the spec's mounts into the image's root at root, each
// mount point resolved and created inside the root by handle: a volume already
// mounted there (an emptyDir another container of the pod writes) cannot turn a
// later mount point into a link to the host's file system.
func mountVolumes(root string, mounts []Mount) error {
	if len(mounts) == 0 {
		return nil
	}
	rootH, err := os.OpenFile(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the root file system: %w", err)
	}
	defer rootH.Close()
	for _, m := range mounts {
		if err := mountVolume(rootH, m); err != nil {
			return err
		}
	}
	return nil
}

func mountVolume(root *os.File, m Mount) error {
	src, err := openSource(m)
	if err != nil {
		return err
	}
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil { //nolint:gosec // a file descriptor fits in int
		return fmt.Errorf("mount source %q: %w", m.HostPath, err)
	}
	target, err := openTargetInRoot(root, m.ContainerPath, st.Mode&unix.S_IFMT == unix.S_IFDIR)
	if err != nil {
		return fmt.Errorf("create mount point %q in the image: %w", m.ContainerPath, err)
	}
	defer target.Close()
	return moveBind(src, target, m)
}

// mountOnHost mounts m for a host process: its mount point is the host's
// ContainerPath (created when missing); the source is opened by handle as in
// image mode, so a subPath never leads out of its volume.
func mountOnHost(m Mount) error {
	src, err := openSource(m)
	if err != nil {
		return err
	}
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil { //nolint:gosec // a file descriptor fits in int
		return fmt.Errorf("mount source %q: %w", m.HostPath, err)
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	path := m.ContainerPath
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		if isDir {
			err = os.MkdirAll(path, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
				err = f.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("create mount point %q: %w", path, err)
		}
	}
	target, err := os.OpenFile(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open mount point %q: %w", path, err)
	}
	defer target.Close()
	return moveBind(src, target, m)
}

// openSource opens what m shows, by handle: HostPath, or SubPath resolved
// inside it and created there as a directory when missing (see Mount.SubPath).
func openSource(m Mount) (*os.File, error) {
	base, err := os.OpenFile(m.HostPath, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("mount source: %w", err)
	}
	if m.SubPath == "" {
		return base, nil
	}
	defer base.Close()
	f, err := securejoin.OpenatInRoot(base, m.SubPath)
	if errors.Is(err, os.ErrNotExist) {
		f, err = securejoin.MkdirAllHandle(base, m.SubPath, 0o777)
	}
	if err != nil {
		return nil, fmt.Errorf("subPath %q of %q: %w", m.SubPath, m.HostPath, err)
	}
	return f, nil
}

// openTargetInRoot opens path inside root by handle, creating it when missing
// (a directory, or an empty file with its parent directories), without
// following a link out of root.
func openTargetInRoot(root *os.File, path string, dir bool) (*os.File, error) {
	if dir {
		return securejoin.MkdirAllHandle(root, path, 0o755)
	}
	f, err := securejoin.OpenatInRoot(root, path)
	if !errors.Is(err, os.ErrNotExist) {
		return f, err
	}
	parent, err := securejoin.MkdirAllHandle(root, filepath.Dir(filepath.Clean("/"+path)), 0o755)
	if err != nil {
		return nil, err
	}
	defer parent.Close()
	name := filepath.Base(path)
	pfd := int(parent.Fd()) //nolint:gosec // a file descriptor fits in int
	fd, err := unix.Openat(pfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err == nil {
		_ = unix.Close(fd)
	} else if !errors.Is(err, unix.EEXIST) {
		return nil, err
	}
	fd, err = unix.Openat(pfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// moveBind mounts a recursive copy of the tree at src onto target, both
// handles: open_tree, mount_setattr (read-only with every mount below it when
// m is ReadOnly), move_mount. No path is resolved again on the way.
func moveBind(src, target *os.File, m Mount) error {
	tree, err := unix.OpenTree(int(src.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE) //nolint:gosec // a file descriptor fits in int
	if err != nil {
		return fmt.Errorf("bind mount %q at %q: open_tree: %w", m.HostPath, m.ContainerPath, err)
	}
	defer func() { _ = unix.Close(tree) }()
	if m.ReadOnly {
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
			return fmt.Errorf("make %q read-only: %w", m.ContainerPath, err)
		}
	}
	if err := unix.MoveMount(tree, "", int(target.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil { //nolint:gosec // a file descriptor fits in int
		return fmt.Errorf("bind mount %q at %q: move_mount: %w", m.HostPath, m.ContainerPath, err)
	}
	return nil
}

// capsOf is the capability set a confined container keeps.
func capsOf(sec Security) (uint64, error) {
	switch {
	case sec.Privileged:
		return capMask(CapabilityNames())
	case sec.Capabilities != nil:
		return capMask(sec.Capabilities)
	default:
		return capMask(DefaultCapabilities)
	}
}

// enterMountAndExec is the second init of a command exec'd into a container
// of an image: nsenter put it in the container's PID, network and UTS
// namespaces; it enters the mount namespace itself (a thread that shares no
// file system attributes may), then is confined as the container is.
func enterMountAndExec(cfg initConfig) error {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", cfg.EnterMount))
	if err != nil {
		return fmt.Errorf("open the container's mount namespace: %w", err)
	}
	defer ns.Close()
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare file system attributes: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil { //nolint:gosec // a file descriptor fits in int
		return fmt.Errorf("enter the container's mount namespace: %w", err)
	}
	dir := cfg.Dir
	if dir == "" {
		dir = "/"
	}
	return confineAndExec(cfg, dir, true)
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
	argv := []string{"nsenter", "--target", strconv.Itoa(cfg.Join), "--pid"}
	if !cfg.Confined {
		argv = append(argv, "--mount", "--wd="+dir)
	}
	if cfg.JoinNet {
		argv = append(argv, "--net")
	}
	if cfg.JoinUTS {
		argv = append(argv, "--uts")
	}
	if cfg.Confined {
		// The node's binary again, by a descriptor nsenter inherits: it enters
		// the mount namespace and confines the command (enterMountAndExec).
		self, err := unix.Open(selfExe, unix.O_RDONLY, 0) // inherited: no O_CLOEXEC
		if err != nil {
			return fmt.Errorf("open the node's binary: %w", err)
		}
		next := cfg
		next.Join, next.EnterMount, next.NSEnter = 0, cfg.Join, ""
		next.Cgroups = nil // joined already
		env, err := next.encode()
		if err != nil {
			return err
		}
		argv = append(argv, "--", fmt.Sprintf("/proc/self/fd/%d", self))
		syscall.CloseOnExec(3)
		return syscall.Exec(nsenter, argv, append(os.Environ(), env))
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
