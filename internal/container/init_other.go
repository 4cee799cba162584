//go:build !linux

package container

import (
	"context"
	"errors"
	"io"
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
func (c *cgroup) empty() bool           { return false }

// ociContainer is Linux's; elsewhere no container runs under an OCI runtime.
type ociContainer struct{}

func (p *Process) startOCI(context.Context) error {
	return errors.New("an OCI runtime needs Linux")
}
func (p *Process) waitOCI()                       {}
func (p *Process) signalOCI(syscall.Signal) error { return nil }
func (p *Process) execOCI(context.Context, []string, io.Reader, io.Writer, io.Writer) (int, error) {
	return 0, errors.New("an OCI runtime needs Linux")
}

// CapabilityNames are the capabilities a container may hold: none where
// containers do not run (they need Linux).
func CapabilityNames() []string { return nil }

// WaitDeleted returns at once: off Linux no container runs under an OCI runtime.
func WaitDeleted(context.Context) error { return nil }
