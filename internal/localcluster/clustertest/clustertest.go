// Package clustertest gives each test binary one shared local cluster and each
// test its own namespace on it.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { clustertest.Main(m) }
//
// The cluster (real etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager, local process nodes and kwok nodes) starts once
// before the tests and stops when they end, also when the binary is
// interrupted; its components die with the test binary in any case. Set
// KUBETASK_TEST_KEEP=1 to keep the cluster directory for inspection.
package clustertest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubetask/kubetask/internal/components"
	"github.com/kubetask/kubetask/internal/localcluster"
)

// Options shape the shared cluster of a test binary.
type Options struct {
	// LocalNodes is the number of local process nodes (default 1; -1 for none).
	LocalNodes int
	// SimNodes is the number of kwok nodes (default 0).
	SimNodes int
	// OnDemandExpiry: see localcluster.Config.OnDemandExpiry.
	OnDemandExpiry bool
	// Audit turns kube-apiserver's audit log on (localcluster.PodAuditPolicy),
	// written to logs/audit.log in the cluster directory:
	// Cluster().AuditLogPath().
	Audit bool
	// Profiling: see localcluster.Config.Profiling.
	Profiling bool
}

// shared is this test binary's cluster.
var shared *localcluster.Cluster

// Main starts the shared cluster with default options, runs the tests and exits.
func Main(m *testing.M) { MainWith(m, Options{}) }

// MainWith is Main with options.
func MainWith(m *testing.M, opts Options) { os.Exit(run(m, opts)) }

// Run is MainWith without the exit: it returns the exit code, for a TestMain
// that stops more after the tests (a database server, say).
func Run(m *testing.M, opts Options) int { return run(m, opts) }

func run(m *testing.M, opts Options) int {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dir, err := os.MkdirTemp("", "kubetask-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustertest:", err)
		return 1
	}
	keep := os.Getenv("KUBETASK_TEST_KEEP") != ""
	defer func() {
		if keep {
			fmt.Fprintln(os.Stderr, "clustertest: kept cluster directory", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()
	cfg, err := config(ctx, dir, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustertest:", err)
		return 1
	}
	if !keep && cfg.EtcdDataDir != "" {
		defer func() { _ = os.RemoveAll(cfg.EtcdDataDir) }()
	}
	cfg.Logger = log
	start := time.Now()
	c, err := localcluster.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustertest: starting cluster:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "clustertest: cluster ready in %s (%s)\n", time.Since(start).Round(100*time.Millisecond), c.Kubeconfig())
	shared = c
	// Code that loads the default kubeconfig (examples, kubectl) reaches the test cluster.
	_ = os.Setenv("KUBECONFIG", c.Kubeconfig())
	// An interrupt or SIGTERM while the tests run stops the cluster and
	// exits, instead of being swallowed by ctx (which only start-up reads).
	testsDone := make(chan struct{})
	interrupted := make(chan os.Signal, 1)
	signal.Notify(interrupted, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(interrupted)
	go func() {
		select {
		case <-interrupted:
			fmt.Fprintln(os.Stderr, "clustertest: interrupted: stopping the cluster")
			stopCtx, stopCancel := context.WithTimeout(context.Background(), time.Minute)
			defer stopCancel()
			_ = c.Stop(stopCtx)
			if !keep {
				_ = os.RemoveAll(dir)
				if cfg.EtcdDataDir != "" {
					_ = os.RemoveAll(cfg.EtcdDataDir)
				}
			}
			os.Exit(1)
		case <-testsDone:
		}
	}()
	code := m.Run()
	close(testsDone)
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer stopCancel()
	if err := c.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, "clustertest: stopping cluster:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func config(ctx context.Context, dir string, opts Options) (localcluster.Config, error) {
	b, err := components.NewBuilder(os.Stderr)
	if err != nil {
		return localcluster.Config{}, err
	}
	want := []components.Component{components.Etcd, components.KubeAPIServer, components.KubeScheduler, components.KubeControllerManager}
	if opts.SimNodes > 0 {
		want = append(want, components.Kwok)
	}
	paths, err := b.EnsureAll(ctx, want...)
	if err != nil {
		return localcluster.Config{}, err
	}
	cfg := localcluster.Config{
		Dir: filepath.Join(dir, "cluster"),
		Binaries: localcluster.Binaries{
			Etcd:              paths[components.Etcd.Name],
			APIServer:         paths[components.KubeAPIServer.Name],
			Scheduler:         paths[components.KubeScheduler.Name],
			ControllerManager: paths[components.KubeControllerManager.Name],
			Kwok:              paths[components.Kwok.Name],
		},
		OnDemandExpiry: opts.OnDemandExpiry,
		Profiling:      opts.Profiling,
		SimNodes:       opts.SimNodes,
		LocalNodes:     opts.LocalNodes,
	}
	if opts.Audit {
		cfg.AuditLogPath = filepath.Join(cfg.Dir, "logs", "audit.log")
	}
	if cfg.LocalNodes == 0 {
		cfg.LocalNodes = defaultLocalNodes
	}
	if cfg.LocalNodes < 0 {
		cfg.LocalNodes = 0
	}
	// etcd on tmpfs: tests write a lot and need no durability.
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "kubetask-etcd-"); err == nil {
			cfg.EtcdDataDir = d
		}
	}
	if cfg.LocalNodes > 0 {
		bin, err := BuildKubetask(ctx, dir)
		if err != nil {
			return cfg, err
		}
		cfg.KubetaskBinary = bin
	}
	return cfg, nil
}

