// Command rusage runs a command and writes what the kernel accounted for
// it (wait4) to the file named by its first argument, as one line:
// "wall_ns maxrss_kib utime_ns stime_ns". It exits with the command's exit
// code (1 when it could not run it).
//
// test/bench/run starts each measured command through it because a process
// that a large process starts inherits that one's peak RSS: Go starts
// children with vfork (the child shares the parent's memory until exec)
// and Linux keeps, in the process's maxrss, the larger peak across exec.
// This tiny parent's peak (a few MiB) is below any measured command's own.
//
//	rusage OUT COMMAND [ARG...]
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: rusage OUT COMMAND [ARG...]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[2], os.Args[3:]...) //nolint:gosec // running the given command is the point
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		fmt.Fprintln(os.Stderr, "rusage:", err)
		os.Exit(1)
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		fmt.Fprintln(os.Stderr, "rusage: no rusage")
		os.Exit(1)
	}
	line := fmt.Sprintf("%d %d %d %d\n", wall.Nanoseconds(), ru.Maxrss, ru.Utime.Nano(), ru.Stime.Nano())
	if err := os.WriteFile(os.Args[1], []byte(line), 0o600); err != nil { //nolint:gosec // the caller names the file to write
		fmt.Fprintln(os.Stderr, "rusage:", err)
		os.Exit(1)
	}
	os.Exit(cmd.ProcessState.ExitCode())
}
