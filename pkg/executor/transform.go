package executor

import (
	corev1 "k8s.io/api/core/v1"
)

// trimPod is the informer transform: it keeps only what podstate, the
// finalizer logic and result reading need, so a cached pod costs a fraction
// of the full object (managedFields alone are a quarter to a third of it).
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	trimInPlace(pod)
	return pod, nil
}

// trimPodCopy returns a trimmed copy of a pod read from the API server.
func trimPodCopy(pod *corev1.Pod) *corev1.Pod {
	p := pod.DeepCopy()
	trimInPlace(p)
	return p
}

func trimInPlace(pod *corev1.Pod) {
	pod.ManagedFields = nil
	pod.Spec.Volumes = nil
	pod.Spec.Tolerations = nil
	pod.Spec.Affinity = nil
	pod.Spec.NodeSelector = nil
	pod.Spec.SecurityContext = nil
	pod.Spec.TopologySpreadConstraints = nil
	pod.Spec.ImagePullSecrets = nil
	pod.Spec.Containers = trimContainers(pod.Spec.Containers)
	pod.Spec.InitContainers = trimContainers(pod.Spec.InitContainers)
	pod.Spec.EphemeralContainers = nil
	for k := range pod.Annotations {
		if k == corev1.LastAppliedConfigAnnotation {
			delete(pod.Annotations, k)
		}
	}
}

// trimContainers keeps each container's identity, image, restart policy and
// termination-message settings.
func trimContainers(cs []corev1.Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{
			Name:                     c.Name,
			Image:                    c.Image,
			RestartPolicy:            c.RestartPolicy,
			TerminationMessagePath:   c.TerminationMessagePath,
			TerminationMessagePolicy: c.TerminationMessagePolicy,
		}
	}
	return out
}
