package localnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/clock"
	utilexec "k8s.io/utils/exec"

	"github.com/kubetask/kubetask/internal/container"
	"github.com/kubetask/kubetask/internal/imagestore"
	"github.com/kubetask/kubetask/internal/podnet"
)

type providerConfig struct {
	nodeName         string
	dir              string // pods' directories live here
	client           kubernetes.Interface
	log              *slog.Logger
	apiHost, apiPort string
	cpu, memory      resource.Quantity
	// images is the store of loaded images pods run from; nil: none (every
	// container runs on the host).
	images *imagestore.Store
	// net is the node's pod network: pods of loaded images get a network
	// namespace of their own in it. nil: every pod shares the node's network.
	net *podnet.Network
	// runtime runs the containers of loaded images; nil: the node's init.
	runtime *container.OCIRuntime
	// clock gives the pod workers the time and their timers (restart back-off,
	// activeDeadlineSeconds, termination grace); default the real one.
	clock clock.WithDelayedExecution
}

// provider implements virtual-kubelet's Provider and PodNotifier on local processes.
type provider struct {
	cfg  providerConfig
	pods corev1listers.PodLister

	mu      sync.Mutex
	workers map[string]*podWorker // by namespace/name
	notify  func(*corev1.Pod)
	ctx     context.Context
	wg      sync.WaitGroup
}

var (
	_ vkProvider = (*provider)(nil)
	_ interface {
		NotifyPods(context.Context, func(*corev1.Pod))
	} = (*provider)(nil)
)

func newProvider(cfg providerConfig) *provider {
	if cfg.clock == nil {
		cfg.clock = clock.RealClock{}
	}
	return &provider{cfg: cfg, workers: map[string]*podWorker{}, notify: func(*corev1.Pod) {}}
}

// lookupImage returns the loaded image named image, or nil.
func (p *provider) lookupImage(image string) (*imagestore.Image, error) {
	if p.cfg.images == nil {
		return nil, nil
	}
	return p.cfg.images.Lookup(image)
}

func (w *podWorker) clock() clock.WithDelayedExecution { return w.p.cfg.clock }

// start gives the provider the context its pod workers run in.
func (p *provider) start(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ctx = ctx
}

// shutdown stops every container (SIGTERM, SIGKILL after grace) and waits for the
// pod workers to end. Pod statuses are not updated: the node is going away.
func (p *provider) shutdown(grace time.Duration) {
	p.mu.Lock()
	ws := make([]*podWorker, 0, len(p.workers))
	for _, w := range p.workers {
		ws = append(ws, w)
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.stopAll(grace)
		}()
	}
	wg.Wait()
	p.wg.Wait()
	// Containers of runc are deleted after their results: their state and
	// cgroups must not outlive the node.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := container.WaitDeleted(ctx); err != nil {
		p.cfg.log.Warn("containers not deleted from runc when the node stopped", "err", err)
	}
	cancel()
	if p.cfg.net != nil {
		if err := p.cfg.net.Close(); err != nil {
			p.cfg.log.Warn("could not remove the pod network", "err", err)
		}
	}
}

func key(namespace, name string) string { return namespace + "/" + name }

func (p *provider) worker(namespace, name string) *podWorker {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.workers[key(namespace, name)]
}

// NotifyPods implements virtual-kubelet's PodNotifier: status changes are pushed.
func (p *provider) NotifyPods(_ context.Context, f func(*corev1.Pod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notify = f
}

func (p *provider) publish(pod *corev1.Pod) {
	p.mu.Lock()
	f := p.notify
	p.mu.Unlock()
	f(pod)
}

// CreatePod starts running pod. It does not wait for any container.
func (p *provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := key(pod.Namespace, pod.Name)
	if w, ok := p.workers[k]; ok && w.uid == pod.UID {
		go w.update(pod)
		return nil
	}
	if p.ctx == nil {
		return errors.New("local node not started")
	}
	w := newPodWorker(p, pod)
	p.workers[k] = w
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		w.run(p.ctx)
	}()
	return nil
}

// UpdatePod applies a changed spec: activeDeadlineSeconds, labels and annotations.
func (p *provider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	w := p.worker(pod.Namespace, pod.Name)
	if w == nil || w.uid != pod.UID {
		return errdefs.NotFoundf("pod %s/%s is not on this node", pod.Namespace, pod.Name)
	}
	w.update(pod)
	return nil
}

