package localcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// serviceIP is the first address of the service range; the apiserver
	// advertises it because it refuses a loopback advertise address.
	serviceIP    = "10.0.0.1"
	serviceRange = "10.0.0.0/24"
	// ContextName is the kubeconfig context the cluster writes.
	ContextName = "kubetask-local"
)

// Binaries are the paths of the component executables.
type Binaries struct {
	Etcd, APIServer, Scheduler, ControllerManager string
	// Kwok is needed only for simulated nodes.
	Kwok string
}

// Config describes a local cluster. Dir is required; everything else has a default.
type Config struct {
	// Dir holds the cluster's key material, kubeconfig, component configs and logs.
	Dir string
	// EtcdDataDir defaults to Dir/etcd. Point it at tmpfs for fast tests.
	EtcdDataDir string
	// Binaries to run; see components.Builder.
	Binaries Binaries
	// APIServerPort is the apiserver's port on 127.0.0.1; 0 picks a free one.
	APIServerPort int
	// OnDemandExpiry turns the pods watch cache and etcd's automatic
	// compaction off, so that after CompactEtcd every pod watch started or
	// resumed from an older resourceVersion fails with 410 Expired (a watch
	// that is up and current goes on: etcd cancels only watchers behind the
	// compaction).
	OnDemandExpiry bool
	// AuditLogPath, when set, turns kube-apiserver's audit log on: JSON
	// lines of audit.k8s.io/v1 Events appended to this file, under
	// AuditPolicy. Off by default (auditing costs the API server time).
	AuditLogPath string
	// AuditPolicy is the audit policy (YAML) used with AuditLogPath;
	// empty means PodAuditPolicy.
	AuditPolicy string
	// Profiling turns kube-apiserver's /debug/pprof handlers on (off by
	// default, as --profiling=false has it), for benchmarks that profile
	// the API server's CPU per task.
	Profiling bool
	// LocalNodes is the number of local process nodes (kubetask node run) to start.
	LocalNodes int
	// NodeRuntime is the local nodes' --runtime (what runs the containers of
	// loaded images: localnode.RuntimeRunc or RuntimeInit). Empty: the
	// node's default (localnode.Config.Runtime).
	NodeRuntime string
	// KubetaskBinary runs local nodes; required when LocalNodes > 0.
	KubetaskBinary string
	// SimNodes is the number of kwok-simulated nodes to create at start.
	SimNodes int
	// Logger receives progress; nil discards.
	Logger *slog.Logger
}

// Cluster is a running local cluster. Its methods are safe for concurrent use.
type Cluster struct {
	cfg        Config
	log        *slog.Logger
	pki        *pki
	kubeconfig string
	restConfig *rest.Config
	client     kubernetes.Interface
	ports      ports

	mu        sync.Mutex
	etcd      *process
	apiserver *process
	scheduler *process
	kcm       *process
	kwok      *process
	nodes     []*process
	// kcmQPS and kcmBurst are kube-controller-manager's client limits
	// (zero: 1000 and 1000), see RestartControllerManager.
	kcmQPS, kcmBurst int
	// kcmJobSyncs is kube-controller-manager's --concurrent-job-syncs; 0
	// leaves its default (5).
	kcmJobSyncs int
	// apiRestarts counts RestartAPIServer's restarts (APIServerRestarts).
	apiRestarts int
	etcdClient  *http.Client
	simNodes    int
	stopped     bool
}

type ports struct {
	EtcdClient, EtcdPeer, APIServer, Scheduler, ControllerManager, Kwok int
}

// Start launches the control plane described by cfg and waits until it is ready.
// On error nothing it started is left running.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger}
	if err := c.start(ctx); err != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = c.Stop(stopCtx)
		return nil, err
	}
	return c, nil
}

