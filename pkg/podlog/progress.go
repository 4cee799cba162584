package podlog

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// ProgressOf computes the Progress of container name (regular or init) from
// pod as last seen; a nil pod is Gone. NeverRestarts is read from the spec.
// A container terminated for good is one whose pod has a final phase or is
// being deleted with grace period 0 (a forced deletion, or the kubelet's own
// once it stopped every container: its status may still say Running, and
// nothing will report otherwise), or that exited and either will not be
// restarted or whose pod is being deleted: container restart rules first,
// then the container's restart policy, then the pod's (init containers are
// restarted only after a failure).
func ProgressOf(pod *corev1.Pod, name string) Progress {
	if pod == nil {
		return Progress{Gone: true}
	}
	final := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed ||
		pod.DeletionTimestamp != nil && pod.DeletionGracePeriodSeconds != nil && *pod.DeletionGracePeriodSeconds == 0
	p := Progress{Terminated: final, NeverRestarts: neverRestarts(pod, name)}
	st := findStatus(pod, name)
	if st == nil {
		return p
	}
	p.RestartCount = st.RestartCount
	p.Started = st.State.Running != nil || st.State.Terminated != nil || st.LastTerminationState.Terminated != nil
	if t := st.State.Terminated; t != nil && !final {
		p.Terminated = pod.DeletionTimestamp != nil || !restarts(pod, name, t.ExitCode)
	}
	return p
}

func findStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// restarts reports whether the kubelet restarts container name after it exited
// with code.
func restarts(pod *corev1.Pod, name string, code int32) bool {
	c, init := findContainer(pod, name)
	policy := pod.Spec.RestartPolicy
	if c != nil {
		for _, r := range c.RestartPolicyRules {
			if r.ExitCodes == nil {
				continue
			}
			in := slices.Contains(r.ExitCodes.Values, code)
			if (r.ExitCodes.Operator == corev1.ContainerRestartRuleOnExitCodesOpIn) == in {
				return r.Action == corev1.ContainerRestartRuleActionRestart
			}
		}
		if c.RestartPolicy != nil {
			policy = corev1.RestartPolicy(*c.RestartPolicy)
		} else if init && policy == corev1.RestartPolicyAlways {
			policy = corev1.RestartPolicyOnFailure
		}
	}
	switch policy {
	case corev1.RestartPolicyAlways:
		return true
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return false
}

// neverRestarts reports whether the kubelet never restarts container name,
// whatever its exit: it has no restart rules, and its restart policy (or,
// without one, the pod's) is Never.
func neverRestarts(pod *corev1.Pod, name string) bool {
	c, _ := findContainer(pod, name)
	if c == nil || len(c.RestartPolicyRules) > 0 {
		return false
	}
	if c.RestartPolicy != nil {
		return corev1.RestartPolicy(*c.RestartPolicy) == corev1.RestartPolicyNever
	}
	return pod.Spec.RestartPolicy == corev1.RestartPolicyNever
}

func findContainer(pod *corev1.Pod, name string) (c *corev1.Container, init bool) {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i], false
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i], true
		}
	}
	return nil, false
}
