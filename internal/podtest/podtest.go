// Package podtest builds pods for tests, with statuses shaped like the ones a real
// kubelet, scheduler and control plane report.
//
//	podtest.MakePod("p", "ns").Scheduled().
//		Main("base").Running().
//		Sidecar("envoy").Running().
//		After(time.Minute).On("base").Terminated(0).
//		Obj()
//
// The builder keeps a clock, starting at T0 when the pod is created; After moves it
// forward and every event is stamped with it. Container methods act on the container
// added (or selected with On) last. Obj returns a deep copy, so a builder can be reused.
package podtest

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// T0 is the creation time of every pod built by MakePod.
var T0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// NodeName is the node Scheduled binds pods to.
const NodeName = "node-1"

// PodWrapper builds a pod. Create it with MakePod.
type PodWrapper struct {
	pod    corev1.Pod
	now    time.Time
	cursor string
	init   bool
}

// MakePod returns a builder for a pending, unscheduled pod created at T0 with
// restartPolicy Never and no containers.
func MakePod(name, namespace string) *PodWrapper {
	return &PodWrapper{
		now: T0,
		pod: corev1.Pod{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: namespace,
				UID:               types.UID("uid-" + name),
				CreationTimestamp: metav1.NewTime(T0),
			},
			Spec:   corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever},
			Status: corev1.PodStatus{Phase: corev1.PodPending},
		},
	}
}

// Obj returns a deep copy of the pod built so far.
func (w *PodWrapper) Obj() *corev1.Pod { return w.pod.DeepCopy() }

// Now returns the builder's clock.
func (w *PodWrapper) Now() time.Time { return w.now }

// After moves the builder's clock forward by d.
func (w *PodWrapper) After(d time.Duration) *PodWrapper { w.now = w.now.Add(d); return w }

// --- pod level ---

// RestartPolicy sets spec.restartPolicy.
func (w *PodWrapper) RestartPolicy(p corev1.RestartPolicy) *PodWrapper {
	w.pod.Spec.RestartPolicy = p
	return w
}

// ActiveDeadlineSeconds sets spec.activeDeadlineSeconds.
func (w *PodWrapper) ActiveDeadlineSeconds(s int64) *PodWrapper {
	w.pod.Spec.ActiveDeadlineSeconds = &s
	return w
}

// Phase sets status.phase.
func (w *PodWrapper) Phase(p corev1.PodPhase) *PodWrapper { w.pod.Status.Phase = p; return w }

// Reason sets status.reason and status.message, as the kubelet does for Evicted,
// DeadlineExceeded or an admission rejection.
func (w *PodWrapper) Reason(reason, message string) *PodWrapper {
	w.pod.Status.Reason, w.pod.Status.Message = reason, message
	return w
}

// Unschedulable records the scheduler's verdict that no node fits.
func (w *PodWrapper) Unschedulable(message string) *PodWrapper {
	return w.condition(corev1.PodScheduled, corev1.ConditionFalse, corev1.PodReasonUnschedulable, message)
}

// SchedulingGated records that the pod waits for its scheduling gates.
func (w *PodWrapper) SchedulingGated() *PodWrapper {
	w.pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/queue"}}
	return w.condition(corev1.PodScheduled, corev1.ConditionFalse, corev1.PodReasonSchedulingGated,
		"Scheduling is blocked due to non-empty scheduling gates")
}

// Ungated removes the scheduling gates (a queue admitted the pod); like the API
// server, it leaves the SchedulingGated condition for the scheduler to update.
func (w *PodWrapper) Ungated() *PodWrapper {
	w.pod.Spec.SchedulingGates = nil
	return w
}

// Scheduled binds the pod to NodeName now and, like the kubelet, sets status.startTime,
// the PodScheduled condition and every container waiting (ContainerCreating or
// PodInitializing).
func (w *PodWrapper) Scheduled() *PodWrapper {
	w.pod.Spec.NodeName = NodeName
	w.condition(corev1.PodScheduled, corev1.ConditionTrue, "", "")
	t := metav1.NewTime(w.now)
	w.pod.Status.StartTime = &t
	w.pod.Status.HostIP = "10.0.0.1"
	w.pod.Status.PodIP = "10.244.0.10"
	return w
}

