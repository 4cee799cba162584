//go:build linux

package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubetask/kubetask/internal/imagestore/imagetest"
)

// TestOCIRuntimeAppliesTheDefaultSeccompProfile: under runc a container of
// an image gets containerd's default seccomp profile, which refuses keyctl
// with EPERM (nothing else would: any process may ask for its session
// keyring's ID), also to a command exec'd into it; seccompProfile
// Unconfined (SeccompUnconfined) lifts it.
func TestOCIRuntimeAppliesTheDefaultSeccompProfile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("namespace isolation needs root")
	}
	rt := runcRuntime(t)
	tmp := t.TempDir()
	image := confineImage(t, tmp)
	const keyctl = "syscall:keyctl"
	p := start(t, Spec{
		Command:   []string{"probe", "-wait", keyctl, "/proc/self/status"},
		Env:       []string{"PATH=/opt/kt"},
		Rootfs:    &Rootfs{Image: image, State: filepath.Join(tmp, "state1")},
		Runtime:   rt,
		Isolation: IsolationNamespaces,
	})
	waitLog(t, p, "\n")
	r := imagetest.ParseReport(t, readAll(t, p, LogOptions{TailLines: -1}))
	if got := r.Files[keyctl]; got != "error: operation not permitted" {
		t.Errorf("keyctl under the default profile: %q, want EPERM", got)
	}
	if !strings.Contains(r.Files["/proc/self/status"], "Seccomp:\t2") {
		t.Errorf("no seccomp filter: %q", r.Files["/proc/self/status"])
	}
	var out strings.Builder
	if code, err := p.Exec(context.Background(), []string{"probe", keyctl}, nil, &out, &out); err != nil || code != 0 {
		t.Fatalf("exec: %d %v: %s", code, err, out.String())
	}
	if got := imagetest.ParseReport(t, out.String()).Files[keyctl]; got != "error: operation not permitted" {
		t.Errorf("keyctl exec'd: %q, want EPERM", got)
	}
	if res := p.Stop(context.Background(), 5e9); res.ExitCode != 0 {
		t.Errorf("stopped with SIGTERM: %+v, want exit code 0", res)
	}

	p = start(t, Spec{
		Command:   []string{"probe", keyctl},
		Env:       []string{"PATH=/opt/kt"},
		Rootfs:    &Rootfs{Image: image, State: filepath.Join(tmp, "state2")},
		Runtime:   rt,
		Security:  Security{SeccompUnconfined: true},
		Isolation: IsolationNamespaces,
	})
	waitDone(t, p)
	if got := imagetest.ParseReport(t, readAll(t, p, LogOptions{TailLines: -1})).Files[keyctl]; got == "error: operation not permitted" {
		t.Errorf("keyctl refused without a seccomp profile")
	}
}

// TestOCIRuntimeStartErrorAndExecOfMissingCommand: a command runc cannot
// start is a *StartError with runc's reason; one exec'd exits 127.
func TestOCIRuntimeStartErrorAndExecOfMissingCommand(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("namespace isolation needs root")
	}
	rt := runcRuntime(t)
	tmp := t.TempDir()
	image := confineImage(t, tmp)
	_, err := Start(context.Background(), Spec{
		Command: []string{"no-such-command"}, Env: []string{"PATH=/opt/kt"}, LogPath: filepath.Join(tmp, "0.log"),
		Rootfs: &Rootfs{Image: image, State: filepath.Join(tmp, "state1")}, Runtime: rt, Isolation: IsolationNamespaces,
	})
	var se *StartError
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "no-such-command") {
		t.Fatalf("Start: %v, want a StartError naming the command", err)
	}
	p := start(t, Spec{
		Command: []string{"probe", "-wait"}, Env: []string{"PATH=/opt/kt"},
		Rootfs: &Rootfs{Image: image, State: filepath.Join(tmp, "state2")}, Runtime: rt, Isolation: IsolationNamespaces,
	})
	var out strings.Builder
	if code, err := p.Exec(context.Background(), []string{"no-such-command"}, nil, &out, &out); code != 127 || err != nil {
		t.Errorf("exec of a missing command: %d %v, want 127", code, err)
	}
}