// defaultLocalNodes is the number of local process nodes a test cluster gets
// unless Options says otherwise.
var defaultLocalNodes = 1

// BuildKubetask builds the kubetask command into dir, as `make build` does
// (static: CGO_ENABLED=0), and returns its path. Test binaries run from
// inside the module, so the build reuses the Go cache.
func BuildKubetask(ctx context.Context, dir string) (string, error) {
	tools, err := components.FindToolsDir()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "kubetask")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/kubetask")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Dir = filepath.Dir(tools)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building kubetask: %w: %s", err, b)
	}
	return out, nil
}

// Cluster is the shared cluster of this test binary (for fault hooks).
func Cluster() *localcluster.Cluster {
	if shared == nil {
		panic("clustertest: no cluster; call clustertest.Main from TestMain")
	}
	return shared
}

// Env is what one test gets: clients for the shared cluster and a fresh namespace.
type Env struct {
	Client     kubernetes.Interface
	Config     *rest.Config
	Kubeconfig string
	Namespace  string
	Cluster    *localcluster.Cluster
}

var unsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// New creates a namespace for t (deleted when t ends) with its default
// ServiceAccount (Cluster.EnsureNamespace), so pods can be created at once.
func New(t testing.TB) *Env {
	t.Helper()
	c := Cluster()
	name := unsafe.ReplaceAllString(strings.ToLower(t.Name()), "-")
	if len(name) > 40 {
		name = name[:40]
	}
	ns := strings.Trim(name, "-") + "-" + rand.String(5)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := c.Client()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	settle(t, c)
	return &Env{Client: client, Config: c.RESTConfig(), Kubeconfig: c.Kubeconfig(), Namespace: ns, Cluster: c}
}

// settled is the number of kube-apiserver restarts the cluster had when a
// probe pod last ran through it (settle).
var (
	settledMu sync.Mutex
	settled   int
)

// settle waits, when an earlier test restarted kube-apiserver since the last
// probe, until a probe pod is scheduled onto a local node and runs to its
// end: after a restart, kube-scheduler's and the local nodes' informers may
// wait in client-go's relist backoff (up to a minute once restarts come
// within 2 minutes of each other) before they see a new pod, and that
// recovery from an earlier test's fault must not be charged to the next
// test's own deadlines (CI on e8b9b4d: TestRunAttachAfterKill waited 60 s
// for its main container after two tests that restarted kube-apiserver).
// The wait is on the condition, bounded by 3 minutes.
func settle(t testing.TB, c *localcluster.Cluster) {
	t.Helper()
	settledMu.Lock()
	defer settledMu.Unlock()
	restarts := c.APIServerRestarts()
	if restarts == settled || c.LocalNodes() == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns = "clustertest-settle"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pods := c.Client().CoreV1().Pods(ns)
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "probe", Image: "busybox", Command: []string{"true"}}},
		},
	}
	p, err := pods.Create(ctx, probe, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("settling after a kube-apiserver restart: creating a probe pod: %v", err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		_ = pods.Delete(dctx, p.Name, metav1.DeleteOptions{})
	}()
	start := time.Now()
	for {
		cur, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if err == nil && (cur.Status.Phase == corev1.PodSucceeded || cur.Status.Phase == corev1.PodFailed) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("settling after a kube-apiserver restart: the probe pod did not run within 3 minutes (last: %v)", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Logf("clustertest: the cluster ran a probe pod %s after %d kube-apiserver restarts", time.Since(start).Round(time.Millisecond), restarts)
	settled = restarts
}

// Another starts a cluster of t's own beside the shared one (its own etcd,
// kube-apiserver, scheduler and controller-manager on free ports, and
// opts' nodes: one local process node by default), stopped and removed
// when t ends, and returns t's Env in it: a namespace of the same name as
// env's, so that a task of env's namespace runs in either. A test of
// several clusters (kubetask serve's clusters) takes env as one and this
// as the other.
func Another(t testing.TB, env *Env, opts Options) *Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "kubetask-test-another-")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config(ctx, dir, opts)
	if err != nil {
		_ = os.RemoveAll(dir)
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := localcluster.Start(ctx, cfg)
	t.Cleanup(func() {
		if c != nil {
			stopCtx, stopCancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer stopCancel()
			if err := c.Stop(stopCtx); err != nil {
				t.Errorf("stopping the other cluster: %v", err)
			}
		}
		_ = os.RemoveAll(dir)
		if cfg.EtcdDataDir != "" {
			_ = os.RemoveAll(cfg.EtcdDataDir)
		}
	})
	if err != nil {
		t.Fatalf("starting another cluster: %v", err)
	}
	if err := c.EnsureNamespace(ctx, env.Namespace); err != nil {
		t.Fatal(err)
	}
	return &Env{Client: c.Client(), Config: c.RESTConfig(), Kubeconfig: c.Kubeconfig(), Namespace: env.Namespace, Cluster: c}
}