func (cfg *Config) defaults() error {
	if cfg.Dir == "" {
		return errors.New("localcluster: Config.Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return fmt.Errorf("resolving cluster directory: %w", err)
	}
	cfg.Dir = dir
	if cfg.EtcdDataDir == "" {
		cfg.EtcdDataDir = filepath.Join(cfg.Dir, "etcd")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.AuditLogPath != "" {
		p, err := filepath.Abs(cfg.AuditLogPath)
		if err != nil {
			return fmt.Errorf("resolving the audit log path: %w", err)
		}
		cfg.AuditLogPath = p
		if cfg.AuditPolicy == "" {
			cfg.AuditPolicy = PodAuditPolicy
		}
	} else if cfg.AuditPolicy != "" {
		return errors.New("localcluster: Config.AuditPolicy needs Config.AuditLogPath (where the audit log goes)")
	}
	b := cfg.Binaries
	for name, p := range map[string]string{"etcd": b.Etcd, "kube-apiserver": b.APIServer, "kube-scheduler": b.Scheduler, "kube-controller-manager": b.ControllerManager} {
		if p == "" {
			return fmt.Errorf("localcluster: no binary for %s (build it with components.Builder)", name)
		}
	}
	if cfg.SimNodes > 0 && b.Kwok == "" {
		return errors.New("localcluster: SimNodes needs Binaries.Kwok")
	}
	if cfg.LocalNodes > 0 && cfg.KubetaskBinary == "" {
		return errors.New("localcluster: LocalNodes needs KubetaskBinary")
	}
	if cfg.APIServerPort < 0 || cfg.APIServerPort > 65535 {
		return fmt.Errorf("apiserver port %d is out of range: use 1-65535, or 0 for a free port", cfg.APIServerPort)
	}
	return nil
}

func (c *Cluster) start(ctx context.Context) error {
	cfg := c.cfg
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "logs"), filepath.Join(cfg.Dir, ImagesDirName), cfg.EtcdDataDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	p, err := ensurePKI(filepath.Join(cfg.Dir, "pki"))
	if err != nil {
		return err
	}
	c.pki = p
	if err := c.allocatePorts(); err != nil {
		return err
	}
	if err := c.writeConfigs(); err != nil {
		return err
	}

	c.log.Info("starting etcd", "port", c.ports.EtcdClient)
	if err := c.startEtcd(ctx); err != nil {
		return err
	}
	c.log.Info("starting kube-apiserver", "port", c.ports.APIServer)
	if err := c.startAPIServer(ctx); err != nil {
		return err
	}
	c.log.Info("starting kube-scheduler and kube-controller-manager")
	kcmArgs := c.controllerManagerArgs()
	c.mu.Lock()
	c.scheduler = c.newProcess("kube-scheduler", cfg.Binaries.Scheduler, c.schedulerArgs())
	c.kcm = c.newProcess("kube-controller-manager", cfg.Binaries.ControllerManager, kcmArgs)
	c.mu.Unlock()
	for _, pr := range []*process{c.scheduler, c.kcm} {
		if err := pr.start(); err != nil {
			return err
		}
	}
	if err := c.waitReady(ctx, c.scheduler, insecureHealthz(c.ports.Scheduler)); err != nil {
		return err
	}
	if err := c.waitReady(ctx, c.kcm, insecureHealthz(c.ports.ControllerManager)); err != nil {
		return err
	}
	// The ServiceAccount admission plugin rejects pods in a namespace without
	// a default ServiceAccount; the controller-manager creates them.
	if err := c.waitReady(ctx, c.kcm, func(ctx context.Context) error {
		_, err := c.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("waiting for the default ServiceAccount: %w", err)
	}
	for i := 0; i < cfg.LocalNodes; i++ {
		if err := c.AddLocalNode(ctx); err != nil {
			return err
		}
	}
	if cfg.SimNodes > 0 {
		if err := c.AddSimNodes(ctx, cfg.SimNodes); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) allocatePorts() error {
	if c.cfg.APIServerPort != 0 {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.cfg.APIServerPort)))
		if err != nil {
			return fmt.Errorf("apiserver port %d is already in use: free it, or choose another port (0 picks a free one): %w", c.cfg.APIServerPort, err)
		}
		l.Close()
	}
	free, err := freePorts(6)
	if err != nil {
		return err
	}
	c.ports = ports{EtcdClient: free[0], EtcdPeer: free[1], APIServer: free[2], Scheduler: free[3], ControllerManager: free[4], Kwok: free[5]}
	if c.cfg.APIServerPort != 0 {
		c.ports.APIServer = c.cfg.APIServerPort
	}
	return nil
}

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

func (c *Cluster) path(name string) string { return filepath.Join(c.cfg.Dir, name) }

