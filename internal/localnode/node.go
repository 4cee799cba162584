package localnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	vkslog "github.com/virtual-kubelet/virtual-kubelet/log/slog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/kubetask/kubetask/internal/container"
	"github.com/kubetask/kubetask/internal/imagestore"
	"github.com/kubetask/kubetask/internal/podnet"
	"github.com/kubetask/kubetask/internal/version"
)

const (
	// LabelKey is the label (value LabelValue) on every local node. A local node
	// has no taint: any pod the scheduler finds room for may land on it, so a pod a
	// user brings runs as it is. Simulated (kwok) nodes carry the taint instead; a
	// pod that must run here rather than on another untainted node selects the label.
	LabelKey = "kubetask.dev/node"
	// LabelValue is the value of LabelKey.
	LabelValue = "local"

	// KubeletVersion is what the node reports as its kubelet version.
	KubeletVersion = "v1.37.2"
)

// Config configures a local node.
type Config struct {
	// NodeName is the Node object's name. Required.
	NodeName string
	// Kubeconfig is the path of a kubeconfig with rights to manage nodes, leases,
	// pods, pod status, events, and read config maps and secrets. Required.
	Kubeconfig string
	// Dir holds the pods' logs, volumes and termination-message files. Required;
	// created if missing. Each pod's files are removed when the pod is deleted.
	Dir string
	// ListenAddr is where the kubelet API listens; default 127.0.0.1:0 (any free
	// port). The node registers the chosen port as its kubelet endpoint.
	ListenAddr string
	// MaxPods is the node's pod capacity; default 500.
	MaxPods int
	// CPU and Memory are the node's capacity; defaults 64 and 256Gi, so resource
	// requests of test pods never make a local node look full.
	CPU, Memory string
	// Logger receives the node's logs; default slog.Default().
	Logger *slog.Logger
	// ImageDir is the store of loaded images (package imagestore, written by
	// `kubetask cluster load-image`): a container whose image is in it runs from
	// the image's root file system. Empty: no store; every container's command
	// runs on the host.
	ImageDir string
	// StopGrace is how long containers get after SIGTERM when the node stops,
	// before SIGKILL; default 2s.
	StopGrace time.Duration
	// PodSubnet is the IPv4 subnet (CIDR) of the node's pod network: a pod of
	// a loaded image gets a network namespace of its own with an address from
	// it (package podnet; root on Linux, and an ImageDir). Empty: a free /24 of
	// podnet.DefaultPool. The first address is the bridge's: the pods' gateway,
	// where they reach the host.
	PodSubnet string
	// NoPodNetwork keeps every pod in the node's network (pod IP 127.0.0.1).
	NoPodNetwork bool
	// ClientCAFile is the CA whose client certificates the kubelet API
	// accepts (the API server's --kubelet-client-certificate); each request's
	// user must then be allowed nodes/proxy (or stats, metrics) on this node by
	// the API server, as a kubelet in webhook mode asks. Empty: the CA the
	// kubeconfig trusts for the API server. The node refuses to start without one.
	ClientCAFile string
	// Runtime runs the containers of loaded images: RuntimeRunc (runc found
	// on PATH; or a path to a runc binary: an OCI runtime spec made as
	// containerd makes one, see container.OCIRuntime) or RuntimeInit (the
	// node's own init, package container: no seccomp filter). Empty:
	// $KUBETASK_NODE_RUNTIME, else runc when it is on PATH, else the init
	// with a warning in the node's log. A runtime asked for by name that is
	// not found is an error. Host processes run as they are either way.
	Runtime string

	podSubnet      netip.Prefix
	runtime        *container.OCIRuntime
	runtimeVersion string // the node's status.nodeInfo.containerRuntimeVersion (runtimeVersion)
	runtimeWarning string
}

