//go:build linux && (amd64 || arm64)

package pgtest

import "syscall"

// ipcRmid is IPC_RMID of shmctl(2).
const ipcRmid = 0

// removeShm removes the System V shared memory segment id (best effort).
func removeShm(id int) {
	_, _, _ = syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), ipcRmid, 0)
}