// TestOverlayLayerIsVolatile: an instance's writable layer is mounted
// volatile (thrown away with the instance, it needs no sync, and unmounting
// it costs no journal commit), and still takes writes without touching the
// image below.
func TestOverlayLayerIsVolatile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	tmp := t.TempDir()
	lower, upper, work, target := filepath.Join(tmp, "lower"), filepath.Join(tmp, "upper"), filepath.Join(tmp, "work"), filepath.Join(tmp, "merged")
	for _, d := range []string{lower, upper, work, target} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := mountOverlay(target, lower, upper, work); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for l := range strings.Lines(string(b)) {
		if f := strings.Fields(l); len(f) > 4 && f[4] == target {
			line = l
		}
	}
	if !strings.Contains(line, "volatile") {
		t.Errorf("overlay at %s: mountinfo %q, want the volatile option", target, line)
	}
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(lower, "f")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a write reached the image: %v", err)
	}
}

// TestWaitPIDFile: the PID is read once runc renames its file into the
// directory, whether before or after the wait begins; a runc that exits
// without one gives 0; an ended context an error.
func TestWaitPIDFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, pid string) {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, []byte(pid), 0o600); err != nil {
			t.Error(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
	}
	never := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	write("before", "41")
	if pid, err := waitPIDFile(ctx, filepath.Join(dir, "before"), never); pid != 41 || err != nil {
		t.Errorf("file there before the wait: %d %v, want 41", pid, err)
	}

	go write("after", "42\n")
	if pid, err := waitPIDFile(ctx, filepath.Join(dir, "after"), never); pid != 42 || err != nil {
		t.Errorf("file renamed in during the wait: %d %v, want 42", pid, err)
	}

	exited := make(chan struct{})
	close(exited)
	if pid, err := waitPIDFile(ctx, filepath.Join(dir, "none"), exited); pid != 0 || err != nil {
		t.Errorf("runc exited without a file: %d %v, want 0", pid, err)
	}

	ended, end := context.WithCancel(context.Background())
	end()
	if _, err := waitPIDFile(ended, filepath.Join(dir, "none"), never); !errors.Is(err, context.Canceled) {
		t.Errorf("context ended: %v, want context.Canceled", err)
	}
}

// TestOCIResultBeforeDelete: a container under runc whose processes have
// all ended has its result before `runc delete` (as containerd reports an
// exit before the kubelet removes the container), its root unmounted by
// then so that its directory can go; then runc's state and the cgroup go
// too. A container still running when runc ends (runc killed) is deleted,
// and so killed, before its result.
func TestOCIResultBeforeDelete(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("namespace isolation needs root")
	}
	rt := runcRuntime(t)
	tmp := t.TempDir()
	image := confineImage(t, tmp)
	state := filepath.Join(tmp, "state1")
	p := start(t, Spec{
		Command: []string{"probe"}, Env: []string{"PATH=/opt/kt"},
		Rootfs: &Rootfs{Image: image, State: state}, Runtime: rt, Isolation: IsolationNamespaces,
	})
	id, dirs := p.oci.id, p.cg.dirs
	if res := waitDone(t, p); res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
	if mounted(t, filepath.Join(state, "merged")) {
		t.Errorf("root still mounted at the result")
	}
	waitReleased(t, p)
	if _, err := os.Stat(filepath.Join(rt.Root, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("runc's state of %s left after the release: %v", id, err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left after the release: %v", d, err)
		}
	}

	p = start(t, Spec{
		Command: []string{"probe", "-wait"}, Env: []string{"PATH=/opt/kt"},
		Rootfs: &Rootfs{Image: image, State: filepath.Join(tmp, "state2")}, Runtime: rt, Isolation: IsolationNamespaces,
	})
	pid := p.PID()
	if err := p.oci.cmd.Process.Kill(); err != nil { // runc, not the container
		t.Fatal(err)
	}
	waitDone(t, p)
	// Dead: gone, or a zombie until whoever it was handed to reaps it.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 0 && f[0] != "Z" {
			t.Errorf("container process %d still running (state %s) at the result of a killed runc", pid, f[0])
		}
	}
}

// mounted reports whether path is a mount point of this process.
func mounted(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if f := strings.Fields(l); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}