// DisruptionTarget adds the DisruptionTarget condition with reason (for example
// PreemptionByScheduler, DeletionByTaintManager, EvictionByEvictionAPI,
// DeletionByPodGC, TerminationByKubelet).
func (w *PodWrapper) DisruptionTarget(reason, message string) *PodWrapper {
	return w.condition(corev1.DisruptionTarget, corev1.ConditionTrue, reason, message)
}

// Deleted marks the pod as being deleted now with the given grace period, as the API
// server does: deletionTimestamp = now + grace.
func (w *PodWrapper) Deleted(grace time.Duration) *PodWrapper {
	t := metav1.NewTime(w.now.Add(grace))
	g := int64(grace / time.Second)
	w.pod.DeletionTimestamp, w.pod.DeletionGracePeriodSeconds = &t, &g
	return w
}

// Annotation sets an annotation.
func (w *PodWrapper) Annotation(k, v string) *PodWrapper {
	if w.pod.Annotations == nil {
		w.pod.Annotations = map[string]string{}
	}
	w.pod.Annotations[k] = v
	return w
}

func (w *PodWrapper) condition(t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string) *PodWrapper {
	c := corev1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg,
		LastTransitionTime: metav1.NewTime(w.now)}
	for i := range w.pod.Status.Conditions {
		if w.pod.Status.Conditions[i].Type == t {
			w.pod.Status.Conditions[i] = c
			return w
		}
	}
	w.pod.Status.Conditions = append(w.pod.Status.Conditions, c)
	return w
}

// --- containers ---

// Main adds a regular container (the task's main one, by convention) and selects it.
func (w *PodWrapper) Main(name string) *PodWrapper { return w.Container(name) }

// Sidecar adds a regular container that runs beside the main one (an envoy-like proxy)
// and selects it.
func (w *PodWrapper) Sidecar(name string) *PodWrapper { return w.Container(name) }

// Container adds a regular container, waiting in ContainerCreating, and selects it.
func (w *PodWrapper) Container(name string) *PodWrapper {
	w.pod.Spec.Containers = append(w.pod.Spec.Containers, corev1.Container{
		Name: name, Image: "registry.example/" + name + ":1",
	})
	reason := "ContainerCreating"
	if len(w.pod.Spec.InitContainers) > 0 {
		reason = "PodInitializing"
	}
	w.pod.Status.ContainerStatuses = append(w.pod.Status.ContainerStatuses, corev1.ContainerStatus{
		Name: name, Image: "registry.example/" + name + ":1",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}},
	})
	w.cursor, w.init = name, false
	return w
}

// Init adds a classic init container, waiting in PodInitializing, and selects it.
func (w *PodWrapper) Init(name string) *PodWrapper { return w.addInit(name, nil) }

// NativeSidecar adds an init container with restartPolicy Always (a Kubernetes native
// sidecar), waiting in PodInitializing, and selects it.
func (w *PodWrapper) NativeSidecar(name string) *PodWrapper {
	always := corev1.ContainerRestartPolicyAlways
	return w.addInit(name, &always)
}

func (w *PodWrapper) addInit(name string, rp *corev1.ContainerRestartPolicy) *PodWrapper {
	w.pod.Spec.InitContainers = append(w.pod.Spec.InitContainers, corev1.Container{
		Name: name, Image: "registry.example/" + name + ":1", RestartPolicy: rp,
	})
	w.pod.Status.InitContainerStatuses = append(w.pod.Status.InitContainerStatuses, corev1.ContainerStatus{
		Name: name, Image: "registry.example/" + name + ":1",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}},
	})
	for i := range w.pod.Status.ContainerStatuses {
		if s := &w.pod.Status.ContainerStatuses[i]; s.State.Waiting != nil && s.State.Waiting.Reason == "ContainerCreating" {
			s.State.Waiting.Reason = "PodInitializing"
		}
	}
	w.cursor, w.init = name, true
	return w
}

// On selects an existing container (regular first, then init) for the next
// container-state calls.
func (w *PodWrapper) On(name string) *PodWrapper {
	for _, c := range w.pod.Spec.Containers {
		if c.Name == name {
			w.cursor, w.init = name, false
			return w
		}
	}
	for _, c := range w.pod.Spec.InitContainers {
		if c.Name == name {
			w.cursor, w.init = name, true
			return w
		}
	}
	panic(fmt.Sprintf("podtest: no container %q", name))
}

