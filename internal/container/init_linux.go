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
)

func lockThread() { runtime.LockOSThread() }

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

func sysProcAttr(isolated bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if isolated {
		a.Cloneflags = syscall.CLONE_NEWNS | syscall.CLONE_NEWPID
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
	if cfg.Isolated {
		if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make mounts private: %w", err)
		}
		for _, m := range cfg.Mounts {
			if err := bindMount(m); err != nil {
				return err
			}
		}
		// A fresh /proc shows the container's own PID namespace, so ps and kill -1 work.
		_ = syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "")
	}
	return chdirAndExec(cfg)
}

func chdirAndExec(cfg initConfig) error {
	dir := cfg.Dir
	if dir == "" {
		dir = "/"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create working directory: %w", err)
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
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fmt.Errorf("exec into an isolated container needs nsenter: %w", err)
	}
	dir := cfg.Dir
	if dir == "" {
		dir = "/"
	}
	argv := append([]string{"nsenter", "--target", strconv.Itoa(cfg.Join), "--mount", "--pid", "--wd=" + dir, "--"}, cfg.Argv...)
	syscall.CloseOnExec(3)
	return syscall.Exec(nsenter, argv, os.Environ())
}
