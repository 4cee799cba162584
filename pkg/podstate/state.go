package podstate

import (
	"fmt"
	"time"
)

// Phase is where a task stands. Succeeded and Failed are terminal: once Derive returns
// one of them for a pod, the task's outcome is decided.
type Phase string

const (
	// Pending means the main container has not started yet (scheduling, init containers,
	// image pulls, container creation).
	Pending Phase = "Pending"
	// Running means the main container is running, or is being restarted by the kubelet
	// under restartPolicy OnFailure.
	Running Phase = "Running"
	// Succeeded means the main container exited with code 0.
	Succeeded Phase = "Succeeded"
	// Failed means the task cannot succeed with this pod any more.
	Failed Phase = "Failed"
)

// Terminal reports whether p is Succeeded or Failed.
func (p Phase) Terminal() bool { return p == Succeeded || p == Failed }

// Reason is a machine-readable cause, one of the constants below. The set is closed:
// Derive never returns any other value, and docs/states.md documents each one.
type Reason string

// Reasons of non-terminal states.
const (
	// ReasonScheduling: the pod waits for the scheduler (no verdict yet, or scheduling gates).
	ReasonScheduling Reason = "Scheduling"
	// ReasonUnschedulable: the scheduler found no node; it keeps trying until the schedule timeout.
	ReasonUnschedulable Reason = "Unschedulable"
	// ReasonInitializing: init containers (or native sidecars) are starting or running.
	ReasonInitializing Reason = "Initializing"
	// ReasonStarting: the pod is on a node and its containers are being created.
	ReasonStarting Reason = "Starting"
	// ReasonRunning: the main container is running.
	ReasonRunning Reason = "Running"
	// ReasonRestarting: the main container failed and the kubelet restarts it
	// (restartPolicy OnFailure).
	ReasonRestarting Reason = "Restarting"
)

// Reasons of terminal states. ImagePullFailed and ConfigError are also used while
// Pending, during the grace period in which the kubelet keeps retrying.
const (
	// ReasonCompleted: the main container exited 0. The only reason of Succeeded.
	ReasonCompleted Reason = "Completed"
	// ReasonExitCode: the main container exited with a non-zero code.
	ReasonExitCode Reason = "ExitCode"
	// ReasonOOMKilled: the main container was killed for exceeding its memory limit.
	ReasonOOMKilled Reason = "OOMKilled"
	// ReasonInitFailed: a (non-sidecar) init container failed under restartPolicy Never.
	ReasonInitFailed Reason = "InitFailed"
	// ReasonImagePullFailed: an image needed to start the main container could not be
	// pulled within the image pull grace period.
	ReasonImagePullFailed Reason = "ImagePullFailed"
	// ReasonInvalidImage: an image reference cannot be parsed (InvalidImageName).
	ReasonInvalidImage Reason = "InvalidImage"
	// ReasonConfigError: a container cannot be created (missing Secret or ConfigMap,
	// CreateContainerError) beyond the grace period, or the pod has no main container.
	ReasonConfigError Reason = "ConfigError"
	// ReasonScheduleTimeout: the pod was not scheduled within the schedule timeout.
	ReasonScheduleTimeout Reason = "ScheduleTimeout"
	// ReasonStartupTimeout: the main container did not start within the startup
	// timeout after the pod was scheduled.
	ReasonStartupTimeout Reason = "StartupTimeout"
	// ReasonRunTimeout: the main container ran longer than the run timeout.
	ReasonRunTimeout Reason = "RunTimeout"
	// ReasonDeadlineExceeded: the pod's spec.activeDeadlineSeconds passed before the
	// main container finished.
	ReasonDeadlineExceeded Reason = "DeadlineExceeded"
	// ReasonEvicted: the pod was evicted (Eviction API, node pressure, graceful node
	// shutdown, NoExecute taint) before the main container finished.
	ReasonEvicted Reason = "Evicted"
	// ReasonPreempted: the scheduler preempted the pod for a higher-priority one.
	ReasonPreempted Reason = "Preempted"
	// ReasonNodeLost: the pod's node stopped reporting (phase Unknown, pod garbage
	// collected, container status lost).
	ReasonNodeLost Reason = "NodeLost"
	// ReasonDeletedExternally: someone else deleted the pod before the main container
	// finished, or it is gone.
	ReasonDeletedExternally Reason = "DeletedExternally"
	// ReasonCancelled: kubetask was asked to cancel the task before the main container
	// finished.
	ReasonCancelled Reason = "Cancelled"
	// ReasonPodFailed: the pod failed for a reason kubetask does not recognise before
	// the main container finished (for example a kubelet admission rejection such as
	// OutOfcpu or NodeAffinity).
	ReasonPodFailed Reason = "PodFailed"
)

// Reasons the attempt lifecycle (pkg/attempt) sets around Derive's decision.
// Derive never returns them.
const (
	// ReasonStopping: the pod is being stopped by someone else (deleted, evicted,
	// preempted, past its activeDeadlineSeconds, its node lost) while the main
	// container has not finished; kubetask waits until no container runs before
	// it decides, because a main container that exits by itself (for example 0
	// on SIGTERM) keeps its own outcome. Phase Pending or Running.
	ReasonStopping Reason = "Stopping"
	// ReasonResultFailed: the main container exited 0 but the task's result
	// could not be read (missing, larger than result.maxBytes, or the result
	// holder could not be reached in time). Phase Failed, not retryable.
	ReasonResultFailed Reason = "ResultFailed"
	// ReasonClusterLost: the attempt's cluster was declared lost while the
	// attempt had a pod there (docs/multicluster.md): the pod may still run,
	// nobody can see it, and the next attempt runs on another cluster (for
	// that attempt, at least once). Phase Failed, retryable.
	ReasonClusterLost Reason = "ClusterLost"
	// ReasonClusterUnreachable: the attempt's cluster does not answer
	// (docs/multicluster.md): the attempt keeps its last known state, which
	// the message gives, and nothing of it changes until the cluster
	// answers. Shown by a service with several clusters, never recorded.
	// Phase Pending or Running.
	ReasonClusterUnreachable Reason = "ClusterUnreachable"
)