func (c *Config) defaults() error {
	if c.NodeName == "" || c.Kubeconfig == "" || c.Dir == "" {
		return errors.New("local node needs a name, a kubeconfig and a directory")
	}
	if c.ListenAddr == "" {
		c.ListenAddr = "127.0.0.1:0"
	}
	if c.MaxPods <= 0 {
		c.MaxPods = 500
	}
	if c.CPU == "" {
		c.CPU = "64"
	}
	if c.Memory == "" {
		c.Memory = "256Gi"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 2 * time.Second
	}
	if c.PodSubnet != "" {
		p, err := netip.ParsePrefix(c.PodSubnet)
		if err != nil || !p.Addr().Is4() || p.Bits() > 30 {
			return fmt.Errorf("pod subnet %q: want an IPv4 CIDR of at least 4 addresses, such as 10.244.3.0/24", c.PodSubnet)
		}
		c.podSubnet = p.Masked()
	}
	if c.Runtime == "" {
		c.Runtime = os.Getenv(RuntimeEnvVar)
	}
	images := c.ImageDir != "" && runtime.GOOS == "linux" && os.Geteuid() == 0
	choice, err := chooseRuntime(c.Runtime, images, exec.LookPath)
	if err != nil {
		return err
	}
	c.Runtime, c.runtimeWarning = choice.name, choice.warning
	if choice.path != "" {
		dir, err := filepath.Abs(c.Dir)
		if err != nil {
			return err
		}
		c.runtime = &container.OCIRuntime{Path: choice.path, Root: filepath.Join(dir, "runc")}
		out, _ := exec.Command(choice.path, "--version").Output() //nolint:gosec // the runtime chosen above
		c.runtimeVersion = runtimeVersion(RuntimeRunc, string(out))
	} else {
		c.runtimeVersion = runtimeVersion(RuntimeInit, version.Get().Version)
	}
	return nil
}

// setupPodNetwork makes the node's pod network when pods can use it: root on
// Linux, an image store, not NoPodNetwork. A node that cannot make it runs
// pods of images in its own network, as without one, and says why. The
// apiserver's address, when it is on the loopback, is forwarded into every pod.
func setupPodNetwork(cfg Config, apiHost, apiPort string, log *slog.Logger) *podnet.Network {
	if cfg.NoPodNetwork || cfg.ImageDir == "" || runtime.GOOS != "linux" || os.Geteuid() != 0 {
		return nil
	}
	var forward []string
	if ip, err := netip.ParseAddr(apiHost); err == nil && ip.IsLoopback() {
		forward = append(forward, net.JoinHostPort(apiHost, apiPort))
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		dir = cfg.Dir
	}
	n, err := podnet.Setup(podnet.Config{Bridge: podnet.BridgeName(dir), Subnet: cfg.podSubnet, Forward: forward, Logger: log})
	if err != nil {
		log.Warn("no pod network: pods of loaded images share the node's network", "err", err)
		return nil
	}
	log.Info("pod network ready", "bridge", podnet.BridgeName(dir), "subnet", n.Subnet(), "gateway", n.Gateway())
	return n
}

// Run registers the node and runs its pods until ctx ends. On return every container
// process has been stopped (SIGTERM, then SIGKILL after Config.StopGrace) and the node
// has been marked NotReady (best effort). It returns nil when ctx ended.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	log := cfg.Logger.With("node", cfg.NodeName)
	libLog := slog.New(quietHandler{Handler: log.Handler()})
	vklog.L = vkslog.FromSlog(libLog)
	klog.SetSlogLogger(libLog)

	if err := os.MkdirAll(filepath.Join(cfg.Dir, "pods"), 0o755); err != nil {
		return fmt.Errorf("create node directory: %w", err)
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	restCfg.QPS, restCfg.Burst = 200, 400
	restCfg.UserAgent = "kubetask-node/" + cfg.NodeName
	plain, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	// Every pod status write replaces only .status (see statusOnlyClient).
	client := statusOnlyClient{plain}

	clientCAs, err := clientCAPool(cfg.ClientCAFile, restCfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen for the kubelet API: %w", err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	cert, err := selfSignedCert(cfg.NodeName)
	if err != nil {
		return err
	}

	apiHost, apiPort := apiserverHostPort(restCfg.Host)
	var images *imagestore.Store
	if cfg.ImageDir != "" {
		images = imagestore.New(cfg.ImageDir)
	}
	pnet := setupPodNetwork(cfg, apiHost, apiPort, log)
	p := newProvider(providerConfig{
		nodeName: cfg.NodeName,
		dir:      filepath.Join(cfg.Dir, "pods"),
		client:   client,
		log:      log,
		apiHost:  apiHost,
		apiPort:  apiPort,
		cpu:      resource.MustParse(cfg.CPU),
		memory:   resource.MustParse(cfg.Memory),
		images:   images,
		net:      pnet,
		runtime:  cfg.runtime,
	})

	mux := http.NewServeMux()
	spec := nodeSpec(cfg, port)
	if pnet != nil {
		spec.Spec.PodCIDR = pnet.Subnet().String()
		spec.Spec.PodCIDRs = []string{spec.Spec.PodCIDR}
	}
	n, err := newVKNode(&spec, client, p, mux, 8)
	if err != nil {
		p.shutdown(0)
		return fmt.Errorf("create node: %w", err)
	}

	srv := kubeletServer(mux, cert, clientCAs, newKubeletAuth(cfg.NodeName, plain, log), log)
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("kubelet API server stopped", "err", err)
		}
	}()

	nodeCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.start(nodeCtx)
	runErr := make(chan error, 1)
	go func() { runErr <- n.Run(nodeCtx) }()
	log.Info("local node starting", "kubeletPort", port, "dir", cfg.Dir, "runtime", cfg.Runtime)
	if cfg.runtimeWarning != "" {
		log.Warn("containers of images are not run by runc", "reason", cfg.runtimeWarning)
	}
	select {
	case <-n.Ready():
		log.Info("local node ready")
		if err := removeLegacyTaint(nodeCtx, plain, cfg.NodeName); err != nil {
			log.Warn("could not remove the taint earlier versions put on the node", "err", err)
		}
	case err := <-runErr:
		p.shutdown(cfg.StopGrace)
		_ = srv.Close()
		return fmt.Errorf("run node: %w", err)
	}

	var result error
	select {
	case <-ctx.Done():
	case err := <-runErr:
		if err != nil && ctx.Err() == nil {
			result = fmt.Errorf("run node: %w", err)
		}
	}
	log.Info("local node stopping")
	cancel()
	p.shutdown(cfg.StopGrace)
	_ = srv.Close()
	markNotReady(client, cfg.NodeName, log)
	log.Info("local node stopped")
	return result
}

