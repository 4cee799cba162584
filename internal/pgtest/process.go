package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is a running postgres (the postmaster).
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	err  error         // its exit status, once done
}

// spawner starts every server from one OS thread that never exits: Linux
// sends the parent-death signal when the thread that forked the child exits,
// and Go may otherwise retire threads.
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

func startProcess(path string, args, env []string, dir, logPath string, cred *syscall.Credential) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		return nil, fmt.Errorf("postgres log: %w", err)
	}
	if cred != nil {
		_ = logFile.Chown(int(cred.Uid), int(cred.Gid))
	}
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr(cred)
	errc := make(chan error, 1)
	spawner <- func() { errc <- cmd.Start() }
	if err := <-errc; err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting postgres: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// ownerFile, in a server's directory, holds the PID of the process that
// started the server.
const ownerFile = "owner.pid"

// sweep removes the server directories under base whose owner has died,
// after killing a postmaster still running there and removing its System V
// shared memory segment (a postmaster killed by SIGKILL leaves it behind).
// It is best effort: what it cannot remove stays.
func sweep(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			// Not yet written, or the directory is not one of ours: leave
			// it unless it is old.
			if st, err := os.Stat(dir); err != nil || time.Since(st.ModTime()) < 10*time.Minute {
				continue
			}
		} else if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || alive(pid) {
			continue
		}
		data := filepath.Join(dir, "data")
		if pm, err := os.ReadFile(filepath.Join(data, "postmaster.pid")); err == nil {
			lines := strings.Split(string(pm), "\n")
			if pid, err := strconv.Atoi(strings.TrimSpace(lines[0])); err == nil && pid > 0 && runsIn(pid, data) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				for deadline := time.Now().Add(10 * time.Second); alive(pid) && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
				}
			}
			if len(lines) > 6 {
				if f := strings.Fields(lines[6]); len(f) == 2 {
					if id, err := strconv.Atoi(f[1]); err == nil {
						removeShm(id)
					}
				}
			}
		}
		_ = os.RemoveAll(dir)
	}
}

// alive reports whether a process with pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
