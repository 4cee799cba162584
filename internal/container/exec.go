package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// ErrNotRunning is returned by Exec for a container whose process has exited.
var ErrNotRunning = errors.New("container is not running")

// Exec runs argv in the running container, with the container's environment and
// working directory, in its mount and PID namespaces when it is isolated, and
// returns argv's exit code (128+signal when a signal ended it). A command that cannot
// be found exits 127 with the reason on stderr. When ctx ends the command is killed.
// stdin may be nil.
func (p *Process) Exec(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("exec without a command")
	}
	if p.Exited() {
		return 0, ErrNotRunning
	}
	if p.oci != nil {
		return p.execOCI(ctx, argv, stdin, stdout, stderr)
	}
	cfg := initConfig{Argv: argv, Dir: p.spec.WorkingDir, User: p.spec.User}
	if p.isolated {
		cfg.Join = p.pid
		cfg.JoinNet = p.spec.NetNS != nil
		cfg.JoinUTS = p.spec.Hostname != ""
		cfg.NSEnter, _ = exec.LookPath("nsenter") // the child reports a missing one
	}
	if p.spec.Rootfs != nil {
		// Confined as the container is; the init enters its mount namespace
		// itself, in the working directory.
		cfg.Confined, cfg.Security = true, p.spec.Security
		if p.cg != nil {
			cfg.Cgroups = p.cg.dirs
		}
	}
	cfgEnv, err := cfg.encode()
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, selfExe)
	cmd.Args = []string{initArgv0}
	cmd.Env = append(withDefaultPath(p.spec.Env), cfgEnv)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.SysProcAttr = sysProcAttr(false, false) // its own process group, killed with the node (on Linux)
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A stdin that never ends must not keep Wait from returning after the command exits.
	cmd.WaitDelay = time.Second
	if err := forkOnLockedThread(cmd.Start, nil); err != nil {
		return 0, fmt.Errorf("start exec: %w", err)
	}
	err = cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
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

// MaxTerminationMessage is the most the kubelet keeps of a termination message.
const MaxTerminationMessage = 4096

// ReadTerminationMessage returns the first MaxTerminationMessage bytes of the file at
// hostPath; a missing file is an empty message.
func ReadTerminationMessage(hostPath string) (string, error) {
	f, err := os.Open(hostPath)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("open termination message: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxTerminationMessage))
	if err != nil {
		return "", fmt.Errorf("read termination message: %w", err)
	}
	return string(b), nil
}

// LogTail returns the text of the last lines records of the log, cut to its last
// maxBytes bytes: the kubelet's message for FallbackToLogsOnError (80 lines, 2048 bytes).
func (p *Process) LogTail(lines int, maxBytes int) string {
	var b strings.Builder
	_ = readLog(context.Background(), p.spec.LogPath, p.log, LogOptions{TailLines: int64(lines)}, &b)
	s := b.String()
	if len(s) > maxBytes {
		s = s[len(s)-maxBytes:]
	}
	return s
}
