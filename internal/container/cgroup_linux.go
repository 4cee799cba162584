package container

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// cgroup is the cgroup of one container instance with limits: a directory per
// hierarchy (cgroup v1: memory and cpu; v2: one), made before the container
// starts. The container's init joins it before it prepares anything, so every
// byte the container uses counts.
type cgroup struct {
	v2   bool
	dirs []string // directories the init joins
	mem  string   // the directory with the memory controller's files
}

const cgroupRoot = "/sys/fs/cgroup"

// newCgroup makes the container's cgroup with lim, under the node's own cgroup
// (v1: in the memory and cpu hierarchies, in a "kubetask" directory), or under
// /sys/fs/cgroup/kubetask on cgroup v2 (the node's own cgroup holds processes,
// so it cannot delegate controllers).
func newCgroup(lim Limits) (*cgroup, error) {
	name := make([]byte, 8)
	_, _ = rand.Read(name)
	leaf := "ctr-" + hex.EncodeToString(name)
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		return newCgroupV2(leaf, lim)
	}
	return newCgroupV1(leaf, lim)
}

func newCgroupV2(leaf string, lim Limits) (*cgroup, error) {
	parent := filepath.Join(cgroupRoot, "kubetask")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", parent, err)
	}
	for _, dir := range []string{cgroupRoot, parent} {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +cpu"), 0o644); err != nil {
			return nil, fmt.Errorf("enable the memory and cpu controllers in %s: %w", dir, err)
		}
	}
	dir := filepath.Join(parent, leaf)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	cg := &cgroup{v2: true, dirs: []string{dir}, mem: dir}
	files := map[string]string{}
	if lim.MemoryBytes > 0 {
		files["memory.max"] = strconv.FormatInt(lim.MemoryBytes, 10)
		files["memory.swap.max"] = "0"
	}
	if lim.MilliCPU > 0 {
		files["cpu.max"] = fmt.Sprintf("%d 100000", max(lim.MilliCPU*100, 1000))
	}
	for f, v := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil && (f != "memory.swap.max" || !errors.Is(err, os.ErrNotExist)) {
			cg.remove()
			return nil, fmt.Errorf("set %s: %w", f, err)
		}
	}
	return cg, nil
}

func newCgroupV1(leaf string, lim Limits) (*cgroup, error) {
	own, err := ownCgroupsV1()
	if err != nil {
		return nil, err
	}
	cg := &cgroup{}
	type setting struct{ file, value string }
	var want []struct {
		ctrl string
		set  []setting
	}
	if lim.MemoryBytes > 0 {
		v := strconv.FormatInt(lim.MemoryBytes, 10)
		want = append(want, struct {
			ctrl string
			set  []setting
		}{"memory", []setting{{"memory.limit_in_bytes", v}, {"memory.memsw.limit_in_bytes", v}}})
	}
	if lim.MilliCPU > 0 {
		want = append(want, struct {
			ctrl string
			set  []setting
		}{"cpu", []setting{{"cpu.cfs_period_us", "100000"}, {"cpu.cfs_quota_us", strconv.FormatInt(max(lim.MilliCPU*100, 1000), 10)}}})
	}
	for _, w := range want {
		path, ok := own[w.ctrl]
		if !ok {
			cg.remove()
			return nil, fmt.Errorf("no %s cgroup hierarchy (cgroup v1) on this machine", w.ctrl)
		}
		dir := filepath.Join(cgroupRoot, w.ctrl, path, "kubetask", leaf)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			cg.remove()
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		cg.dirs = append(cg.dirs, dir)
		if w.ctrl == "memory" {
			cg.mem = dir
		}
		for _, s := range w.set {
			err := os.WriteFile(filepath.Join(dir, s.file), []byte(s.value), 0o644)
			if err != nil && (s.file != "memory.memsw.limit_in_bytes" || !errors.Is(err, os.ErrNotExist)) {
				cg.remove()
				return nil, fmt.Errorf("set %s: %w", s.file, err)
			}
		}
	}
	return cg, nil
}

// ownCgroupsV1 maps each v1 controller mounted at /sys/fs/cgroup/<controller>
// to the node's own cgroup in it.
func ownCgroupsV1() (map[string]string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read the node's cgroups: %w", err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			if ctrl == "memory" || ctrl == "cpu" {
				if _, err := os.Stat(filepath.Join(cgroupRoot, ctrl, "tasks")); err == nil {
					out[ctrl] = parts[2]
				}
			}
		}
	}
	return out, sc.Err()
}

// oomKilled reports whether the OOM killer killed a process of the cgroup.
func (c *cgroup) oomKilled() bool {
	if c == nil || c.mem == "" {
		return false
	}
	file := "memory.oom_control"
	if c.v2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(c.mem, file))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if n, ok := strings.CutPrefix(l, "oom_kill "); ok {
			v, _ := strconv.Atoi(strings.TrimSpace(n))
			return v > 0
		}
	}
	return false
}

// empty reports whether the cgroup is known to hold no process: false when
// it cannot be read.
func (c *cgroup) empty() bool {
	if c == nil || len(c.dirs) == 0 {
		return false
	}
	b, err := os.ReadFile(filepath.Join(c.dirs[0], "cgroup.procs"))
	return err == nil && len(strings.TrimSpace(string(b))) == 0
}

// remove removes the cgroup once its processes are gone (they die with the
// container's PID 1; the kernel may take a moment to let go of them).
func (c *cgroup) remove() {
	if c == nil {
		return
	}
	for _, d := range c.dirs {
		for i := 0; i < 50; i++ {
			if err := os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// joinCgroups moves the calling process into dirs (the init, before it
// prepares the container, and an exec'd command).
func joinCgroups(dirs []string) error {
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte("0"), 0o644); err != nil {
			return fmt.Errorf("join cgroup %s: %w", d, err)
		}
	}
	return nil
}
