package podstate

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Disruption reasons the control plane writes into the pod's DisruptionTarget condition.
// Not all of them have constants in k8s.io/api.
const (
	disruptionPreemptionByScheduler = "PreemptionByScheduler"
	disruptionDeletionByTaintMgr    = "DeletionByTaintManager"
	disruptionEvictionByAPI         = "EvictionByEvictionAPI"
	disruptionDeletionByPodGC       = "DeletionByPodGC"
	disruptionTerminationByKubelet  = "TerminationByKubelet"
)

// Derive returns the state of a task whose pod is pod (nil: the pod no longer exists)
// under policy p at time now.
//
// Derive is total: it accepts any pod, including inconsistent statuses, and never
// panics. Its guarantees:
//   - Succeeded (reason Completed) only when the main container terminated with exit
//     code 0 and will not be restarted; ExitCode then points at that 0.
//   - The statuses of regular containers other than the main one never change Phase,
//     Reason, ExitCode or Retryable; they only matter for StopPod.
//   - A pod with a single container and restartPolicy Never ends Succeeded or Failed
//     exactly when its pod phase says so (sooner, if the kubelet is slow to report).
//   - A main container that finished before a pod-level kill (deletion, eviction,
//     preemption, activeDeadlineSeconds, cancellation) keeps its own outcome; one that
//     was killed by it gets the kill's reason.
//   - Retryable is true only for Failed states with an infrastructure reason.
func Derive(pod *corev1.Pod, p Policy, now time.Time) State {
	d := &deriver{pod: pod, p: p, now: now}
	s := d.derive()
	s.Retryable = s.Phase == Failed && s.Reason.Retryable()
	if s.Phase.Terminal() {
		s.StopPod = d.mustStop()
		s.Recheck = time.Time{}
		s.Timed = d.timed
	} else {
		s.Recheck = d.recheck
	}
	return s
}

// Stopped reports whether no container of pod runs any more, as far as the
// control plane knows: the pod is gone (nil), was never bound to a node, has a
// final phase, or is being deleted and either with grace period 0 (what the
// kubelet does once it stopped every container, and what a forced deletion or
// the pod garbage collector does for a node that is gone) or with every
// regular container reported terminated and no init container running. A pod
// merely being deleted with a grace period, or on a node that stopped
// reporting, may still run. This is the Job controller's rule for replacing a
// pod (podReplacementPolicy: Failed): no new attempt while the old one may run.
func Stopped(pod *corev1.Pod) bool {
	if pod == nil || pod.Spec.NodeName == "" ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return true
	}
	if pod.DeletionTimestamp == nil {
		return false
	}
	if g := pod.DeletionGracePeriodSeconds; g != nil && *g == 0 {
		return true
	}
	for i := range pod.Spec.Containers {
		st := findStatus(pod.Status.ContainerStatuses, pod.Spec.Containers[i].Name)
		if st == nil || st.State.Terminated == nil {
			return false
		}
	}
	for _, st := range pod.Status.InitContainerStatuses {
		if st.State.Running != nil {
			return false
		}
	}
	return len(pod.Spec.Containers) > 0
}

// DefaultMainContainer returns the main container of spec when the task does not name
// one: the only regular container, else the one named "base" or "main"; "" when there
// is no such container.
func DefaultMainContainer(spec *corev1.PodSpec) string {
	if spec == nil {
		return ""
	}
	if len(spec.Containers) == 1 {
		return spec.Containers[0].Name
	}
	for _, name := range []string{"base", "main"} {
		if findContainer(spec.Containers, name) != nil {
			return name
		}
	}
	return ""
}

// StopDeadlineSeconds returns a value for spec.activeDeadlineSeconds that makes the
// kubelet stop every container of pod at about now, while Derive keeps attributing the
// outcome to a main container that finished before now: the deadline it sets is
// strictly after now. The API server only lets the field be lowered, so the result is
// never above the pod's current value. ok is false when the pod has no start time yet
// (it is not on a node; delete it instead).
func StopDeadlineSeconds(pod *corev1.Pod, now time.Time) (seconds int64, ok bool) {
	if pod == nil || pod.Status.StartTime == nil || pod.Status.StartTime.IsZero() {
		return 0, false
	}
	elapsed := now.Sub(pod.Status.StartTime.Time)
	seconds = int64(elapsed/time.Second) + 1
	if seconds < 1 {
		seconds = 1
	}
	if cur := pod.Spec.ActiveDeadlineSeconds; cur != nil && *cur < seconds {
		seconds = *cur
	}
	return seconds, true
}