func apiserverHostPort(host string) (string, string) {
	u := host
	for _, prefix := range []string{"https://", "http://"} {
		if len(u) > len(prefix) && u[:len(prefix)] == prefix {
			u = u[len(prefix):]
		}
	}
	h, p, err := net.SplitHostPort(u)
	if err != nil {
		return u, "443"
	}
	return h, p
}

func nodeSpec(cfg Config, port int) corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse(cfg.CPU),
		corev1.ResourceMemory:           resource.MustParse(cfg.Memory),
		corev1.ResourcePods:             *resource.NewQuantity(int64(cfg.MaxPods), resource.DecimalSI),
		corev1.ResourceEphemeralStorage: resource.MustParse("1Ti"),
	}
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: cfg.NodeName,
			Labels: map[string]string{
				"kubernetes.io/hostname": cfg.NodeName,
				"kubernetes.io/os":       runtime.GOOS,
				"kubernetes.io/arch":     runtime.GOARCH,
				"type":                   "virtual-kubelet",
				LabelKey:                 LabelValue,
			},
		},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			// Only an InternalIP: the apiserver prefers Hostname addresses, and the
			// node name does not resolve.
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(port)}}, //nolint:gosec // a TCP port fits in int32
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion:          KubeletVersion,
				OperatingSystem:         runtime.GOOS,
				Architecture:            runtime.GOARCH,
				ContainerRuntimeVersion: cfg.runtimeVersion,
				OSImage:                 "kubetask local node (host processes, or loaded images)",
			},
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeReady, corev1.ConditionFalse, "KubeletNotReady", "local node starting"),
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
			},
		},
	}
}

// legacyTaint is the NoSchedule taint local nodes carried when pods needed a
// toleration to run on them. A Node object kept from then (cluster down --keep)
// still has it: virtual-kubelet updates only the status of an existing node.
var legacyTaint = corev1.Taint{Key: LabelKey, Value: LabelValue, Effect: corev1.TaintEffectNoSchedule}

// removeLegacyTaint removes legacyTaint from the node, if it is there.
func removeLegacyTaint(ctx context.Context, client kubernetes.Interface, name string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		kept := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t corev1.Taint) bool { return t.MatchTaint(&legacyTaint) })
		if len(kept) == len(n.Spec.Taints) {
			return nil
		}
		n.Spec.Taints = kept
		_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("remove taint %s from node %s: %w", legacyTaint.ToString(), name, err)
	}
	return nil
}

// markNotReady reports the node NotReady right away instead of leaving it to the
// node lifecycle controller after the lease expires.
func markNotReady(client kubernetes.Interface, name string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now := metav1.Now()
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"KubeletStopped","message":"kubetask local node process stopped","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
		now.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	if _, err := client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		log.Warn("could not mark node NotReady", "err", err)
	}
}
