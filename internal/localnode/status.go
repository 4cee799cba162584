package localnode

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons and messages the kubelet uses.
const (
	reasonDeadlineExceeded   = "DeadlineExceeded"
	messageDeadlineExceeded  = "Pod was active on the node longer than the specified deadline"
	reasonStatusUnknown      = "ContainerStatusUnknown"
	messageStatusUnknown     = "The container could not be located when the pod was terminated"
	messageLost              = "The kubetask local node restarted and lost this pod's processes"
	reasonPodCompleted       = "PodCompleted"
	reasonNotInitialized     = "ContainersNotInitialized"
	reasonContainersNotReady = "ContainersNotReady"
)

// status computes the pod status the kubelet would report. Called with w.mu held.
func (w *podWorker) status(now time.Time) corev1.PodStatus {
	s := *w.pod.Status.DeepCopy() // keeps PodScheduled, qosClass and others' conditions
	if w.lost {
		return w.lostStatus(s, now)
	}
	s.HostIP = "127.0.0.1"
	s.HostIPs = []corev1.HostIP{{IP: "127.0.0.1"}}
	// No address until the pod's network is chosen (as the kubelet before the
	// pod's sandbox exists): then its own, or the node's.
	s.PodIP, s.PodIPs = "", nil
	if w.netDecided {
		s.PodIP, s.PodIPs = w.pod.Status.PodIP, slices.Clone(w.pod.Status.PodIPs)
	}
	start := w.startTime
	s.StartTime = &start
	s.ObservedGeneration = w.pod.Generation
	s.InitContainerStatuses = nil
	for _, c := range w.inits {
		s.InitContainerStatuses = append(s.InitContainerStatuses, w.containerStatus(c))
	}
	s.ContainerStatuses = nil
	for _, c := range w.regulars {
		s.ContainerStatuses = append(s.ContainerStatuses, w.containerStatus(c))
	}
	sort.Slice(s.ContainerStatuses, func(i, j int) bool { return s.ContainerStatuses[i].Name < s.ContainerStatuses[j].Name })
	s.Phase = w.phase()
	s.Reason, s.Message = "", ""
	if w.finished && w.terminating == termDeadline {
		s.Reason, s.Message = reasonDeadlineExceeded, messageDeadlineExceeded
	}
	terminal := s.Phase == corev1.PodSucceeded || s.Phase == corev1.PodFailed

	var incomplete, unready []string
	for _, c := range w.inits {
		switch c.kind {
		case sidecarKind:
			if !c.everRan {
				incomplete = append(incomplete, c.spec.Name)
			}
			if !c.isReady() {
				unready = append(unready, c.spec.Name)
			}
		default:
			if c.term == nil || c.term.ExitCode != 0 {
				if !w.initDone {
					incomplete = append(incomplete, c.spec.Name)
				}
			}
		}
	}
	for _, c := range w.regulars {
		if !c.isReady() {
			unready = append(unready, c.spec.Name)
		}
	}
	sandbox := corev1.ConditionTrue
	if w.finished {
		sandbox = corev1.ConditionFalse
	}
	w.setCond(&s, corev1.PodReadyToStartContainers, sandbox, "", "", now)
	if w.initDone {
		w.setCond(&s, corev1.PodInitialized, corev1.ConditionTrue, "", "", now)
	} else {
		w.setCond(&s, corev1.PodInitialized, corev1.ConditionFalse, reasonNotInitialized, listMessage("containers with incomplete status", incomplete), now)
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady} {
		switch {
		case terminal:
			w.setCond(&s, t, corev1.ConditionFalse, reasonPodCompleted, "", now)
		case len(unready) == 0:
			w.setCond(&s, t, corev1.ConditionTrue, "", "", now)
		default:
			w.setCond(&s, t, corev1.ConditionFalse, reasonContainersNotReady, listMessage("containers with unready status", unready), now)
		}
	}
	return s
}

func listMessage(prefix string, names []string) string {
	return fmt.Sprintf("%s: [%s]", prefix, strings.Join(names, " "))
}

