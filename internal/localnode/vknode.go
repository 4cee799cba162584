package localnode

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// vkNode is a virtual-kubelet node put together from the library's node
// controller, pod controller and kubelet API handler, as its nodeutil
// package would, for what a local node uses: pods bound to it, with their
// config maps, secrets and services, through informers without resync; a
// node Lease; events; logs and exec on the kubelet API.
//
// nodeutil itself is not used: its authentication and authorisation
// options import k8s.io/apiserver's server packages, with etcd's client,
// gRPC, OpenTelemetry and CEL: 526 packages that every start of the
// kubetask binary initialised, `kubetask run` included (docs/benchmarks.md).
type vkNode struct {
	spec    *corev1.Node
	client  kubernetes.Interface
	nc      *node.NodeController
	np      *node.NaiveNodeProviderV2
	pc      *node.PodController
	inf     *nodeInformers
	events  record.EventBroadcaster
	workers int
	ready   chan struct{}
}

// vkProvider is what a local node's provider implements: the pod lifecycle
// and the kubelet API (nodeutil's Provider).
type vkProvider interface {
	node.PodLifecycleHandler
	GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error)
	RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error
	AttachToContainer(ctx context.Context, namespace, podName, containerName string, attach api.AttachIO) error
	GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error)
	GetMetricsResource(context.Context) ([]*dto.MetricFamily, error)
	PortForward(ctx context.Context, namespace, pod string, port int32, stream io.ReadWriteCloser) error
}

// newVKNode builds the node spec describes for p, whose pods lister it
// sets, and adds the kubelet API's routes to mux. workers pod workers
// sync pods.
func newVKNode(spec *corev1.Node, client kubernetes.Interface, p *provider, mux *http.ServeMux, workers int) (*vkNode, error) {
	inf := newNodeInformers(client, spec.Name)
	podInformer := inf.pods
	p.pods = podInformer.Lister()

	mux.Handle("/", api.PodHandler(api.PodHandlerConfig{
		RunInContainer:    p.RunInContainer,
		AttachToContainer: p.AttachToContainer,
		GetContainerLogs:  p.GetContainerLogs,
		GetPods:           p.GetPods,
		GetPodsFromKubernetes: func(context.Context) ([]*corev1.Pod, error) {
			return podInformer.Lister().List(labels.Everything())
		},
		GetStatsSummary:    p.GetStatsSummary,
		GetMetricsResource: p.GetMetricsResource,
		PortForward:        p.PortForward,
	}, true))

	np := node.NewNaiveNodeProvider()
	nc, err := node.NewNodeController(np, spec, client.CoreV1().Nodes(),
		node.WithNodeEnableLeaseV1(client.CoordinationV1().Leases(corev1.NamespaceNodeLease), node.DefaultLeaseDuration))
	if err != nil {
		return nil, fmt.Errorf("node controller: %w", err)
	}
	events := record.NewBroadcaster()
	pc, err := node.NewPodController(node.PodControllerConfig{
		PodClient:         client.CoreV1(),
		EventRecorder:     events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: spec.Name + "/pod-controller"}),
		Provider:          p,
		PodInformer:       podInformer,
		SecretInformer:    inf.secrets,
		ConfigMapInformer: inf.configMaps,
		ServiceInformer:   inf.services,
		// The provider resolves env itself, to report CreateContainerConfigError
		// as the kubelet does instead of failing the pod.
		SkipDownwardAPIResolution: true,
	})
	if err != nil {
		return nil, fmt.Errorf("pod controller: %w", err)
	}
	return &vkNode{spec: spec, client: client, nc: nc, np: np, pc: pc, inf: inf, events: events,
		workers: workers, ready: make(chan struct{})}, nil
}

// Ready is closed once the node is registered Ready and its pods are
// being run.
func (n *vkNode) Ready() <-chan struct{} { return n.ready }

// Run runs the node until ctx ends or a controller fails: the pod
// controller first, then, once it is ready, the node controller, then the
// node is marked Ready. It returns once both controllers stopped.
func (n *vkNode) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n.events.StartLogging(vklog.G(ctx).Infof)
	n.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: n.client.CoreV1().Events(corev1.NamespaceAll)})
	defer n.events.Shutdown()
	n.inf.start(ctx)
	defer n.inf.wait()
	go n.pc.Run(ctx, n.workers) //nolint:errcheck // its error is read from Err once Done
	defer func() {
		cancel()
		<-n.pc.Done()
	}()
	select {
	case <-ctx.Done():
		return nil
	case <-n.pc.Done():
		return n.pc.Err()
	case <-n.pc.Ready():
	}
	go n.nc.Run(ctx) //nolint:errcheck // its error is read from Err once Done
	defer func() {
		cancel()
		<-n.nc.Done()
	}()
	select {
	case <-ctx.Done():
		return nil
	case <-n.nc.Done():
		return n.nc.Err()
	case <-n.nc.Ready():
	}
	setReady(n.spec)
	if err := n.np.UpdateStatus(ctx, n.spec); err != nil {
		return fmt.Errorf("marking the node ready: %w", err)
	}
	close(n.ready)
	select {
	case <-ctx.Done():
		return nil
	case <-n.nc.Done():
		return n.nc.Err()
	case <-n.pc.Done():
		return n.pc.Err()
	}
}

// setReady makes n Running with its Ready condition true, as nodeutil
// reports a node whose controllers started.
func setReady(n *corev1.Node) {
	n.Status.Phase = corev1.NodeRunning
	now := metav1.NewTime(time.Now())
	for i, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			n.Status.Conditions[i] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
				Reason: "KubeletReady", Message: "Kubelet is ready", LastHeartbeatTime: now, LastTransitionTime: now}
		}
	}
}
