package container

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// capNumbers names the Linux capabilities (capability(7)).
var capNumbers = map[string]uintptr{
	"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3, "CAP_FSETID": 4,
	"CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_LINUX_IMMUTABLE": 9,
	"CAP_NET_BIND_SERVICE": 10, "CAP_NET_BROADCAST": 11, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13,
	"CAP_IPC_LOCK": 14, "CAP_IPC_OWNER": 15, "CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_CHROOT": 18,
	"CAP_SYS_PTRACE": 19, "CAP_SYS_PACCT": 20, "CAP_SYS_ADMIN": 21, "CAP_SYS_BOOT": 22, "CAP_SYS_NICE": 23,
	"CAP_SYS_RESOURCE": 24, "CAP_SYS_TIME": 25, "CAP_SYS_TTY_CONFIG": 26, "CAP_MKNOD": 27, "CAP_LEASE": 28,
	"CAP_AUDIT_WRITE": 29, "CAP_AUDIT_CONTROL": 30, "CAP_SETFCAP": 31, "CAP_MAC_OVERRIDE": 32,
	"CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34, "CAP_WAKE_ALARM": 35, "CAP_BLOCK_SUSPEND": 36,
	"CAP_AUDIT_READ": 37, "CAP_PERFMON": 38, "CAP_BPF": 39, "CAP_CHECKPOINT_RESTORE": 40,
}

// CapabilityNames are every capability this package knows, by number.
func CapabilityNames() []string {
	out := make([]string, 0, len(capNumbers))
	for n := range capNumbers {
		out = append(out, n)
	}
	return out
}

// capMask turns names into the bits of a capability set; an unknown name is
// an error (the kubelet passes unknown ones to the runtime, which fails).
func capMask(names []string) (uint64, error) {
	var m uint64
	for _, n := range names {
		c, ok := capNumbers[strings.ToUpper(n)]
		if !ok {
			return 0, fmt.Errorf("unknown capability %q", n)
		}
		m |= 1 << c
	}
	return m, nil
}

// dropBoundingSet removes from the calling thread's bounding set every
// capability not in keep (the thread execs the command: the set is per
// thread and inherited across exec).
func dropBoundingSet(keep uint64) error {
	for c := uintptr(0); c < 64; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) { // past the kernel's last capability
				break
			}
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

// setCapabilities makes keep the thread's permitted and effective sets, with
// nothing inheritable or ambient (containerd gives none since CVE-2022-24769).
func setCapabilities(keep uint64) error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	data[0].Permitted, data[1].Permitted = uint32(keep), uint32(keep>>32) //nolint:gosec // the two halves of a 64-bit set
	data[0].Effective, data[1].Effective = data[0].Permitted, data[1].Permitted
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("set capabilities: %w", err)
	}
	return nil
}

// confineMounts masks and makes read-only what containerd's defaults do, in
// the container's root (after pivot_root).
func confineMounts() error {
	for _, p := range MaskedPaths {
		st, err := os.Stat(p)
		if err != nil {
			continue // not on this kernel
		}
		if st.IsDir() {
			err = syscall.Mount("tmpfs", p, "tmpfs", syscall.MS_RDONLY|syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "size=0")
		} else {
			err = syscall.Mount("/dev/null", p, "", syscall.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range ReadonlyPaths {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := readOnlyInPlace(p); err != nil {
			return err
		}
	}
	return nil
}

// readOnlyInPlace makes path, and every mount below it, read-only.
func readOnlyInPlace(path string) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("make %s read-only: open_tree: %w", path, err)
	}
	defer func() { _ = unix.Close(tree) }()
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("make %s read-only: %w", path, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("make %s read-only: move_mount: %w", path, err)
	}
	return nil
}

// mountSys gives the container a fresh sysfs at target, read-only (the
// host's /sys and its submounts, cgroup hierarchies included, are not there);
// a privileged container gets it writable.
func mountSys(target string, privileged bool) error {
	flags := uintptr(syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC)
	if !privileged {
		flags |= syscall.MS_RDONLY
	}
	if err := mkdirMount("sysfs", target, "sysfs", flags, ""); err == nil {
		return nil
	}
	// A sysfs of its own needs the network namespace's owner; fall back to
	// the host's, recursively read-only.
	if err := bindPathRec("/sys", target); err != nil {
		return err
	}
	if privileged {
		return nil
	}
	return readOnlyInPlace(target)
}

func bindPathRec(source, target string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("create mount point %q: %w", target, err)
	}
	if err := syscall.Mount(source, target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind mount %q at %q: %w", source, target, err)
	}
	return nil
}