// setCond sets a condition, keeping its transition time while its status holds.
func (w *podWorker) setCond(s *corev1.PodStatus, t corev1.PodConditionType, status corev1.ConditionStatus, reason, msg string, now time.Time) {
	c := corev1.PodCondition{Type: t, Status: status, Reason: reason, Message: msg, ObservedGeneration: w.pod.Generation}
	if prev, ok := w.conds[t]; ok && prev.Status == status {
		c.LastTransitionTime = prev.LastTransitionTime
	} else {
		c.LastTransitionTime = metav1.NewTime(now)
	}
	w.conds[t] = c
	for i := range s.Conditions {
		if s.Conditions[i].Type == t {
			s.Conditions[i] = c
			return
		}
	}
	s.Conditions = append(s.Conditions, c)
}

func (w *podWorker) containerStatus(c *ctr) corev1.ContainerStatus {
	cs := corev1.ContainerStatus{Name: c.spec.Name, Image: c.spec.Image, ImageID: c.imageID, RestartCount: c.restartCount}
	started := false
	switch {
	case c.waiting != nil:
		cs.State.Waiting = c.waiting.DeepCopy()
	case c.running():
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.proc.StartedAt())}
		cs.ContainerID = c.curID
		cs.Ready = c.kind != initKind && c.isReady()
		started = true
	case c.term != nil:
		cs.State.Terminated = c.term.DeepCopy()
		cs.ContainerID = c.term.ContainerID
	default:
		reason := "ContainerCreating"
		if c.kind == regularKind && !w.initDone || c.kind != regularKind && !w.initDone && w.volumeErr == "" {
			reason = "PodInitializing"
		}
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: w.volumeErr}
	}
	switch {
	case c.waiting != nil && c.term != nil:
		cs.LastTerminationState.Terminated = c.term.DeepCopy()
	case c.last != nil:
		cs.LastTerminationState.Terminated = c.last.DeepCopy()
	}
	cs.Started = &started
	return cs
}

// phase is the kubelet's pod phase, except that a terminal phase is reported only
// once every process of the pod has stopped: after that virtual-kubelet sends no
// further status, and the final container states must be in it.
func (w *podWorker) phase() corev1.PodPhase {
	if w.finished {
		if w.terminating == termDeadline || w.terminating == termInitFailed {
			return corev1.PodFailed
		}
		for _, c := range w.regulars {
			if c.term == nil || c.waiting != nil || c.term.ExitCode != 0 {
				return corev1.PodFailed
			}
		}
		return corev1.PodSucceeded
	}
	if !w.initDone {
		return corev1.PodPending
	}
	var running, waiting, stopped int
	for _, c := range w.regulars {
		switch {
		case c.running():
			running++
		case c.term != nil || c.last != nil:
			stopped++
		default:
			waiting++
		}
	}
	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0, stopped > 0:
		return corev1.PodRunning
	default:
		return corev1.PodPending
	}
}

// lostStatus reports a pod whose processes died with an earlier instance of the node:
// Failed, with every unfinished container terminated as ContainerStatusUnknown (137).
func (w *podWorker) lostStatus(s corev1.PodStatus, now time.Time) corev1.PodStatus {
	fix := func(statuses []corev1.ContainerStatus) {
		for i := range statuses {
			cs := &statuses[i]
			if cs.State.Terminated != nil {
				continue
			}
			if cs.State.Running != nil {
				cs.LastTerminationState = corev1.ContainerState{}
			}
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode:   137,
				Reason:     reasonStatusUnknown,
				Message:    messageStatusUnknown,
				FinishedAt: metav1.NewTime(now),
			}}
			cs.Ready = false
			f := false
			cs.Started = &f
		}
	}
	fix(s.InitContainerStatuses)
	fix(s.ContainerStatuses)
	s.Phase = corev1.PodFailed
	s.Message = messageLost
	for _, t := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady} {
		w.setCond(&s, t, corev1.ConditionFalse, reasonPodCompleted, "", now)
	}
	w.setCond(&s, corev1.PodReadyToStartContainers, corev1.ConditionFalse, "", "", now)
	return s
}
