package run

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// localPlacement is what every test pod gets. The test cluster's only
// untainted node is the local process node, so pods land there unaided.
const localPlacement = `
      terminationGracePeriodSeconds: 5`

// taskFile writes a task named name whose spec is specExtra (indented two spaces)
// plus a template spec of podSpec (indented six spaces) with local placement.
func taskFile(t *testing.T, name, specExtra, podSpec string) string {
	t.Helper()
	doc := fmt.Sprintf("apiVersion: kubetask.dev/v1alpha1\nkind: Task\nmetadata: {name: %s}\nspec:\n%s\n  template:\n    spec:%s\n%s\n",
		name, specExtra, localPlacement, podSpec)
	p := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// marker returns a unique word to put in a command line, to find its processes.
func marker() string { return "kubetask-e2e-" + rand.String(10) }

// sidecarCmd is an envoy-like sidecar: it never exits by itself and stops on SIGTERM.
func sidecarCmd(mark string) string {
	return fmt.Sprintf(`[sh, -c, 'trap "exit 0" TERM; while :; do sleep 1; done', %s]`, mark)
}

// syncBuffer is a bytes.Buffer safe for a writer and a concurrent reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a running `kubetask` process.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	code           int
}

func start(t *testing.T, env *clustertest.Env, args ...string) *proc {
	t.Helper()
	args = append(args, "--kubeconfig", env.Kubeconfig, "-n", env.Namespace)
	p := &proc{cmd: exec.Command(kubetaskBin(t), args...), stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
			if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
				p.code = 128 + int(st.Signal())
			}
		default:
			p.code = -1
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		// SIGQUIT: the Go runtime prints every goroutine's stack to stderr
		// and exits, so that a hang shows where it hangs.
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		t.Fatalf("kubetask did not exit within %s\nstdout:\n%s\nstderr (with its goroutines):\n%s", d, p.stdout, p.stderr)
		return -1
	}
}

// run runs kubetask to completion.
func run(t *testing.T, env *clustertest.Env, args ...string) *proc {
	t.Helper()
	p := start(t, env, args...)
	p.wait(t, 3*time.Minute)
	t.Logf("kubetask %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, p.code, p.stdout, p.stderr)
	return p
}

// eventually polls cond every 100 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func pods(t *testing.T, env *clustertest.Env) []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// leases returns the names of the Leases in the test's namespace.
func leases(t *testing.T, env *clustertest.Env) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := env.Client.CoordinationV1().Leases(env.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range l.Items {
		names = append(names, x.Name)
	}
	return names
}

// processes returns the pids of host processes whose command line contains mark.
func processes(mark string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), mark) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// lines splits output into lines without the trailing empty one.
func lines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// outcomeLine returns the JSON outcome line of a run with -o json.
func outcomeLine(t *testing.T, stdout string) string {
	t.Helper()
	for _, l := range lines(stdout) {
		if strings.Contains(l, `"type":"outcome"`) {
			return l
		}
	}
	t.Fatalf("no outcome line in:\n%s", stdout)
	return ""
}
