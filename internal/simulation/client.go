package simulation

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

// simClient is a process's kubernetes.Interface: pods and Leases go to the
// simulated API server, each request a step of the process; client-go's
// fake serves nothing else (its Invokes holds a lock across a reaction, so
// a request that waits for its step cannot go through it).
type simClient struct {
	*fake.Clientset
	srv   *apiServer
	actor string
	logs  corev1client.CoreV1Interface // GetLogs
}

var _ kubernetes.Interface = (*simClient)(nil)

var (
	podsResource   = corev1.SchemeGroupVersion.WithResource("pods")
	podsKind       = corev1.SchemeGroupVersion.WithKind("Pod")
	leasesResource = coordinationv1.SchemeGroupVersion.WithResource("leases")
	leasesKind     = coordinationv1.SchemeGroupVersion.WithKind("Lease")
)

func (s *apiServer) client(actor string) *simClient {
	return &simClient{Clientset: fake.NewClientset(), srv: s, actor: actor, logs: s.logsClient(actor)}
}

func (c *simClient) CoreV1() corev1client.CoreV1Interface {
	return &simCore{CoreV1Interface: c.Clientset.CoreV1(), c: c}
}

func (c *simClient) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return &simCoordination{CoordinationV1Interface: c.Clientset.CoordinationV1(), c: c}
}

type simCore struct {
	corev1client.CoreV1Interface
	c *simClient
}

func (x *simCore) Pods(ns string) corev1client.PodInterface {
	return &simPods{PodInterface: x.CoreV1Interface.Pods(ns), c: x.c, ns: ns}
}

type simPods struct {
	corev1client.PodInterface
	c  *simClient
	ns string
}

func (p *simPods) pod(ctx context.Context, a k8stesting.Action) (*corev1.Pod, error) {
	obj, err := p.c.srv.request(ctx, p.c.actor, a)
	if err != nil {
		return nil, err
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		return pod, nil
	}
	return nil, nil
}

func (p *simPods) Create(ctx context.Context, pod *corev1.Pod, opts metav1.CreateOptions) (*corev1.Pod, error) {
	// kube-apiserver takes the namespace from the request's path, and
	// refuses an object that names another.
	pod = pod.DeepCopy()
	switch pod.Namespace {
	case "":
		pod.Namespace = p.ns
	case p.ns:
	default:
		return nil, apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
	}
	return p.pod(ctx, k8stesting.NewCreateActionWithOptions(podsResource, p.ns, pod, opts))
}

func (p *simPods) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error) {
	return p.pod(ctx, k8stesting.NewGetActionWithOptions(podsResource, p.ns, name, opts))
}

func (p *simPods) Update(ctx context.Context, pod *corev1.Pod, opts metav1.UpdateOptions) (*corev1.Pod, error) {
	return p.pod(ctx, k8stesting.NewUpdateActionWithOptions(podsResource, p.ns, pod.DeepCopy(), opts))
}

func (p *simPods) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*corev1.Pod, error) {
	a := k8stesting.NewPatchActionWithOptions(podsResource, p.ns, name, pt, data, opts)
	if len(sub) > 0 {
		a.Subresource = sub[0]
	}
	return p.pod(ctx, a)
}

func (p *simPods) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	_, err := p.c.srv.request(ctx, p.c.actor, k8stesting.NewDeleteActionWithOptions(podsResource, p.ns, name, opts))
	return err
}

func (p *simPods) GetLogs(name string, opts *corev1.PodLogOptions) *rest.Request {
	return p.c.logs.Pods(p.ns).GetLogs(name, opts)
}

func (p *simPods) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	obj, err := p.c.srv.request(ctx, p.c.actor, k8stesting.NewListActionWithOptions(podsResource, podsKind, p.ns, opts))
	if err != nil {
		return nil, err
	}
	return obj.(*corev1.PodList), nil
}

func (p *simPods) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return p.c.srv.watch(ctx, p.c.actor, k8stesting.NewWatchActionWithOptions(podsResource, p.ns, opts))
}

type simCoordination struct {
	coordinationv1client.CoordinationV1Interface
	c *simClient
}

func (x *simCoordination) Leases(ns string) coordinationv1client.LeaseInterface {
	return &simLeases{LeaseInterface: x.CoordinationV1Interface.Leases(ns), c: x.c, ns: ns}
}

type simLeases struct {
	coordinationv1client.LeaseInterface
	c  *simClient
	ns string
}

func (l *simLeases) lease(ctx context.Context, a k8stesting.Action) (*coordinationv1.Lease, error) {
	obj, err := l.c.srv.request(ctx, l.c.actor, a)
	if err != nil {
		return nil, err
	}
	if x, ok := obj.(*coordinationv1.Lease); ok {
		return x, nil
	}
	return nil, nil
}

func (l *simLeases) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	return l.lease(ctx, k8stesting.NewGetActionWithOptions(leasesResource, l.ns, name, opts))
}

func (l *simLeases) Create(ctx context.Context, x *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	return l.lease(ctx, k8stesting.NewCreateActionWithOptions(leasesResource, l.ns, x.DeepCopy(), opts))
}

func (l *simLeases) Update(ctx context.Context, x *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	return l.lease(ctx, k8stesting.NewUpdateActionWithOptions(leasesResource, l.ns, x.DeepCopy(), opts))
}

func (l *simLeases) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	_, err := l.c.srv.request(ctx, l.c.actor, k8stesting.NewDeleteActionWithOptions(leasesResource, l.ns, name, opts))
	return err
}

func (l *simLeases) List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	obj, err := l.c.srv.request(ctx, l.c.actor, k8stesting.NewListActionWithOptions(leasesResource, leasesKind, l.ns, opts))
	if err != nil {
		return nil, err
	}
	return obj.(*coordinationv1.LeaseList), nil
}

func (l *simLeases) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return l.c.srv.watch(ctx, l.c.actor, k8stesting.NewWatchActionWithOptions(leasesResource, l.ns, opts))
}
