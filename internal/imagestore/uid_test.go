package imagestore_test

import (
	"os"
	"syscall"
)

func uidOf(st os.FileInfo) int {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid)
	}
	return -1
}
