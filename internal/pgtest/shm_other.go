//go:build !linux || !(amd64 || arm64)

package pgtest

// removeShm would remove a System V shared memory segment; on this platform
// a crashed test server's segment stays (it is a few bytes).
func removeShm(int) {}
