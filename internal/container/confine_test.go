//go:build linux

package container

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kubetask/kubetask/internal/imagestore/imagetest"
)

// corePattern is the host's kernel.core_pattern (not namespaced): what the
// attack tests try to write, so that a write that wrongly succeeds changes
// nothing on the host.
func corePattern(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(string(b), "\n")
}

// capSysAdmin is CAP_SYS_ADMIN's bit.
const capSysAdmin = 1 << 21

// capEff reads the CapEff line of a /proc/<pid>/status.
func capEff(t *testing.T, status string) uint64 {
	t.Helper()
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no CapEff in %q", status)
	return 0
}

// confineImage is an image root with the probe, a set-user-ID root copy of it
// and a root-only directory.
func confineImage(t *testing.T, tmp string) string {
	t.Helper()
	image := filepath.Join(tmp, "image")
	for _, d := range []string{"opt/kt", "rootonly"} {
		if err := os.MkdirAll(filepath.Join(image, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(image, "rootonly"), 0o700); err != nil {
		t.Fatal(err)
	}
	probe, err := os.ReadFile(imagetest.Probe(t, tmp))
	if err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"probe": 0o755, "suprobe": 0o755 | os.ModeSetuid} {
		p := filepath.Join(image, "opt", "kt", name)
		if err := os.WriteFile(p, probe, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	return image
}

// TestImageContainerIsConfined runs what an attacker's image would try, as
// containerd's defaults contain it (Security's zero value): a root container
// has only the default capabilities, cannot write /proc/sys or /sys (nor any
// mount below /sys), reads nothing from masked /proc files; a command exec'd
// into it is confined the same way; a runAsUser 1234 container with
// allowPrivilegeEscalation: false runs a set-user-ID root file as 1234, and
// without it gains no capability beyond the default set; a read-only root file
// system and a read-only volume (with a mount below it) refuse writes.
func TestImageContainerIsConfined(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("namespace isolation needs root")
	}
	tmp := t.TempDir()
	image := confineImage(t, tmp)
	defaultCaps, err := capMask(DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(tmp, "vol")
	if err := os.MkdirAll(filepath.Join(vol, "sub"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", filepath.Join(vol, "sub"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(filepath.Join(vol, "sub"), syscall.MNT_DETACH) })

	// 1. Root, the image's default.
	p := start(t, Spec{
		Command: []string{"probe", "-wait", "/proc/self/status", "/proc/self/mountinfo", "/proc/kcore",
			"/proc/sys/kernel/core_pattern=" + corePattern(t), "/sys/kernel/uevent_helper=", "/rofs=x",
			"/vol/x=x", "/vol/sub/x=x"},
		Env:       []string{"PATH=/opt/kt"},
		Rootfs:    &Rootfs{Image: image, State: filepath.Join(tmp, "state1")},
		Mounts:    []Mount{{HostPath: vol, ContainerPath: "/vol", ReadOnly: true}},
		Security:  Security{ReadOnlyRootFilesystem: true},
		Isolation: IsolationNamespaces,
	})
	waitLog(t, p, "\n")
	r := imagetest.ParseReport(t, readAll(t, p, LogOptions{TailLines: -1}))
	if got := capEff(t, r.Files["/proc/self/status"]); got != defaultCaps {
		t.Errorf("root container: CapEff %#x, want containerd's default set %#x", got, defaultCaps)
	}
	for _, f := range []string{"/proc/sys/kernel/core_pattern", "/sys/kernel/uevent_helper", "/rofs", "/vol/x", "/vol/sub/x"} {
		if r.Files[f] == "ok" {
			t.Errorf("root container wrote %s", f)
		}
	}
	if got := r.Files["/proc/kcore"]; got != "" && !strings.HasPrefix(got, "error:") {
		t.Errorf("/proc/kcore is not masked: %.40q", got)
	}
	for _, l := range strings.Split(r.Files["/proc/self/mountinfo"], "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && (strings.HasPrefix(f[4], "/sys") || strings.HasPrefix(f[4], "/proc/sys")) && !strings.HasPrefix(f[5], "ro") {
			t.Errorf("%s is mounted %s", f[4], f[5])
		}
	}
	// A command exec'd into it is confined as it is.
	var out strings.Builder
	code, err := p.Exec(context.Background(), []string{"probe", "/proc/self/status", "/proc/sys/kernel/core_pattern=" + corePattern(t)}, nil, &out, &out)
	if err != nil || code != 0 {
		t.Fatalf("exec: %d %v: %s", code, err, out.String())
	}
	x := imagetest.ParseReport(t, out.String())
	if got := capEff(t, x.Files["/proc/self/status"]); got != defaultCaps || x.Files["/proc/sys/kernel/core_pattern"] == "ok" {
		t.Errorf("exec: CapEff %#x (want %#x), core_pattern write %q", got, defaultCaps, x.Files["/proc/sys/kernel/core_pattern"])
	}
	p.Kill()

	// 2. uid 1234 with allowPrivilegeEscalation: false runs the set-user-ID
	// root file as itself.
	p = start(t, Spec{
		Command:   []string{"suprobe", "/rootonly/x=written as uid 1234", "/proc/self/status"},
		Env:       []string{"PATH=/opt/kt"},
		Rootfs:    &Rootfs{Image: image, State: filepath.Join(tmp, "state2")},
		User:      &User{UID: 1234, GID: 1234},
		Security:  Security{NoNewPrivileges: true},
		Isolation: IsolationNamespaces,
	})
	waitDone(t, p)
	r = imagetest.ParseReport(t, readAll(t, p, LogOptions{TailLines: -1}))
	if r.Files["/rootonly/x"] == "ok" || capEff(t, r.Files["/proc/self/status"]) != 0 {
		t.Errorf("no_new_privs: uid 1234 became root through a set-user-ID file: %q", r.Files["/proc/self/status"])
	}

	// 3. Without no_new_privs the set-user-ID file runs as root, as on a
	// node, but with the default capabilities only.
	p = start(t, Spec{
		Command:   []string{"suprobe", "/proc/self/status"},
		Env:       []string{"PATH=/opt/kt"},
		Rootfs:    &Rootfs{Image: image, State: filepath.Join(tmp, "state3")},
		User:      &User{UID: 1234, GID: 1234},
		Isolation: IsolationNamespaces,
	})
	waitDone(t, p)
	r = imagetest.ParseReport(t, readAll(t, p, LogOptions{TailLines: -1}))
	if got := capEff(t, r.Files["/proc/self/status"]); got&^defaultCaps != 0 || got&capSysAdmin != 0 {
		t.Errorf("set-user-ID root from uid 1234: CapEff %#x beyond the default set %#x", got, defaultCaps)
	}
}

// TestMemoryLimitEndsOOMKilled: a container of an image with a memory limit
// that touches more is killed by the kernel, and its result says OOMKilled;
// its cgroup is removed afterwards.
func TestMemoryLimitEndsOOMKilled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("namespace isolation needs root")
	}
	tmp := t.TempDir()
	image := confineImage(t, tmp)
	p := start(t, Spec{
		Command:   []string{"probe"},
		Env:       []string{"PATH=/opt/kt", "PROBE_ALLOC_MIB=256"},
		Rootfs:    &Rootfs{Image: image, State: filepath.Join(tmp, "state")},
		Limits:    Limits{MemoryBytes: 32 << 20, MilliCPU: 500},
		Isolation: IsolationNamespaces,
	})
	dirs := p.cg.dirs
	res := waitDone(t, p)
	if !res.OOMKilled || res.ExitCode != 137 {
		t.Errorf("result %+v, want OOMKilled with exit code 137", res)
	}
	waitReleased(t, p)
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s left behind", d)
		}
	}
	// Under its limit the same probe exits 0, not OOMKilled.
	p = start(t, Spec{
		Command:   []string{"probe"},
		Env:       []string{"PATH=/opt/kt", "PROBE_ALLOC_MIB=4"},
		Rootfs:    &Rootfs{Image: image, State: filepath.Join(tmp, "state2")},
		Limits:    Limits{MemoryBytes: 64 << 20},
		Isolation: IsolationNamespaces,
	})
	if res := waitDone(t, p); res.OOMKilled || res.ExitCode != 0 {
		t.Errorf("under the limit: %+v", res)
	}
}
