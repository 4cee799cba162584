package localcluster

import "syscall"

// componentAttr starts a component in its own process group, killed when
// the process that started it dies, so no component outlives kubetask.
func componentAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