type deriver struct {
	pod     *corev1.Pod
	p       Policy
	now     time.Time
	recheck time.Time
	// signalExit is set while judging a main container whose exit code says a
	// signal ended it (above 128): only then can a deletion requested in the
	// same second as the exit (timestamps have second precision) have caused it.
	signalExit bool
	// timed is set when a deadline judged by the clock has passed.
	timed bool
}

// expired reports whether limit has passed since start, and otherwise remembers when it
// will. An unknown start never expires, except for a zero limit (no grace at all).
func (d *deriver) expired(start time.Time, limit time.Duration) bool {
	if start.IsZero() {
		return limit <= 0
	}
	deadline := start.Add(limit)
	if !d.now.Before(deadline) {
		d.timed = d.timed || limit > 0
		return true
	}
	if d.recheck.IsZero() || deadline.Before(d.recheck) {
		d.recheck = deadline
	}
	return false
}

func (d *deriver) derive() State {
	pod := d.pod
	if pod == nil {
		if !d.p.CancelledAt.IsZero() {
			return failed(ReasonCancelled, "the task was cancelled and its pod is gone")
		}
		return failed(ReasonDeletedExternally,
			"the pod no longer exists and the main container's outcome was never recorded (deleted by someone else or garbage-collected)")
	}
	name := d.p.MainContainer
	if name == "" {
		name = DefaultMainContainer(&pod.Spec)
	}
	mainSpec := findContainer(pod.Spec.Containers, name)
	if mainSpec == nil {
		if name == "" {
			return failed(ReasonConfigError, fmt.Sprintf(
				"cannot tell which container is the main one among %s: name it in spec.mainContainer",
				containerNames(pod.Spec.Containers)))
		}
		return failed(ReasonConfigError, fmt.Sprintf(
			"the pod has no regular container named %q (main container); containers are %s",
			name, containerNames(pod.Spec.Containers)))
	}
	st := findStatus(pod.Status.ContainerStatuses, name)

	if st != nil && st.State.Terminated != nil && !d.willRestart(mainSpec, st.State.Terminated.ExitCode) {
		return d.finished(name, st)
	}

	// The main container has not finished: anything that ends the pod ends the task.
	if s, ok := d.killed(time.Time{}); ok {
		return s
	}
	switch pod.Status.Phase {
	case corev1.PodFailed:
		if s, ok := d.initContainers(); ok && s.Phase == Failed {
			return s
		}
		return failed(ReasonPodFailed, fmt.Sprintf("the pod failed before main container %q finished%s",
			name, podCause(pod)))
	case corev1.PodSucceeded:
		return failed(ReasonPodFailed, fmt.Sprintf(
			"the pod reports phase Succeeded but main container %q has no termination record", name))
	}

	if st != nil && started(st) {
		if d.p.RunTimeout > 0 && d.expired(firstStart(st), d.p.RunTimeout) {
			return failed(ReasonRunTimeout, fmt.Sprintf(
				"main container %q has been running for longer than the run timeout (%s)", name, d.p.RunTimeout))
		}
		if st.State.Running != nil {
			return State{Phase: Running, Reason: ReasonRunning,
				Message: fmt.Sprintf("main container %q is running", name)}
		}
		return State{Phase: Running, Reason: ReasonRestarting, Message: restartMessage(name, st)}
	}

	scheduled, scheduledAt := d.scheduled()
	if !scheduled {
		s := State{Phase: Pending, Reason: ReasonScheduling, Message: "waiting for the scheduler"}
		if gates := pod.Spec.SchedulingGates; len(gates) > 0 {
			// Queued (Kueue and the like): not the scheduler's turn yet, so no
			// schedule timeout runs.
			names := make([]string, len(gates))
			for i, g := range gates {
				names[i] = g.Name
			}
			s.Message = "waiting for scheduling gates to be removed: " + strings.Join(names, ", ")
			return s
		}
		if c := findCondition(pod, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse {
			switch c.Reason {
			case corev1.PodReasonUnschedulable:
				s.Reason, s.Message = ReasonUnschedulable, "no node can run the pod: "+oneLine(c.Message)
			case corev1.PodReasonSchedulingGated:
				// The gates are gone; the condition is the scheduler's to update.
			default:
				if c.Message != "" {
					s.Message = "waiting for the scheduler: " + oneLine(c.Message)
				}
			}
		}
		since := pod.CreationTimestamp.Time
		if d.p.UngatedAt.After(since) {
			since = d.p.UngatedAt
		}
		if d.p.ScheduleTimeout > 0 && d.expired(since, d.p.ScheduleTimeout) {
			return failed(ReasonScheduleTimeout, fmt.Sprintf(
				"the pod was not scheduled within the schedule timeout (%s); last: %s", d.p.ScheduleTimeout, s.Message))
		}
		return s
	}

	pending := State{Phase: Pending, Reason: ReasonStarting,
		Message: fmt.Sprintf("the pod is on node %q; starting main container %q", pod.Spec.NodeName, name)}
	if s, ok := d.initContainers(); ok {
		if s.Phase == Failed {
			return s
		}
		pending = s
	} else if st != nil && st.State.Waiting != nil {
		if s, ok := d.waiting(mainSpec, st.State.Waiting, scheduledAt); ok {
			if s.Phase == Failed {
				return s
			}
			pending = s
		}
	}
	if d.p.StartupTimeout > 0 && d.expired(scheduledAt, d.p.StartupTimeout) {
		return failed(ReasonStartupTimeout, fmt.Sprintf(
			"main container %q did not start within the startup timeout (%s); last: %s", name, d.p.StartupTimeout, pending.Message))
	}
	return pending
}

// finished decides the outcome of a main container that terminated for good.
func (d *deriver) finished(name string, st *corev1.ContainerStatus) State {
	t := st.State.Terminated
	code := t.ExitCode
	s := State{Phase: Failed, ExitCode: &code}
	if code == 0 {
		s.Phase, s.Reason = Succeeded, ReasonCompleted
		s.Message = fmt.Sprintf("main container %q exited with code 0", name)
		return s
	}
	if t.Reason == "OOMKilled" {
		s.Reason = ReasonOOMKilled
		s.Message = fmt.Sprintf("main container %q was killed for using more memory than its limit (OOMKilled, exit code %d); raise resources.limits.memory", name, code)
		return s
	}
	if d.p.RunTimeout > 0 {
		if start := firstStart(st); !start.IsZero() && !t.FinishedAt.IsZero() && t.FinishedAt.Sub(start) >= d.p.RunTimeout {
			s.Reason = ReasonRunTimeout
			s.Message = fmt.Sprintf("main container %q ran longer than the run timeout (%s) and exited with code %d", name, d.p.RunTimeout, code)
			return s
		}
	}
	d.signalExit = code > 128
	k, ok := d.killed(t.FinishedAt.Time)
	d.signalExit = false
	if ok {
		k.ExitCode = &code
		k.Message += fmt.Sprintf("; main container %q exited with code %d", name, code)
		return k
	}
	if t.Reason == "ContainerStatusUnknown" {
		s.Reason = ReasonNodeLost
		s.Message = fmt.Sprintf("the state of main container %q was lost (ContainerStatusUnknown): %s", name, oneLine(t.Message))
		return s
	}
	s.Reason = ReasonExitCode
	s.Message = fmt.Sprintf("main container %q exited with code %d", name, code)
	if t.Reason != "" && t.Reason != "Error" && t.Reason != "Completed" {
		s.Message += " (" + t.Reason + ")"
	}
	if m := oneLine(t.Message); m != "" {
		s.Message += ": " + m
	}
	return s
}

// killed reports a pod-level cause that stops (or stopped) the main container at time
// at. A zero at means the main container has not finished, so any such cause applies.
// A cause that happened after at did not kill the main container.
func (d *deriver) killed(at time.Time) (State, bool) {
	pod := d.pod
	if c := d.p.CancelledAt; !c.IsZero() && notBefore(at, c) {
		return failed(ReasonCancelled, "the task was cancelled"), true
	}
	if c := findCondition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue &&
		notBefore(at, c.LastTransitionTime.Time) {
		return disruption(c), true
	}
	switch pod.Status.Reason {
	case "Evicted":
		return failed(ReasonEvicted, "the pod was evicted"+podCause(pod)), true
	case "Terminated", "Shutdown":
		return failed(ReasonEvicted, "the pod was stopped because its node shut down"+podCause(pod)), true
	case "NodeLost":
		return failed(ReasonNodeLost, "the pod's node was lost"+podCause(pod)), true
	}
	if deadline, ok := activeDeadline(pod); ok {
		reported := pod.Status.Reason == "DeadlineExceeded"
		if (reported || !d.now.Before(deadline)) && notBefore(at, deadline) {
			d.timed = d.timed || !reported
			return failed(ReasonDeadlineExceeded, fmt.Sprintf(
				"the pod ran longer than spec.activeDeadlineSeconds (%ds)", *pod.Spec.ActiveDeadlineSeconds)), true
		}
		if at.IsZero() {
			d.expired(deadline, 0)
		}
	} else if pod.Status.Reason == "DeadlineExceeded" {
		return failed(ReasonDeadlineExceeded, "the pod ran longer than spec.activeDeadlineSeconds"+podCause(pod)), true
	}
	if ts := pod.DeletionTimestamp; ts != nil {
		requested := ts.Time
		if g := pod.DeletionGracePeriodSeconds; g != nil && *g > 0 {
			requested = requested.Add(-time.Duration(*g) * time.Second)
		}
		// A container that exited by itself in the very second the deletion was
		// requested keeps its own outcome: second-precision timestamps cannot
		// order the two, and only a signal exit points at the deletion.
		sameSecond := !at.IsZero() && at.Truncate(time.Second).Equal(requested.Truncate(time.Second))
		if notBefore(at, requested) && (!sameSecond || d.signalExit) {
			return failed(ReasonDeletedExternally, "the pod was deleted by someone else before the main container finished"), true
		}
	}
	if at.IsZero() && pod.Status.Phase == corev1.PodUnknown {
		return failed(ReasonNodeLost, "the pod's node stopped reporting its state (phase Unknown)"+podCause(pod)), true
	}
	return State{}, false
}

func disruption(c *corev1.PodCondition) State {
	msg := oneLine(c.Message)
	if msg != "" {
		msg = ": " + msg
	}
	switch c.Reason {
	case disruptionPreemptionByScheduler:
		return failed(ReasonPreempted, "the scheduler preempted the pod for a higher-priority pod"+msg)
	case disruptionEvictionByAPI:
		return failed(ReasonEvicted, "the pod was evicted through the Eviction API (for example a node drain)"+msg)
	case disruptionDeletionByTaintMgr:
		return failed(ReasonEvicted, "the pod was evicted because its node has a NoExecute taint (for example unreachable)"+msg)
	case disruptionTerminationByKubelet:
		return failed(ReasonEvicted, "the kubelet stopped the pod (node pressure or node shutdown)"+msg)
	case disruptionDeletionByPodGC:
		return failed(ReasonNodeLost, "the pod garbage collector deleted the pod (its node is gone or out of service)"+msg)
	default:
		return failed(ReasonEvicted, fmt.Sprintf("the pod was disrupted (%s)%s", c.Reason, msg))
	}
}

// initContainers returns the state while init containers (and native sidecars) keep the
// main container from starting; ok is false when none does.
func (d *deriver) initContainers() (State, bool) {
	pod := d.pod
	_, scheduledAt := d.scheduled()
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		native := c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		kind := "init container"
		if native {
			kind = "sidecar"
		}
		st := findStatus(pod.Status.InitContainerStatuses, c.Name)
		initializing := State{Phase: Pending, Reason: ReasonInitializing,
			Message: fmt.Sprintf("waiting for %s %q", kind, c.Name)}
		switch {
		case st == nil:
			return initializing, true
		case st.State.Waiting != nil:
			if s, ok := d.waiting(c, st.State.Waiting, scheduledAt); ok {
				return s, true
			}
			return initializing, true
		case st.State.Running != nil:
			if native {
				continue
			}
			initializing.Message = fmt.Sprintf("init container %q is running", c.Name)
			return initializing, true
		case st.State.Terminated != nil:
			t := st.State.Terminated
			if native {
				initializing.Message = fmt.Sprintf("sidecar %q exited with code %d and is being restarted", c.Name, t.ExitCode)
				return initializing, true
			}
			if t.ExitCode == 0 {
				continue
			}
			if d.willRestart(c, t.ExitCode) {
				initializing.Message = fmt.Sprintf("init container %q exited with code %d and is being restarted", c.Name, t.ExitCode)
				return initializing, true
			}
			msg := fmt.Sprintf("init container %q exited with code %d", c.Name, t.ExitCode)
			if t.Reason != "" && t.Reason != "Error" {
				msg += " (" + t.Reason + ")"
			}
			if m := oneLine(t.Message); m != "" {
				msg += ": " + m
			}
			return failed(ReasonInitFailed, msg), true
		default:
			return initializing, true
		}
	}
	return State{}, false
}

