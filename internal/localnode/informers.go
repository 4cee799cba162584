package localnode

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	corev1informers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// nodeInformers are the informers a local node's pod controller reads:
// its pods (those bound to the node) and every config map, secret and
// service, without resync, each built by client-go's constructor for its
// type and indexed by namespace, as a SharedInformerFactory builds them.
//
// A SharedInformerFactory is not used: its ForResource method makes the
// factory reach an informer and a lister for every resource of every API
// group, and since the binary looks methods up by name (cobra's templates),
// the linker keeps every exported method of the factory. They made every
// kubetask process larger: the binary was 104 MB instead of 90 MB, and
// `kubetask run` peaked 2.6 MiB higher (docs/benchmarks.md).
// cmd/kubetask's TestLinksNoUnreachedCode keeps the factory out.
type nodeInformers struct {
	pods       podInformer
	configMaps configMapInformer
	secrets    secretInformer
	services   serviceInformer

	wg sync.WaitGroup
}

func newNodeInformers(client kubernetes.Interface, nodeName string) *nodeInformers {
	byNS := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	const noResync = time.Duration(0)
	onNode := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
	}
	return &nodeInformers{
		pods:       podInformer{corev1informers.NewFilteredPodInformer(client, metav1.NamespaceAll, noResync, byNS, onNode)},
		configMaps: configMapInformer{corev1informers.NewConfigMapInformer(client, metav1.NamespaceAll, noResync, byNS)},
		secrets:    secretInformer{corev1informers.NewSecretInformer(client, metav1.NamespaceAll, noResync, byNS)},
		services:   serviceInformer{corev1informers.NewServiceInformer(client, metav1.NamespaceAll, noResync, byNS)},
	}
}

// start runs every informer until ctx ends; wait waits for them to stop.
func (n *nodeInformers) start(ctx context.Context) {
	for _, inf := range []cache.SharedIndexInformer{n.pods.inf, n.configMaps.inf, n.secrets.inf, n.services.inf} {
		n.wg.Go(func() { inf.RunWithContext(ctx) })
	}
}

func (n *nodeInformers) wait() { n.wg.Wait() }

// The informer types of corev1informers, over one informer each.
type (
	podInformer       struct{ inf cache.SharedIndexInformer }
	configMapInformer struct{ inf cache.SharedIndexInformer }
	secretInformer    struct{ inf cache.SharedIndexInformer }
	serviceInformer   struct{ inf cache.SharedIndexInformer }
)

var (
	_ corev1informers.PodInformer       = podInformer{}
	_ corev1informers.ConfigMapInformer = configMapInformer{}
	_ corev1informers.SecretInformer    = secretInformer{}
	_ corev1informers.ServiceInformer   = serviceInformer{}
)

func (i podInformer) Informer() cache.SharedIndexInformer { return i.inf }
func (i podInformer) Lister() corev1listers.PodLister {
	return corev1listers.NewPodLister(i.inf.GetIndexer())
}

func (i configMapInformer) Informer() cache.SharedIndexInformer { return i.inf }
func (i configMapInformer) Lister() corev1listers.ConfigMapLister {
	return corev1listers.NewConfigMapLister(i.inf.GetIndexer())
}

func (i secretInformer) Informer() cache.SharedIndexInformer { return i.inf }
func (i secretInformer) Lister() corev1listers.SecretLister {
	return corev1listers.NewSecretLister(i.inf.GetIndexer())
}

func (i serviceInformer) Informer() cache.SharedIndexInformer { return i.inf }
func (i serviceInformer) Lister() corev1listers.ServiceLister {
	return corev1listers.NewServiceLister(i.inf.GetIndexer())
}
