//go:build !linux

package localcluster

import "syscall"

// componentAttr starts a component in its own process group. Outside Linux
// there is no parent-death signal: the local cluster runs on Linux only
// (its components and nodes are built for it); the CLI builds everywhere.
func componentAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