// waiting interprets a waiting container that the main container needs; ok is false for
// ordinary waiting reasons (ContainerCreating, PodInitializing).
func (d *deriver) waiting(c *corev1.Container, w *corev1.ContainerStateWaiting, since time.Time) (State, bool) {
	detail := oneLine(w.Message)
	if detail != "" {
		detail = ": " + detail
	}
	switch w.Reason {
	case "InvalidImageName":
		return failed(ReasonInvalidImage, fmt.Sprintf(
			"image %q of container %q is not a valid image reference%s; fix the image field", c.Image, c.Name, detail)), true
	case "ErrImageNeverPull":
		return failed(ReasonImagePullFailed, fmt.Sprintf(
			"image %q of container %q is not on the node and imagePullPolicy is Never%s", c.Image, c.Name, detail)), true
	case "ErrImagePull", "ImagePullBackOff":
		msg := fmt.Sprintf("image %q of container %q cannot be pulled (%s)%s", c.Image, c.Name, w.Reason, detail)
		if d.expired(since, d.p.ImagePullGrace) {
			return failed(ReasonImagePullFailed, msg+"; check the image name, its tag and imagePullSecrets"), true
		}
		return State{Phase: Pending, Reason: ReasonImagePullFailed, Message: msg + "; the kubelet keeps retrying"}, true
	case "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
		msg := fmt.Sprintf("container %q cannot be created (%s)%s", c.Name, w.Reason, detail)
		if d.expired(since, d.p.ConfigErrorGrace) {
			return failed(ReasonConfigError, msg+"; check the Secrets, ConfigMaps and volumes it refers to"), true
		}
		return State{Phase: Pending, Reason: ReasonConfigError, Message: msg + "; the kubelet keeps retrying"}, true
	}
	return State{}, false
}