// LifecycleReasons lists the reasons the attempt lifecycle adds to Reasons.
var LifecycleReasons = []Reason{ReasonStopping, ReasonResultFailed, ReasonClusterLost, ReasonClusterUnreachable}

// Reasons lists every Reason Derive can return, in documentation order.
var Reasons = []Reason{
	ReasonScheduling, ReasonUnschedulable, ReasonInitializing, ReasonStarting,
	ReasonRunning, ReasonRestarting,
	ReasonCompleted, ReasonExitCode, ReasonOOMKilled, ReasonInitFailed,
	ReasonImagePullFailed, ReasonInvalidImage, ReasonConfigError,
	ReasonScheduleTimeout, ReasonStartupTimeout, ReasonRunTimeout, ReasonDeadlineExceeded,
	ReasonEvicted, ReasonPreempted, ReasonNodeLost, ReasonDeletedExternally,
	ReasonCancelled, ReasonPodFailed,
}

// retryable lists the Failed reasons caused by the infrastructure rather than by the
// task's own code or configuration: a new pod may well succeed where this one failed.
var retryable = map[Reason]bool{
	ReasonOOMKilled:         true,
	ReasonStartupTimeout:    true,
	ReasonEvicted:           true,
	ReasonPreempted:         true,
	ReasonNodeLost:          true,
	ReasonDeletedExternally: true,
	ReasonPodFailed:         true,
}

// Retryable reports whether a Failed state with reason r is an infrastructure failure.
func (r Reason) Retryable() bool { return retryable[r] }

// State is the derived state of a task's pod.
type State struct {
	// Phase is never empty.
	Phase Phase
	// Reason is one of Reasons and never empty.
	Reason Reason
	// Message explains the state to a person, naming the container and the cause.
	Message string
	// ExitCode is the main container's exit code when the outcome comes from its
	// termination (Completed, ExitCode, OOMKilled and the reasons of pod-level kills);
	// nil otherwise.
	ExitCode *int32
	// Retryable is true only for Failed states caused by the infrastructure (see
	// Reason.Retryable); a failure of the task's own code or configuration is terminal.
	Retryable bool
	// StopPod is true when the outcome is decided (Phase is terminal) but the pod will
	// not finish by itself: sidecars, the result holder or (after a timeout or a
	// cancellation) the main container are still running or waiting, and the pod is
	// neither finished nor being deleted. The runner must stop it, for example by
	// lowering spec.activeDeadlineSeconds to StopDeadlineSeconds, or delete it.
	StopPod bool
	// Recheck, when not zero, is the earliest time at which Derive could return a
	// different state for the same pod because a timeout or grace period expires.
	Recheck time.Time
	// Timed is set on a terminal state that rests on the clock having passed a
	// deadline (a timeout, a grace period, activeDeadlineSeconds before the
	// kubelet reported it) rather than on what the pod reports. A caller that
	// derived it from a cached pod must confirm it on a freshly read pod: a
	// stalled watch must never turn a running or finished pod into a timeout.
	Timed bool
}

// Terminal reports whether the task's outcome is decided.
func (s State) Terminal() bool { return s.Phase.Terminal() }

// String renders the state for logs: "Failed/ExitCode (exit 3): ...".
func (s State) String() string {
	out := string(s.Phase) + "/" + string(s.Reason)
	if s.ExitCode != nil {
		out += fmt.Sprintf(" (exit %d)", *s.ExitCode)
	}
	if s.Message != "" {
		out += ": " + s.Message
	}
	return out
}

// Policy holds the task settings Derive needs. The zero value means: the main container
// is found by DefaultMainContainer, no timeouts, and no grace for image pull or container
// configuration errors (they fail at once).
type Policy struct {
	// MainContainer names the regular container whose exit decides the task. When empty,
	// DefaultMainContainer picks it.
	MainContainer string
	// ScheduleTimeout bounds the time from pod creation until the pod is bound to a
	// node. Zero: no limit.
	ScheduleTimeout time.Duration
	// StartupTimeout bounds the time from scheduling until the main container first
	// starts, init containers and image pulls included. Zero: no limit.
	StartupTimeout time.Duration
	// RunTimeout bounds the time from the main container's first start until it
	// finishes. Zero: no limit.
	RunTimeout time.Duration
	// ImagePullGrace is how long ErrImagePull/ImagePullBackOff may last, measured from
	// scheduling, before the task fails with ImagePullFailed.
	ImagePullGrace time.Duration
	// ConfigErrorGrace is how long CreateContainerConfigError/CreateContainerError may
	// last, measured from scheduling, before the task fails with ConfigError.
	ConfigErrorGrace time.Duration
	// CancelledAt, when not zero, is when kubetask was asked to cancel the task. A main
	// container that finished before it keeps its outcome.
	CancelledAt time.Time
	// UngatedAt, when not zero, is when the caller first saw the pod without the
	// scheduling gates it had (a queue such as Kueue admitted it). The schedule
	// timeout counts from the later of the pod's creation and UngatedAt; while
	// the pod has scheduling gates it does not run at all.
	UngatedAt time.Time
}