// DeletePod starts a graceful deletion of a pod still in the API, or forgets a pod
// that is gone from it (killing whatever is left and removing its files).
func (p *provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	w := p.worker(pod.Namespace, pod.Name)
	if w == nil || w.uid != pod.UID {
		return errdefs.NotFoundf("pod %s/%s is not on this node", pod.Namespace, pod.Name)
	}
	current, err := p.pods.Pods(pod.Namespace).Get(pod.Name)
	if err == nil && current.UID == pod.UID && current.DeletionTimestamp != nil {
		w.requestDeletion(current)
		return nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("look up pod: %w", err)
	}
	p.mu.Lock()
	if p.workers[key(pod.Namespace, pod.Name)] == w {
		delete(p.workers, key(pod.Namespace, pod.Name))
	}
	p.mu.Unlock()
	w.destroy()
	return nil
}

// GetPod returns the pod with the status this node computes for it.
func (p *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	w := p.worker(namespace, name)
	if w == nil {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	return w.snapshot(), nil
}

// GetPodStatus returns the status this node computes for the pod.
func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods lists the pods this node runs.
func (p *provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	ws := make([]*podWorker, 0, len(p.workers))
	for _, w := range p.workers {
		ws = append(ws, w)
	}
	p.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(ws))
	for _, w := range ws {
		pods = append(pods, w.snapshot())
	}
	sort.Slice(pods, func(i, j int) bool {
		return key(pods[i].Namespace, pods[i].Name) < key(pods[j].Namespace, pods[j].Name)
	})
	return pods, nil
}

// GetContainerLogs serves a container's log like the kubelet: the current instance,
// or with Previous the one before it; Follow ends when that instance exits.
// Tail 0 means the whole log: virtual-kubelet cannot tell tailLines=0 from no tail.
func (p *provider) GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	w := p.worker(namespace, podName)
	if w == nil {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, podName)
	}
	proc, err := w.logInstance(containerName, opts.Previous)
	if err != nil {
		return nil, err
	}
	lo := container.LogOptions{
		Follow:     opts.Follow,
		Timestamps: opts.Timestamps,
		SinceTime:  opts.SinceTime,
		TailLines:  -1,
		LimitBytes: int64(opts.LimitBytes),
	}
	if opts.Tail > 0 {
		lo.TailLines = int64(opts.Tail)
	}
	if opts.SinceSeconds > 0 {
		lo.SinceTime = time.Now().Add(-time.Duration(opts.SinceSeconds) * time.Second)
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(proc.ReadLog(ctx, lo, pw))
	}()
	return pr, nil
}

// RunInContainer runs cmd in a running container; a non-zero exit is returned as
// k8s.io/utils/exec.CodeExitError, which the kubelet API turns into the exit code
// the client sees.
func (p *provider) RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error {
	if attach.TTY() {
		return errdefs.InvalidInput("the kubetask local node does not support exec with a TTY")
	}
	w := p.worker(namespace, podName)
	if w == nil {
		return errdefs.NotFoundf("pod %s/%s is not on this node", namespace, podName)
	}
	proc, err := w.runningInstance(containerName)
	if err != nil {
		return err
	}
	var (
		stdin          io.Reader
		stdout, stderr io.Writer
	)
	if r := attach.Stdin(); r != nil {
		stdin = r
	}
	if o := attach.Stdout(); o != nil {
		stdout = o
	}
	if e := attach.Stderr(); e != nil {
		stderr = e
	}
	code, err := proc.Exec(ctx, cmd, stdin, stdout, stderr)
	if err != nil {
		if errors.Is(err, container.ErrNotRunning) {
			return errdefs.InvalidInputf("container %q in pod %s/%s is not running", containerName, namespace, podName)
		}
		return err
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with non-zero exit code: %d", code), Code: code}
	}
	return nil
}

// AttachToContainer is not supported: container stdin is not kept open.
func (p *provider) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errdefs.InvalidInput("the kubetask local node does not support attach")
}

// GetStatsSummary reports only the node and its pods' names.
func (p *provider) GetStatsSummary(ctx context.Context) (*statsv1alpha1.Summary, error) {
	pods, _ := p.GetPods(ctx)
	s := &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: p.cfg.nodeName, StartTime: metav1.Now()}}
	for _, pod := range pods {
		s.Pods = append(s.Pods, statsv1alpha1.PodStats{PodRef: statsv1alpha1.PodReference{Name: pod.Name, Namespace: pod.Namespace, UID: string(pod.UID)}})
	}
	return s, nil
}

// GetMetricsResource reports no metrics.
func (p *provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) { return nil, nil }

// PortForward is not supported: pods share the host's network.
func (p *provider) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return errdefs.InvalidInput("the kubetask local node does not support port-forward; pods use the host network")
}