// willRestart reports whether the kubelet restarts container c after it exited with
// code: container restart rules first, then the container's restart policy, then the
// pod's. An empty pod restart policy counts as Never (kubetask always sets one).
func (d *deriver) willRestart(c *corev1.Container, code int32) bool {
	pod := d.pod
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return false
	}
	for _, r := range c.RestartPolicyRules {
		if r.ExitCodes == nil {
			continue
		}
		in := slices.Contains(r.ExitCodes.Values, code)
		if (r.ExitCodes.Operator == corev1.ContainerRestartRuleOnExitCodesOpIn) == in {
			return r.Action == corev1.ContainerRestartRuleActionRestart
		}
	}
	policy := pod.Spec.RestartPolicy
	if c.RestartPolicy != nil {
		policy = corev1.RestartPolicy(*c.RestartPolicy)
	}
	switch policy {
	case corev1.RestartPolicyAlways:
		return true
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return false
}

// scheduled reports whether the pod is bound to a node and since when (best known).
func (d *deriver) scheduled() (bool, time.Time) {
	pod := d.pod
	fallback := pod.CreationTimestamp.Time
	if pod.Status.StartTime != nil {
		fallback = pod.Status.StartTime.Time
	}
	if c := findCondition(pod, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionTrue {
		if !c.LastTransitionTime.IsZero() {
			return true, c.LastTransitionTime.Time
		}
		return true, fallback
	}
	if pod.Spec.NodeName != "" {
		return true, fallback
	}
	return false, time.Time{}
}

// mustStop reports whether a pod whose task outcome is decided still has regular
// containers that will not stop by themselves. Native sidecars are left out: the kubelet
// stops them once every regular container has exited.
func (d *deriver) mustStop() bool {
	pod := d.pod
	if pod == nil || pod.DeletionTimestamp != nil ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return false
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		st := findStatus(pod.Status.ContainerStatuses, c.Name)
		if st == nil || st.State.Terminated == nil || d.willRestart(c, st.State.Terminated.ExitCode) {
			return true
		}
	}
	return false
}

