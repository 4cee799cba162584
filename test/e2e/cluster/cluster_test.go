package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubetask/kubetask/internal/localcluster"
)

// result is one run of the kubetask binary.
type result struct {
	code           int
	stdout, stderr string
}

// kubetask runs the binary with extra environment and a deadline.
func kubetask(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubetaskBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("running kubetask %v: %v", args, err)
	}
	return r
}

// stateEnv gives a test its own state directory and makes sure no cluster
// survives the test.
func stateEnv(t *testing.T) (string, []string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	env := []string{localcluster.EnvStateDir + "=" + dir}
	t.Cleanup(func() {
		if st, err := localcluster.StateDir(dir).Read(); err == nil && st != nil {
			_ = localcluster.StateDir(dir).Down(context.Background(), false)
		}
	})
	return dir, env
}

func readState(t *testing.T, dir string) *localcluster.State {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st localcluster.State
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func listening(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// waitGone waits until no pid is alive and no port accepts connections.
func waitGone(t *testing.T, pids []int, ports map[string]int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []string
		for _, p := range pids {
			if alive(p) {
				left = append(left, fmt.Sprintf("pid %d", p))
			}
		}
		for name, p := range ports {
			if p != 0 && listening(p) {
				left = append(left, fmt.Sprintf("%s port %d", name, p))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still alive after 30s: %s", strings.Join(left, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestClusterUpStatusDown(t *testing.T) {
	dir, env := stateEnv(t)
	r := kubetask(t, env, "cluster", "up", "--nodes", "0")
	if r.code != 0 {
		t.Fatalf("cluster up: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	for _, want := range []string{"the local cluster is up", "kubeconfig: " + kubeconfig, "export KUBECONFIG=" + kubeconfig} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("cluster up output lacks %q:\n%s", want, r.stdout)
		}
	}
	// The kubeconfig works.
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(rc)
	if _, err := client.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("using the printed kubeconfig: %v", err)
	}

	if r := kubetask(t, env, "cluster", "status"); r.code != 0 || !strings.Contains(r.stdout, "status: ready") || !strings.Contains(r.stdout, "kube-apiserver") {
		t.Errorf("cluster status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := kubetask(t, env, "cluster", "kubeconfig"); r.code != 0 || strings.TrimSpace(r.stdout) != kubeconfig {
		t.Errorf("cluster kubeconfig: exit %d %q", r.code, r.stdout)
	}
	// Idempotent, and says that the flags that shape the cluster changed
	// nothing of the one that is up.
	if r := kubetask(t, env, "cluster", "up", "--nodes", "0", "--runtime", "init"); r.code != 0 || !strings.Contains(r.stdout, "already up") ||
		!strings.Contains(r.stderr, "--nodes, --runtime shape the cluster when it starts and changed nothing") {
		t.Errorf("second cluster up: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	st := readState(t, dir)
	pids := []int{st.SupervisorPID}
	for _, p := range st.Processes {
		pids = append(pids, p.PID)
	}
	if len(st.Processes) < 4 {
		t.Fatalf("state lists %d processes, want etcd, apiserver, scheduler, controller-manager", len(st.Processes))
	}
	if r := kubetask(t, env, "cluster", "down"); r.code != 0 {
		t.Fatalf("cluster down: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	waitGone(t, pids, st.Ports)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("state directory still there after down: %v", err)
	}
	if r := kubetask(t, env, "cluster", "status"); r.code == 0 || !strings.Contains(r.stdout, "down") {
		t.Errorf("status after down: exit %d %q", r.code, r.stdout)
	}
}

func TestClusterDownKeep(t *testing.T) {
	dir, env := stateEnv(t)
	if r := kubetask(t, env, "cluster", "up", "--nodes", "0"); r.code != 0 {
		t.Fatalf("cluster up: exit %d\n%s", r.code, r.stderr)
	}
	if r := kubetask(t, env, "cluster", "down", "--keep"); r.code != 0 {
		t.Fatalf("cluster down --keep: exit %d\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "logs", "kube-apiserver.log")); err != nil {
		t.Errorf("--keep removed the logs: %v", err)
	}
	// The kept state starts again.
	if r := kubetask(t, env, "cluster", "up", "--nodes", "0"); r.code != 0 || !strings.Contains(r.stdout, "is up") {
		t.Fatalf("cluster up on kept state: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := kubetask(t, env, "cluster", "down"); r.code != 0 {
		t.Fatalf("cluster down: exit %d\n%s", r.code, r.stderr)
	}
}

// TestKilledSupervisorLeavesNoOrphans: the components die with their
// supervisor even when it is SIGKILLed (parent-death signal).
func TestKilledSupervisorLeavesNoOrphans(t *testing.T) {
	dir, env := stateEnv(t)
	if r := kubetask(t, env, "cluster", "up", "--nodes", "0"); r.code != 0 {
		t.Fatalf("cluster up: exit %d\n%s", r.code, r.stderr)
	}
	st := readState(t, dir)
	var pids []int
	for _, p := range st.Processes {
		pids = append(pids, p.PID)
	}
	if err := syscall.Kill(st.SupervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, append(pids, st.SupervisorPID), st.Ports)
	if r := kubetask(t, env, "cluster", "status"); r.code == 0 {
		t.Errorf("status after the supervisor died: exit 0\n%s", r.stdout)
	}
	if r := kubetask(t, env, "cluster", "down"); r.code != 0 {
		t.Errorf("down after the supervisor died: exit %d\n%s", r.code, r.stderr)
	}
}

func TestClusterBadInput(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port

	cases := map[string]struct {
		prepare func(t *testing.T, dir string) []string // extra env
		args    []string
		want    []string
		// survives is a file that must still exist afterwards.
		survives string
	}{
		"apiserver port taken": {
			args: []string{"--apiserver-port", fmt.Sprint(takenPort)},
			want: []string{fmt.Sprintf("port %d is already in use", takenPort)},
		},
		"negative node count": {
			args: []string{"--nodes", "-1"},
			want: []string{"--nodes must be 0 or more"},
		},
		"foreign state directory": {
			prepare: func(t *testing.T, dir string) []string {
				writeFile(t, filepath.Join(dir, "precious.txt"), "not yours")
				return nil
			},
			want:     []string{"not a kubetask cluster directory", localcluster.EnvStateDir},
			survives: "precious.txt",
		},
		"corrupt state": {
			prepare: func(t *testing.T, dir string) []string {
				writeFile(t, filepath.Join(dir, "state.json"), "{half a json")
				return nil
			},
			want:     []string{"corrupt", "remove"},
			survives: "state.json",
		},
		"second up while one is starting": {
			prepare: func(t *testing.T, dir string) []string {
				// Hold the lock that a starting `cluster up` holds.
				writeFile(t, filepath.Join(dir, "state.json"), `{"kind":"kubetask-local-cluster","status":"starting"}`)
				f, err := os.OpenFile(filepath.Join(dir, "up.lock"), os.O_CREATE|os.O_RDWR, 0o600)
				if err != nil {
					t.Fatal(err)
				}
				if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				return nil
			},
			want: []string{"already starting"},
		},
		"missing Go toolchain": {
			prepare: func(t *testing.T, dir string) []string {
				return []string{"KUBETASK_CACHE_DIR=" + t.TempDir(), "KUBETASK_GO=/nonexistent/go"}
			},
			want: []string{"/nonexistent/go", "install Go"},
		},
		"unreachable module proxy": {
			prepare: func(t *testing.T, dir string) []string {
				modcache := t.TempDir()
				t.Cleanup(func() { _ = exec.Command("chmod", "-R", "u+w", modcache).Run() })
				return []string{"KUBETASK_CACHE_DIR=" + t.TempDir(), "GOPROXY=http://127.0.0.1:1", "GOMODCACHE=" + modcache, "GOFLAGS=-mod=mod", "GOSUMDB=off"}
			},
			want: []string{"module proxy", "GOPROXY"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir, env := stateEnv(t)
			if tc.prepare != nil {
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				env = append(env, tc.prepare(t, dir)...)
			}
			r := kubetask(t, env, append([]string{"cluster", "up", "--nodes", "0"}, tc.args...)...)
			if r.code == 0 {
				t.Fatalf("cluster up succeeded; want a clear error\n%s", r.stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("error output lacks %q:\n%s", w, r.stderr)
				}
			}
			if localcluster.StateDir(dir).SupervisorRunning() {
				t.Errorf("a supervisor is left running in %s", dir)
			}
			if tc.survives != "" {
				if _, err := os.Stat(filepath.Join(dir, tc.survives)); err != nil {
					t.Errorf("%s was touched: %v", tc.survives, err)
				}
			}
		})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestClusterUpWithNodes: by default `cluster up` starts one local process
// node; --sim-nodes adds kwok nodes. down stops all of them.
func TestClusterUpWithNodes(t *testing.T) {
	dir, env := stateEnv(t)
	if r := kubetask(t, env, "cluster", "up", "--sim-nodes", "2"); r.code != 0 {
		t.Fatalf("cluster up --sim-nodes 2: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r := kubetask(t, env, "cluster", "status")
	if r.code != 0 {
		t.Fatalf("status: exit %d\n%s", r.code, r.stdout)
	}
	for _, node := range []string{"local-0", "sim-0", "sim-1"} {
		found := false
		for _, line := range strings.Split(r.stdout, "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == node && f[1] == "Ready" {
				found = true
			}
		}
		if !found {
			t.Errorf("status does not show node %s Ready:\n%s", node, r.stdout)
		}
	}
	st := readState(t, dir)
	var pids []int
	names := map[string]bool{}
	for _, p := range st.Processes {
		pids = append(pids, p.PID)
		names[p.Name] = true
	}
	if !names["node-local-0"] || !names["kwok"] {
		t.Errorf("state lists %v; want the local node and kwok among the processes", names)
	}
	t.Run("plain pod runs as it is", func(t *testing.T) {
		plainPodRuns(t, env, filepath.Join(dir, "kubeconfig"))
	})
	if r := kubetask(t, env, "cluster", "down"); r.code != 0 {
		t.Fatalf("cluster down: exit %d\n%s", r.code, r.stderr)
	}
	waitGone(t, append(pids, st.SupervisorPID), st.Ports)
}

// plainPodRuns: `kubectl apply -f examples/plain-pod.yaml`, with nothing added,
// runs on the local node of the default cluster. The pod has no toleration and
// no selector: the local node has no taint, and the simulated nodes, which
// carry kwok's taint, do not take it.
func plainPodRuns(t *testing.T, env []string, kubeconfig string) {
	r := kubetask(t, env, "cluster", "build")
	if r.code != 0 {
		t.Fatalf("cluster build: exit %d\n%s", r.code, r.stderr)
	}
	var kubectl string
	for _, line := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "kubectl" {
			kubectl = f[2]
		}
	}
	if kubectl == "" {
		t.Fatalf("cluster build printed no kubectl:\n%s", r.stdout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "apply", "-f", filepath.Join("..", "..", "..", "examples", "plain-pod.yaml")).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	pods := kubernetes.NewForConfigOrDie(rc).CoreV1().Pods("default")
	var last *corev1.Pod
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "migrate-db", metav1.GetOptions{})
		if err != nil {
			return false, nil // not there yet, or a passing error: poll again until the deadline
		}
		last = p
		return p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded, nil
	})
	if err != nil {
		status, _ := json.MarshalIndent(last, "", "  ")
		t.Fatalf("pod migrate-db not Running or Succeeded within 2m: %v\n%s", err, status)
	}
	if last.Spec.NodeName != "local-0" {
		t.Errorf("pod runs on %q, want the local node local-0", last.Spec.NodeName)
	}
}
