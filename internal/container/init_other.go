//go:build !linux

package container

import (
	"errors"
	"os"
	"syscall"
)

func lockThread() {}

func resolveIsolation(iso Isolation) (bool, error) {
	if iso == IsolationNamespaces {
		return false, errors.New("namespace isolation needs Linux")
	}
	return false, nil
}

func sysProcAttr(bool, bool) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func runInit(initConfig) error { return errors.New("container init is only supported on Linux") }

func enterNetNS(*os.File) (func() error, error) {
	return nil, errors.New("network namespaces need Linux")
}

// cgroup is Linux's; elsewhere no container has one.
type cgroup struct{ dirs []string }

func newCgroup(Limits) (*cgroup, error) { return nil, errors.New("cgroups need Linux") }
func (c *cgroup) oomKilled() bool       { return false }
func (c *cgroup) remove()               {}
