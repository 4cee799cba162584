package localnode

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// statusOnlyClient is the client handed to virtual-kubelet. The library
// writes pod status with UpdateStatus on its cached copy of the whole pod,
// and the pods/status endpoint stores that copy's metadata too: a finalizer a
// controller removed in the meantime (kubetask's, after recording an outcome)
// would come back and leave the pod stuck Terminating. Here UpdateStatus
// replaces only .status, as the kubelet's status manager does with a patch.
type statusOnlyClient struct{ kubernetes.Interface }

func (c statusOnlyClient) CoreV1() corev1client.CoreV1Interface {
	return statusOnlyCore{c.Interface.CoreV1()}
}

type statusOnlyCore struct{ corev1client.CoreV1Interface }

func (c statusOnlyCore) Pods(namespace string) corev1client.PodInterface {
	return statusOnlyPods{c.CoreV1Interface.Pods(namespace)}
}

type statusOnlyPods struct{ corev1client.PodInterface }

// UpdateStatus replaces the pod's status and nothing else.
func (p statusOnlyPods) UpdateStatus(ctx context.Context, pod *corev1.Pod, _ metav1.UpdateOptions) (*corev1.Pod, error) {
	patch, err := json.Marshal([]map[string]any{{"op": "replace", "path": "/status", "value": pod.Status}})
	if err != nil {
		return nil, fmt.Errorf("encoding status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return p.Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{}, "status")
}