func (c *Cluster) newProcess(name, bin string, args []string) *process {
	return &process{name: name, path: bin, args: args, logPath: filepath.Join(c.cfg.Dir, "logs", name+".log")}
}

func (c *Cluster) writeConfigs() error {
	server := fmt.Sprintf("https://127.0.0.1:%d", c.ports.APIServer)
	ca, err := os.ReadFile(c.pki.CACert)
	if err != nil {
		return fmt.Errorf("reading CA: %w", err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters[ContextName] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	kc.AuthInfos[ContextName] = &clientcmdapi.AuthInfo{Token: c.pki.Token}
	kc.Contexts[ContextName] = &clientcmdapi.Context{Cluster: ContextName, AuthInfo: ContextName, Namespace: "default"}
	kc.CurrentContext = ContextName
	c.kubeconfig = c.path("kubeconfig")
	if err := clientcmd.WriteToFile(*kc, c.kubeconfig); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	rc.QPS, rc.Burst = 1000, 2000
	c.restConfig = rc
	if c.client, err = kubernetes.NewForConfig(rc); err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	tokens := fmt.Sprintf("%s,admin,admin,system:masters\n", c.pki.Token)
	if err := os.WriteFile(c.path("tokens.csv"), []byte(tokens), 0o600); err != nil {
		return fmt.Errorf("writing token file: %w", err)
	}
	sched := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
  qps: 1000
  burst: 1000
leaderElection:
  leaderElect: false
`, c.kubeconfig)
	if err := os.WriteFile(c.path("scheduler.yaml"), []byte(sched), 0o600); err != nil {
		return fmt.Errorf("writing scheduler config: %w", err)
	}
	if c.cfg.AuditLogPath != "" {
		if err := os.WriteFile(c.path("audit-policy.yaml"), []byte(c.cfg.AuditPolicy), 0o600); err != nil {
			return fmt.Errorf("writing the audit policy: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(c.cfg.AuditLogPath), 0o700); err != nil {
			return fmt.Errorf("creating the audit log's directory: %w", err)
		}
	}
	return nil
}

// etcdArgs: etcd serves clients and its peer port over TLS and accepts only
// certificates of the etcd CA (the apiserver's etcd client certificate), as
// kubeadm sets it up: no local user reaches the cluster's data without it.
func (c *Cluster) etcdArgs() []string {
	client := fmt.Sprintf("https://127.0.0.1:%d", c.ports.EtcdClient)
	peer := fmt.Sprintf("https://127.0.0.1:%d", c.ports.EtcdPeer)
	return []string{
		"--cert-file=" + c.pki.EtcdCert,
		"--key-file=" + c.pki.EtcdKey,
		"--client-cert-auth=true",
		"--trusted-ca-file=" + c.pki.EtcdCACert,
		"--peer-cert-file=" + c.pki.EtcdCert,
		"--peer-key-file=" + c.pki.EtcdKey,
		"--peer-client-cert-auth=true",
		"--peer-trusted-ca-file=" + c.pki.EtcdCACert,
		"--name=default",
		"--data-dir=" + c.cfg.EtcdDataDir,
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=default=" + peer,
		"--unsafe-no-fsync=true",
		"--log-level=warn",
		"--quota-backend-bytes=8589934592",
	}
}

func (c *Cluster) apiserverArgs() []string {
	args := []string{
		fmt.Sprintf("--etcd-servers=https://127.0.0.1:%d", c.ports.EtcdClient),
		"--etcd-cafile=" + c.pki.EtcdCACert,
		"--etcd-certfile=" + c.pki.EtcdClientCert,
		"--etcd-keyfile=" + c.pki.EtcdClientKey,
		// The local nodes' kubelet API wants this certificate (and asks the
		// apiserver whether its user may use the node).
		"--kubelet-client-certificate=" + c.pki.KubeletClientCert,
		"--kubelet-client-key=" + c.pki.KubeletClientKey,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.ports.APIServer),
		"--advertise-address=" + serviceIP,
		"--endpoint-reconciler-type=none",
		"--service-cluster-ip-range=" + serviceRange,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + c.pki.SAPub,
		"--service-account-signing-key-file=" + c.pki.SAKey,
		"--tls-cert-file=" + c.pki.ServingCert,
		"--tls-private-key-file=" + c.pki.ServingKey,
		"--client-ca-file=" + c.pki.CACert,
		"--cert-dir=" + c.path("pki"),
		"--token-auth-file=" + c.path("tokens.csv"),
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--max-requests-inflight=1000",
		"--max-mutating-requests-inflight=500",
		fmt.Sprintf("--profiling=%t", c.cfg.Profiling),
		"--v=1",
	}
	if c.cfg.OnDemandExpiry {
		args = append(args, "--watch-cache-sizes=pods#0", "--etcd-compaction-interval=0")
	}
	return append(args, c.auditArgs()...)
}

func (c *Cluster) schedulerArgs() []string {
	return []string{
		"--config=" + c.path("scheduler.yaml"),
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.ports.Scheduler),
		"--authentication-kubeconfig=" + c.kubeconfig,
		"--authorization-kubeconfig=" + c.kubeconfig,
		"--v=1",
	}
}

func (c *Cluster) controllerManagerArgs() []string {
	c.mu.Lock()
	qps, burst, jobSyncs := c.kcmQPS, c.kcmBurst, c.kcmJobSyncs
	c.mu.Unlock()
	if qps == 0 {
		qps, burst = 1000, 1000
	}
	args := []string{
		"--kubeconfig=" + c.kubeconfig,
		"--authentication-kubeconfig=" + c.kubeconfig,
		"--authorization-kubeconfig=" + c.kubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.ports.ControllerManager),
		"--leader-elect=false",
		fmt.Sprintf("--kube-api-qps=%d", qps),
		fmt.Sprintf("--kube-api-burst=%d", burst),
		"--service-account-private-key-file=" + c.pki.SAKey,
		"--root-ca-file=" + c.pki.CACert,
		"--use-service-account-credentials=false",
		// Notice a stopped node quickly: tests kill nodes on purpose.
		"--node-monitor-grace-period=20s",
		"--v=1",
	}
	if jobSyncs > 0 {
		args = append(args, fmt.Sprintf("--concurrent-job-syncs=%d", jobSyncs))
	}
	return args
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	c.mu.Lock()
	c.etcd = c.newProcess("etcd", c.cfg.Binaries.Etcd, c.etcdArgs())
	e := c.etcd
	c.mu.Unlock()
	if err := e.start(); err != nil {
		return err
	}
	return c.waitReady(ctx, e, c.etcdHealthy)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	c.mu.Lock()
	c.apiserver = c.newProcess("kube-apiserver", c.cfg.Binaries.APIServer, c.apiserverArgs())
	a := c.apiserver
	c.mu.Unlock()
	if err := a.start(); err != nil {
		return err
	}
	return c.waitReady(ctx, a, c.apiserverReady)
}

// waitReady polls check until it succeeds, the process exits, or two minutes pass.
func (c *Cluster) waitReady(ctx context.Context, p *process, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-p.exited():
			return fmt.Errorf("%s exited during start-up (%w); last log lines from %s:\n%s", p.name, p.exitError(), p.logPath, p.logTail(15))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after waiting (%w): %w; last log lines from %s:\n%s", p.name, ctx.Err(), last, p.logPath, p.logTail(15))
		case <-tick.C:
		}
	}
}

func (c *Cluster) etcdHealthy(ctx context.Context) error {
	var out struct {
		Health string `json:"health"`
	}
	if err := c.etcdCall(ctx, http.MethodGet, "/health", nil, &out); err != nil {
		return err
	}
	if out.Health != "true" {
		return fmt.Errorf("etcd health is %q", out.Health)
	}
	return nil
}

func (c *Cluster) apiserverReady(ctx context.Context) error {
	body, err := c.client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("apiserver /readyz: %w (%s)", err, bytes.TrimSpace(body))
	}
	return nil
}

func insecureHealthz(port int) func(context.Context) error {
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // components serve self-signed certificates on loopback
	return healthCheck(client, fmt.Sprintf("https://127.0.0.1:%d/healthz", port))
}

// healthCheck returns a check that GETs url with client and wants 200 OK.
func healthCheck(client *http.Client, url string) func(context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return fmt.Errorf("%s: %s: %s", url, resp.Status, b)
		}
		return nil
	}
}

func (c *Cluster) etcdCall(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, fmt.Sprintf("https://127.0.0.1:%d%s", c.ports.EtcdClient, path), body)
	if err != nil {
		return err
	}
	client, err := c.etcdHTTPClient()
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("etcd %s: decoding %q: %w", path, data, err)
		}
	}
	return nil
}

// etcdHTTPClient is a client of etcd's HTTP gateway with the apiserver's etcd
// client certificate, made once.
func (c *Cluster) etcdHTTPClient() (*http.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.etcdClient != nil {
		return c.etcdClient, nil
	}
	cert, err := tls.LoadX509KeyPair(c.pki.EtcdClientCert, c.pki.EtcdClientKey)
	if err != nil {
		return nil, fmt.Errorf("loading etcd client certificate: %w", err)
	}
	ca, err := os.ReadFile(c.pki.EtcdCACert)
	if err != nil {
		return nil, fmt.Errorf("reading etcd CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("etcd CA %s holds no certificate", c.pki.EtcdCACert)
	}
	c.etcdClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12,
	}}}
	return c.etcdClient, nil
}

// Kubeconfig is the path of the cluster's admin kubeconfig.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// RESTConfig returns a copy of the admin REST config (QPS 1000, burst 2000).
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Client is an admin clientset.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// Dir is the cluster directory.
func (c *Cluster) Dir() string { return c.cfg.Dir }

// APIServerPort is the apiserver's port on 127.0.0.1.
func (c *Cluster) APIServerPort() int { return c.ports.APIServer }

// Ports returns every loopback port the cluster's components listen on, by component.
func (c *Cluster) Ports() map[string]int {
	p := c.ports
	return map[string]int{"etcd-client": p.EtcdClient, "etcd-peer": p.EtcdPeer, "kube-apiserver": p.APIServer,
		"kube-scheduler": p.Scheduler, "kube-controller-manager": p.ControllerManager, "kwok": p.Kwok}
}

// Process describes one running component.
type Process struct {
	Name string `json:"name"`
	PID  int    `json:"pid"`
	Log  string `json:"log"`
}

// Processes lists the components that are running now.
func (c *Cluster) Processes() []Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Process
	for _, p := range c.all() {
		if p != nil && p.running() {
			out = append(out, Process{Name: p.name, PID: p.pid(), Log: p.logPath})
		}
	}
	return out
}

// all returns every process in start order; c.mu must be held.
func (c *Cluster) all() []*process {
	ps := []*process{c.etcd, c.apiserver, c.scheduler, c.kcm, c.kwok}
	return append(ps, c.nodes...)
}

// Stop terminates every component, nodes first and etcd last, and waits for
// them to exit. It is safe to call more than once.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	c.stopped = true
	ps := c.all()
	c.mu.Unlock()
	var errs []error
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i] == nil {
			continue
		}
		if err := ps[i].stop(ctx, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RestartAPIServer stops kube-apiserver alone and starts it again on the same
// port, keeping etcd's data. Watches resumed from a resourceVersion older
// than the restart then fail with 410 Expired.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	if err := c.StopAPIServer(ctx); err != nil {
		return err
	}
	return c.StartAPIServer(ctx)
}

// StopAPIServer stops kube-apiserver alone (SIGTERM, SIGKILL after 10 s):
// the cluster's API is down, its other components and nodes run on, until
// StartAPIServer. It counts as a restart (APIServerRestarts).
func (c *Cluster) StopAPIServer(ctx context.Context) error {
	c.mu.Lock()
	a := c.apiserver
	c.apiRestarts++
	c.mu.Unlock()
	if err := a.stop(ctx, 10*time.Second); err != nil {
		return fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	return nil
}

// StartAPIServer starts kube-apiserver again on its port, keeping etcd's
// data, after StopAPIServer, and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	return c.startAPIServer(ctx)
}

// APIServerRestarts is how many times RestartAPIServer ran: the components
// that watch kube-apiserver (kube-scheduler, kube-controller-manager, the
// local nodes) may then wait in client-go's relist backoff, up to a minute,
// before they see new objects again.
func (c *Cluster) APIServerRestarts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apiRestarts
}

// LocalNodes is the number of local process nodes the cluster runs.
func (c *Cluster) LocalNodes() int { return c.cfg.LocalNodes }

// RestartControllerManager stops kube-controller-manager (if it runs) and starts it again
// with the client limits --kube-api-qps=qps and --kube-api-burst=burst (zero
// qps: the cluster's 1000 and 1000; kube-controller-manager's own defaults
// are 20 and 30), and waits until it is healthy.
func (c *Cluster) RestartControllerManager(ctx context.Context, qps, burst int) error {
	c.mu.Lock()
	old := c.kcm
	c.kcmQPS, c.kcmBurst = qps, burst
	c.mu.Unlock()
	if err := old.stop(ctx, 10*time.Second); err != nil {
		return fmt.Errorf("stopping kube-controller-manager: %w", err)
	}
	p := c.newProcess("kube-controller-manager", c.cfg.Binaries.ControllerManager, c.controllerManagerArgs())
	c.mu.Lock()
	c.kcm = p
	c.mu.Unlock()
	if err := p.start(); err != nil {
		return fmt.Errorf("starting kube-controller-manager: %w", err)
	}
	return c.waitReady(ctx, p, insecureHealthz(c.ports.ControllerManager))
}

// SetControllerManagerJobSyncs sets kube-controller-manager's
// --concurrent-job-syncs for its next start (RestartControllerManager);
// 0 leaves kube-controller-manager's default (5). The benchmarks compare
// the Job controller with the executor at equal concurrency.
func (c *Cluster) SetControllerManagerJobSyncs(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kcmJobSyncs = n
}

// StopControllerManager stops kube-controller-manager;
// RestartControllerManager starts it again.
func (c *Cluster) StopControllerManager(ctx context.Context) error {
	c.mu.Lock()
	p := c.kcm
	c.mu.Unlock()
	return p.stop(ctx, 10*time.Second)
}

// StopEtcd stops etcd; the apiserver keeps running and fails its requests.
func (c *Cluster) StopEtcd(ctx context.Context) error {
	c.mu.Lock()
	e := c.etcd
	c.mu.Unlock()
	return e.stop(ctx, 10*time.Second)
}

// StartEtcd starts etcd again on the same port and data directory.
func (c *Cluster) StartEtcd(ctx context.Context) error {
	return c.startEtcd(ctx)
}

// EtcdRevision returns etcd's current revision.
func (c *Cluster) EtcdRevision(ctx context.Context) (int64, error) {
	var out struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	all := base64.StdEncoding.EncodeToString([]byte{0})
	if err := c.etcdCall(ctx, http.MethodPost, "/v3/kv/range", map[string]any{"key": all, "range_end": all, "count_only": true}, &out); err != nil {
		return 0, err
	}
	return strconv.ParseInt(out.Header.Revision, 10, 64)
}

// CompactEtcd compacts etcd to its current revision and returns it. With
// Config.OnDemandExpiry, a pod watch from any older resourceVersion then
// fails with 410 Expired.
func (c *Cluster) CompactEtcd(ctx context.Context) (int64, error) {
	rev, err := c.EtcdRevision(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading etcd revision: %w", err)
	}
	if err := c.etcdCall(ctx, http.MethodPost, "/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil); err != nil {
		// Nothing was written since the last compaction: already compacted.
		if strings.Contains(err.Error(), "required revision has been compacted") {
			return rev, nil
		}
		return 0, fmt.Errorf("compacting etcd: %w", err)
	}
	return rev, nil
}

// EnsureNamespace creates namespace ns and its default ServiceAccount, which
// pods need, where they do not exist. It creates the ServiceAccount itself
// rather than waiting for kube-controller-manager's: that controller acts
// when its namespace informer sees the namespace, and after kube-apiserver
// restarts (a fault test) the informer may wait in client-go's relist
// backoff, [30 s, 60 s) once the restarts come within 2 minutes of each
// other, before it lists again.
func (c *Cluster) EnsureNamespace(ctx context.Context, ns string) error {
	_, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
	if _, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s's default ServiceAccount: %w", ns, err)
	}
	return nil
}

// CAData is the PEM of the cluster CA (for clients that build their own config).
func (c *Cluster) CAData() []byte {
	data, _ := os.ReadFile(c.pki.CACert)
	return data
}
