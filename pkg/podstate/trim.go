package podstate

import (
	corev1 "k8s.io/api/core/v1"
)

// Trim removes from pod, in place, what neither Derive nor kubetask's handling
// of a decided pod reads, so that a cached pod costs a fraction of the full
// object (managedFields alone are a quarter to a third of it). Its guarantee,
// checked by FuzzDerive: Derive(Trim(p)) equals Derive(p) for every pod p.
// Use it as an informer transform (SetTransform) or on a copy.
func Trim(pod *corev1.Pod) {
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
	delete(pod.Annotations, corev1.LastAppliedConfigAnnotation)
}

// trimContainers keeps each container's identity, image, restart policy and
// rules (they decide whether a terminated container comes back) and
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
			RestartPolicyRules:       c.RestartPolicyRules,
			TerminationMessagePath:   c.TerminationMessagePath,
			TerminationMessagePolicy: c.TerminationMessagePolicy,
		}
	}
	return out
}