func failed(r Reason, msg string) State { return State{Phase: Failed, Reason: r, Message: msg} }

// notBefore reports whether at is not before event, at one-second resolution (the API
// reports container times in whole seconds). Unknown times count as "not before": a
// non-zero exit next to a pod-level kill is blamed on the kill.
func notBefore(at, event time.Time) bool {
	if at.IsZero() || event.IsZero() {
		return true
	}
	return !at.Before(event.Truncate(time.Second))
}

func activeDeadline(pod *corev1.Pod) (time.Time, bool) {
	if pod.Spec.ActiveDeadlineSeconds == nil || pod.Status.StartTime == nil || pod.Status.StartTime.IsZero() {
		return time.Time{}, false
	}
	secs := *pod.Spec.ActiveDeadlineSeconds
	if secs < 0 || secs > int64(100*365*24*time.Hour/time.Second) {
		return time.Time{}, false
	}
	return pod.Status.StartTime.Add(time.Duration(secs) * time.Second), true
}

func started(st *corev1.ContainerStatus) bool {
	return st.State.Running != nil || st.State.Terminated != nil ||
		st.LastTerminationState.Terminated != nil || st.RestartCount > 0
}

// firstStart is the earliest start of the container the status still records.
func firstStart(st *corev1.ContainerStatus) time.Time {
	var first time.Time
	for _, t := range []time.Time{
		StartedAt(st.State), StartedAt(st.LastTerminationState),
	} {
		if !t.IsZero() && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first
}

// StartedAt is when the container of state s started: running or
// terminated since; zero while it waits.
func StartedAt(s corev1.ContainerState) time.Time {
	switch {
	case s.Running != nil:
		return s.Running.StartedAt.Time
	case s.Terminated != nil:
		return s.Terminated.StartedAt.Time
	}
	return time.Time{}
}

func restartMessage(name string, st *corev1.ContainerStatus) string {
	msg := fmt.Sprintf("main container %q is being restarted (%d restarts so far)", name, st.RestartCount)
	if t := st.State.Terminated; t != nil {
		return msg + fmt.Sprintf("; it exited with code %d", t.ExitCode)
	}
	if t := st.LastTerminationState.Terminated; t != nil {
		msg += fmt.Sprintf("; it last exited with code %d", t.ExitCode)
	}
	if w := st.State.Waiting; w != nil && w.Reason != "" {
		msg += " (" + w.Reason + ")"
	}
	return msg
}

func podCause(pod *corev1.Pod) string {
	var parts []string
	if pod.Status.Reason != "" {
		parts = append(parts, pod.Status.Reason)
	}
	if m := oneLine(pod.Status.Message); m != "" {
		parts = append(parts, m)
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ": ")
}

func findContainer(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func findStatus(ss []corev1.ContainerStatus, name string) *corev1.ContainerStatus {
	for i := range ss {
		if ss[i].Name == name {
			return &ss[i]
		}
	}
	return nil
}

func findCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func containerNames(cs []corev1.Container) string {
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, fmt.Sprintf("%q", c.Name))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// oneLine shortens a status message to one line of at most 300 bytes.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = strings.TrimSpace(s[:i]) + " ..."
	}
	if len(s) > 300 {
		s = strings.ToValidUTF8(s[:300], "") + " ..."
	}
	return s
}
