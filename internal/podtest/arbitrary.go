package podtest

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/pkg/podstate"
)

// Arbitrary builds an arbitrary pod (and policy and time) from fuzzer bytes:
// equal bytes give equal pods, and every byte sequence gives one (nil for a
// pod that is gone). Containers are named "base" (usually the main one),
// "s0", "s1" (regular sidecars), "i0", "i1" (init containers or native
// sidecars). Once the bytes run out every choice is its first option, so a
// choice added at the end, whose first option changes nothing, leaves the
// pods of existing seed corpora as they were.
func Arbitrary(data []byte) (*corev1.Pod, podstate.Policy, time.Time) {
	g := &gen{b: data}
	if g.pick(16) == 0 {
		return nil, podstate.Policy{MainContainer: "base"}, g.at()
	}
	pod := MakePod("p", "ns").Obj()
	pod.Spec.RestartPolicy = pickOf(g, corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure, corev1.RestartPolicyAlways, "")
	names := pickOf(g, []string{"base"}, []string{"base", "s0"}, []string{"s0", "base", "s1"}, []string{"s0", "s1"}, []string{}, []string{"s0"})
	for _, n := range names {
		c := corev1.Container{Name: n, Image: "img/" + n}
		if g.pick(8) == 0 {
			c.RestartPolicy = ptr(pickOf(g, corev1.ContainerRestartPolicyNever, corev1.ContainerRestartPolicyOnFailure, corev1.ContainerRestartPolicyAlways))
		}
		if g.pick(8) == 0 {
			c.RestartPolicyRules = []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart,
				ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{
					Operator: pickOf(g, corev1.ContainerRestartRuleOnExitCodesOpIn, corev1.ContainerRestartRuleOnExitCodesOpNotIn),
					Values:   []int32{pickOf[int32](g, 0, 1, 137)}}}}
		}
		pod.Spec.Containers = append(pod.Spec.Containers, c)
		if g.pick(6) != 0 {
			pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, g.status(n))
		}
	}
	for i := range g.pick(3) {
		n := pickOf(g, "i0", "i1")
		if i == 1 {
			n = "i1"
		}
		c := corev1.Container{Name: n, Image: "img/" + n}
		if g.pick(2) == 0 {
			c.RestartPolicy = ptr(corev1.ContainerRestartPolicyAlways)
		}
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, c)
		if g.pick(4) != 0 {
			pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, g.status(n))
		}
	}
	pod.Status.Phase = pickOf(g, corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed, corev1.PodUnknown, "")
	pod.Status.Reason = pickOf(g, "", "", "Evicted", "DeadlineExceeded", "Terminated", "Shutdown", "NodeLost", "OutOfcpu")
	if g.pick(2) == 0 {
		pod.Spec.NodeName = NodeName
	}
	if t := g.at(); !t.IsZero() {
		pod.Status.StartTime = &metav1.Time{Time: t}
	}
	switch g.pick(4) {
	case 1:
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled,
			Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(g.at())})
	case 2:
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled,
			Status: corev1.ConditionFalse, Reason: pickOf(g, "Unschedulable", "SchedulingGated", "SchedulerError")})
	}
	if g.pick(3) == 0 {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget,
			Status: pickOf(g, corev1.ConditionTrue, corev1.ConditionFalse),
			Reason: pickOf(g, "PreemptionByScheduler", "DeletionByTaintManager", "EvictionByEvictionAPI",
				"DeletionByPodGC", "TerminationByKubelet", "Other"),
			LastTransitionTime: metav1.NewTime(g.at())})
	}
	if g.pick(4) == 0 {
		pod.Spec.ActiveDeadlineSeconds = ptr(pickOf[int64](g, 1, 60, 3600, -5, 1<<62))
	}
	if g.pick(4) == 0 {
		t := metav1.NewTime(g.at())
		pod.DeletionTimestamp = &t
		pod.DeletionGracePeriodSeconds = ptr(pickOf[int64](g, 0, 30, -1))
	}
	if g.pick(6) == 0 {
		pod.CreationTimestamp = metav1.Time{}
	}
	p := podstate.Policy{
		MainContainer:    pickOf(g, "base", "base", "", "missing"),
		ScheduleTimeout:  pickOf(g, 0, 10*time.Minute),
		StartupTimeout:   pickOf(g, 0, 10*time.Minute),
		RunTimeout:       pickOf(g, 0, time.Hour),
		ImagePullGrace:   pickOf(g, 0, 3*time.Minute),
		ConfigErrorGrace: pickOf(g, 0, time.Minute),
	}
	if g.pick(4) == 0 {
		p.CancelledAt = g.at()
	}
	now := g.at()

	// Choices added later: the first option of each keeps the pod (and
	// policy) as the choices above made it.
	if g.pick(3) == 1 {
		pod.Status.Message = "The node was low on resource: memory.\nsecond line"
	}
	for i := range pod.Status.Conditions {
		if g.pick(3) == 1 {
			pod.Status.Conditions[i].Message = "0/3 nodes are available: 3 Insufficient cpu."
		}
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for i := range list {
			for _, s := range []*corev1.ContainerState{&list[i].State, &list[i].LastTerminationState} {
				if t := s.Terminated; t != nil && g.pick(3) == 1 {
					t.Message = `{"result":42}`
				}
			}
		}
	}
	if g.pick(3) == 1 {
		pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/queue"}, {Name: "example.com/quota"}}
	}
	if g.pick(4) == 1 {
		p.UngatedAt = g.at()
	}
	return pod, p, now
}

// gen turns fuzzer bytes into choices; once the bytes run out every choice is 0.
type gen struct{ b []byte }

func (g *gen) pick(n int) int {
	if len(g.b) == 0 || n <= 1 {
		return 0
	}
	v := int(g.b[0]) % n
	g.b = g.b[1:]
	return v
}

func pickOf[T any](g *gen, opts ...T) T { return opts[g.pick(len(opts))] }

// at returns a time near T0, or the zero time (a field the status left out).
func (g *gen) at() time.Time {
	if g.pick(8) == 0 {
		return time.Time{}
	}
	return T0.Add(time.Duration(g.pick(240)) * 30 * time.Second)
}

func (g *gen) state() corev1.ContainerState {
	switch g.pick(4) {
	case 1:
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: pickOf(g,
			"ContainerCreating", "PodInitializing", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
			"ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
			"CrashLoopBackOff", ""), Message: pickOf(g, "", "boom\nsecond line")}}
	case 2:
		return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(g.at())}}
	case 3:
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode:   pickOf[int32](g, 0, 1, 2, 128, 137, 143, -1),
			Reason:     pickOf(g, "Completed", "Error", "OOMKilled", "ContainerStatusUnknown", "StartError", ""),
			StartedAt:  metav1.NewTime(g.at()),
			FinishedAt: metav1.NewTime(g.at()),
		}}
	}
	return corev1.ContainerState{}
}

func (g *gen) status(name string) corev1.ContainerStatus {
	st := corev1.ContainerStatus{Name: name, State: g.state(), RestartCount: int32(g.pick(3))}
	if g.pick(3) == 0 {
		st.LastTerminationState = g.state()
	}
	return st
}