// Image sets the selected container's image, in spec and status.
func (w *PodWrapper) Image(image string) *PodWrapper {
	w.spec().Image = image
	w.status().Image = image
	return w
}

// ContainerRestartPolicy sets the selected container's own restartPolicy.
func (w *PodWrapper) ContainerRestartPolicy(p corev1.ContainerRestartPolicy) *PodWrapper {
	w.spec().RestartPolicy = &p
	return w
}

// RestartRule adds a restart rule to the selected container: restart on these exit codes.
func (w *PodWrapper) RestartRule(codes ...int32) *PodWrapper {
	c := w.spec()
	c.RestartPolicyRules = append(c.RestartPolicyRules, corev1.ContainerRestartRule{
		Action: corev1.ContainerRestartRuleActionRestart,
		ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{
			Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: codes,
		},
	})
	return w
}

// Waiting puts the selected container in state waiting with reason (ErrImagePull,
// ImagePullBackOff, InvalidImageName, CreateContainerConfigError, CrashLoopBackOff ...).
func (w *PodWrapper) Waiting(reason, message string) *PodWrapper {
	s := w.status()
	s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}
	s.Ready, s.Started = false, ptr(false)
	return w
}

// Running starts the selected container now.
func (w *PodWrapper) Running() *PodWrapper {
	s := w.status()
	s.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(w.now)}}
	s.Ready, s.Started = true, ptr(true)
	s.ImageID = "registry.example/" + s.Name + "@sha256:0123"
	s.ContainerID = fmt.Sprintf("containerd://%s-%d", s.Name, s.RestartCount)
	return w
}

// Terminated ends the selected container now with code, with the reason the kubelet
// reports (Completed for 0, Error otherwise). A container that was not running is
// considered to have started now.
func (w *PodWrapper) Terminated(code int32) *PodWrapper {
	reason := "Error"
	if code == 0 {
		reason = "Completed"
	}
	return w.TerminatedReason(code, reason, "")
}

// OOMKilled ends the selected container now as the kubelet reports a memory-limit kill.
func (w *PodWrapper) OOMKilled() *PodWrapper { return w.TerminatedReason(137, "OOMKilled", "") }

// TerminatedReason ends the selected container now with an explicit reason and message
// (ContainerStatusUnknown, StartError, OOMKilled, ...).
func (w *PodWrapper) TerminatedReason(code int32, reason, message string) *PodWrapper {
	s := w.status()
	started := w.now
	if s.State.Running != nil {
		started = s.State.Running.StartedAt.Time
	}
	if s.ContainerID == "" {
		s.ContainerID = fmt.Sprintf("containerd://%s-%d", s.Name, s.RestartCount)
	}
	s.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Reason: reason, Message: message,
		StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(w.now),
		ContainerID: s.ContainerID,
	}}
	s.Ready, s.Started = false, ptr(false)
	return w
}

// Restarted records that the kubelet restarted the selected container after it ended:
// the current (terminated) state becomes lastState, the restart count grows, and the
// container waits in CrashLoopBackOff. Call Running to show the new run.
func (w *PodWrapper) Restarted() *PodWrapper {
	s := w.status()
	if s.State.Terminated != nil {
		s.LastTerminationState = corev1.ContainerState{Terminated: s.State.Terminated}
	}
	s.RestartCount++
	s.ContainerID = ""
	s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason:  "CrashLoopBackOff",
		Message: fmt.Sprintf("back-off 10s restarting failed container=%s", s.Name),
	}}
	s.Ready, s.Started = false, ptr(false)
	return w
}

func (w *PodWrapper) spec() *corev1.Container {
	list := w.pod.Spec.Containers
	if w.init {
		list = w.pod.Spec.InitContainers
	}
	for i := range list {
		if list[i].Name == w.cursor {
			return &list[i]
		}
	}
	panic("podtest: select a container first (Main, Sidecar, Init, NativeSidecar or On)")
}

func (w *PodWrapper) status() *corev1.ContainerStatus {
	list := w.pod.Status.ContainerStatuses
	if w.init {
		list = w.pod.Status.InitContainerStatuses
	}
	for i := range list {
		if list[i].Name == w.cursor {
			return &list[i]
		}
	}
	panic("podtest: select a container first (Main, Sidecar, Init, NativeSidecar or On)")
}

func ptr[T any](v T) *T { return &v }
