package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one component of the cluster running as a child process in its
// own process group. The child gets SIGKILL when the thread that started it
// dies (parent-death signal), so a killed parent leaves no orphan.
type process struct {
	name    string
	path    string
	args    []string
	env     []string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // exit error, valid after done
}

// spawner starts every child from one OS thread that never exits: Linux
// delivers the parent-death signal when the *thread* that forked the child
// exits, and Go may otherwise retire threads.
var spawner = func() chan func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread()
		for f := range ch {
			f()
		}
	}()
	return ch
}()

func (p *process) start() error {
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening %s log: %w", p.name, err)
	}
	fmt.Fprintf(logFile, "\n=== %s starting %s %s\n", time.Now().Format(time.RFC3339), p.path, strings.Join(p.args, " "))
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = componentAttr()
	errc := make(chan error, 1)
	spawner <- func() { errc <- cmd.Start() }
	if err := <-errc; err != nil {
		logFile.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.err = cmd, done, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// exited is closed when the running instance has exited.
func (p *process) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.done
}

func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *process) running() bool {
	select {
	case <-p.exited():
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs
// the group. It returns once the process has exited.
func (p *process) stop(ctx context.Context, grace time.Duration) error {
	pid := p.pid()
	if pid == 0 || !p.running() {
		return nil
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited():
	case <-t.C:
	case <-ctx.Done():
	}
	// Kill whatever is left of the group even after the leader exited: a
	// component's children must not outlive it.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	select {
	case <-p.exited():
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, pid)
	}
}

// exitError describes how the process ended, for error messages.
func (p *process) exitError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		return errors.New("exited with status 0")
	}
	return p.err
}

// logTail returns the last n lines of the component's log.
func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	return lastLines(string(data), n)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
