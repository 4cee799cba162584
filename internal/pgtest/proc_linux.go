package pgtest

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// sysProcAttr runs initdb and postgres as cred (nil: as this process) and
// has the kernel kill them when this process dies.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
}

// runsIn reports whether process pid is a postgres of the data directory
// data (not another process that reuses a dead postmaster's PID).
func runsIn(pid int, data string) bool {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && bytes.Contains(cmdline, []byte(data))
}
