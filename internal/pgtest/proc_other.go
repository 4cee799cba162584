//go:build !linux

package pgtest

import "syscall"

// sysProcAttr runs initdb and postgres as cred (nil: as this process). Only
// Linux has a parent-death signal: elsewhere a server outlives a test binary
// that dies without calling Stop, until the next Start sweeps it.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}

// runsIn reports whether process pid is a postgres of the data directory
// data; without /proc it cannot tell, so it says no and sweep kills nothing.
func runsIn(int, string) bool { return false }
