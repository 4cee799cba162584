// Command probe reports, as one JSON line on stdout, what a container sees: its
// PID, user, groups, working directory, environment, arguments and the content
// of the files named by its arguments; an argument PATH=TEXT writes TEXT to PATH
// instead (the outcome, "ok" or the error, is reported as the file's); the
// argument syscall:keyctl makes a keyctl call that any process may make
// unless a seccomp filter refuses it (containerd's default profile does),
// reported the same way. With -wait as its first argument it then
// waits for SIGTERM; it exits with the code in PROBE_EXIT. PROBE_ALLOC_MIB=n makes it touch n MiB
// of memory after its report (a memory hog). Tests of the local node's image
// mode put it, built static, into an image (imagetest.Probe).
package main

import (
	"encoding/json"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

// hog holds what PROBE_ALLOC_MIB allocates, so that it stays allocated.
var hog [][]byte

// Report is what probe prints.
type Report struct {
	PID    int               `json:"pid"`
	UID    int               `json:"uid"`
	GID    int               `json:"gid"`
	Groups []int             `json:"groups"`
	Cwd    string            `json:"cwd"`
	Env    []string          `json:"env"`
	Args   []string          `json:"args"`
	Files  map[string]string `json:"files"`
}

func main() {
	r := Report{PID: os.Getpid(), UID: os.Getuid(), GID: os.Getgid(), Env: os.Environ(), Args: os.Args, Files: map[string]string{}}
	r.Groups, _ = os.Getgroups()
	r.Cwd, _ = os.Getwd()
	args := os.Args[1:]
	wait := len(args) > 0 && args[0] == "-wait"
	if wait {
		args = args[1:]
	}
	for _, a := range args {
		if a == "syscall:keyctl" {
			r.Files[a] = "ok"
			// KEYCTL_GET_KEYRING_ID (0) of the session keyring (-3), not created.
			if _, _, errno := syscall.Syscall(syscall.SYS_KEYCTL, 0, ^uintptr(2), 0); errno != 0 {
				r.Files[a] = "error: " + errno.Error()
			}
			continue
		}
		if path, text, ok := strings.Cut(a, "="); ok {
			r.Files[path] = "ok"
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil { //nolint:gosec // writing what the test names is the probe's job
				r.Files[path] = "error: " + err.Error()
			}
			continue
		}
		b, err := os.ReadFile(a) //nolint:gosec // reading what the test names is the probe's job
		if err != nil {
			r.Files[a] = "error: " + err.Error()
			continue
		}
		r.Files[a] = string(b)
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	// PROBE_ALLOC_MIB=n touches n MiB of memory, then goes on (a memory hog).
	if n, _ := strconv.Atoi(os.Getenv("PROBE_ALLOC_MIB")); n > 0 {
		hog = make([][]byte, n)
		for i := range hog {
			hog[i] = make([]byte, 1<<20)
			for j := 0; j < len(hog[i]); j += 4096 {
				hog[i][j] = 1
			}
		}
	}
	if wait {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		<-c
	}
	code, _ := strconv.Atoi(os.Getenv("PROBE_EXIT"))
	os.Exit(code)
}
