package podstate_test

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/podstate"
)

// policy is the task policy of most rows: main container "base", the task format's
// default timeouts and grace periods.
var policy = podstate.Policy{
	MainContainer:    "base",
	ScheduleTimeout:  10 * time.Minute,
	StartupTimeout:   10 * time.Minute,
	ImagePullGrace:   3 * time.Minute,
	ConfigErrorGrace: time.Minute,
}

// outcome is what a row checks: everything but the message, which is checked for
// non-emptiness and an optional fragment.
type outcome struct {
	Phase     podstate.Phase
	Reason    podstate.Reason
	Exit      *int32
	Retryable bool
	StopPod   bool
}

func exit(c int32) *int32 { return &c }

func pod() *podtest.PodWrapper { return podtest.MakePod("task-1", "jobs") }

// running is a scheduled pod whose main container "base" started one minute after
// creation.
func running() *podtest.PodWrapper {
	return pod().Scheduled().After(30 * time.Second).Main("base").Running().Phase(corev1.PodRunning)
}

func TestDerive(t *testing.T) {
	cases := map[string]struct {
		pod    *podtest.PodWrapper // nil: the pod is gone
		policy *podstate.Policy    // nil: policy
		after  time.Duration       // now = the builder's clock + after
		want   outcome
		msg    string // fragment the message must contain
	}{
		// --- single-container pods behave like phase-based logic ---
		"single container: created, not yet scheduled": {
			pod:  pod().Main("base"),
			want: outcome{Phase: podstate.Pending, Reason: podstate.ReasonScheduling},
		},
		"single container: scheduled, container being created": {
			pod:  pod().Scheduled().Main("base"),
			want: outcome{Phase: podstate.Pending, Reason: podstate.ReasonStarting},
		},
		"single container: running": {
			pod:  running(),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRunning},
		},
		"single container: exited 0, pod Succeeded": {
			pod:  running().After(time.Minute).Terminated(0).Phase(corev1.PodSucceeded),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0)},
		},
		"single container: exited 0, kubelet has not reported the pod phase yet": {
			pod:  running().After(time.Minute).Terminated(0),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0)},
		},
		"single container: exited 3, pod Failed": {
			pod:  running().After(time.Minute).Terminated(3).Phase(corev1.PodFailed),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, Exit: exit(3)},
			msg:  `main container "base" exited with code 3`,
		},
		"single container: killed by SIGKILL with no pod-level cause is the task's own failure (Argo #1282)": {
			pod:  running().After(time.Minute).Terminated(137).Phase(corev1.PodFailed),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, Exit: exit(137)},
		},
		"single container: command not found (StartError, exit 128)": {
			pod: pod().Scheduled().Main("base").
				TerminatedReason(128, "StartError", `exec: "nosuch": executable file not found in $PATH`).Phase(corev1.PodFailed),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, Exit: exit(128)},
			msg:  "executable file not found",
		},
		"single container: OOMKilled is retried": {
			pod:  running().After(time.Minute).OOMKilled().Phase(corev1.PodFailed),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonOOMKilled, Exit: exit(137), Retryable: true},
			msg:  "resources.limits.memory",
		},
		"main container not named and only one container: it is the main one": {
			pod:    running().After(time.Minute).Terminated(0),
			policy: &podstate.Policy{},
			want:   outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0)},
		},

		// --- the main container decides; sidecars do not (Airflow #23450, #10313, #39693) ---
		"regular sidecar (istio-proxy) keeps running after main exited 0: pod stays Running": {
			pod: running().Sidecar("istio-proxy").Running().
				After(time.Minute).On("base").Terminated(0),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0), StopPod: true},
		},
		"regular sidecar keeps running after main exited 1": {
			pod: running().Sidecar("envoy").Running().
				After(time.Minute).On("base").Terminated(1),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, Exit: exit(1), StopPod: true},
		},
		"pod Failed because a sidecar failed while main succeeded": {
			pod: running().Sidecar("log-shipper").Running().
				After(time.Minute).On("base").Terminated(0).
				After(time.Second).On("log-shipper").Terminated(2).Phase(corev1.PodFailed),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0)},
		},
		"a sidecar failed while main still runs": {
			pod: running().Sidecar("envoy").Running().
				After(time.Minute).Terminated(1),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRunning},
		},
		"a sidecar's image cannot be pulled while main runs (Flyte: primary container decides)": {
			pod: running().Sidecar("envoy").Waiting("ImagePullBackOff", "Back-off pulling image").
				After(time.Hour),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRunning},
		},
		"a sidecar's image cannot be pulled and main exited 0: the sidecar must be stopped": {
			pod: running().Sidecar("envoy").Waiting("ImagePullBackOff", "Back-off pulling image").
				After(time.Minute).On("base").Terminated(0),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0), StopPod: true},
		},
		"a sidecar crash-loops under OnFailure while main runs": {
			pod: running().RestartPolicy(corev1.RestartPolicyOnFailure).Sidecar("envoy").Running().
				After(time.Minute).Terminated(1).Restarted(),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRunning},
		},
		"the result holder still runs after main exited 0": {
			pod: running().Sidecar("kubetask-result").Running().
				After(time.Minute).On("base").Terminated(0),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0), StopPod: true},
		},
		"native sidecar runs beside main": {
			pod:  pod().Scheduled().NativeSidecar("envoy").Running().Main("base").Running().Phase(corev1.PodRunning),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRunning},
		},
		"native sidecar restarting while main runs": {
			pod: pod().Scheduled().NativeSidecar("envoy").Running().Main("base").Running().Phase(corev1.PodRunning).
				After(time.Minute).On("envoy").Terminated(1).Restarted(),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRunning},
		},
		"native sidecar still running after main exited 0: the kubelet stops it, not kubetask": {
			pod: pod().Scheduled().NativeSidecar("envoy").Running().Main("base").Running().Phase(corev1.PodRunning).
				After(time.Minute).Terminated(0),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0)},
		},
		"native sidecar exited 143 when the kubelet stopped it after main failed": {
			pod: pod().Scheduled().NativeSidecar("envoy").Running().Main("base").Running().
				After(time.Minute).Terminated(4).
				On("envoy").Terminated(143).Phase(corev1.PodFailed),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, Exit: exit(4)},
		},

		// --- kubetask stops sidecars with activeDeadlineSeconds: main's outcome stands ---
		"pod Failed DeadlineExceeded after kubetask stopped the sidecars, main had exited 0": {
			pod: running().Sidecar("envoy").Running().
				After(time.Minute).On("base").Terminated(0).
				ActiveDeadlineSeconds(93). // StopDeadlineSeconds at 1m30s after start
				After(5*time.Second).On("envoy").Terminated(137).
				Phase(corev1.PodFailed).Reason("DeadlineExceeded", "Pod was active on the node longer than the specified deadline"),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0)},
		},
		"pod Failed DeadlineExceeded after kubetask stopped the sidecars, main had exited 2": {
			pod: running().Sidecar("envoy").Running().
				After(time.Minute).On("base").Terminated(2).
				ActiveDeadlineSeconds(93).
				After(5*time.Second).On("envoy").Terminated(137).
				Phase(corev1.PodFailed).Reason("DeadlineExceeded", "Pod was active on the node longer than the specified deadline"),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, Exit: exit(2)},
		},
		"the user's activeDeadlineSeconds killed the main container": {
			pod: running().ActiveDeadlineSeconds(60).
				After(time.Minute).Terminated(137).
				Phase(corev1.PodFailed).Reason("DeadlineExceeded", "Pod was active on the node longer than the specified deadline"),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonDeadlineExceeded, Exit: exit(137)},
		},
		"activeDeadlineSeconds passed, the kubelet has not acted yet": {
			pod:   running().ActiveDeadlineSeconds(60),
			after: 2 * time.Minute,
			want:  outcome{Phase: podstate.Failed, Reason: podstate.ReasonDeadlineExceeded, StopPod: true},
		},

		// --- restarts ---
		"OnFailure: main exited 1 and is being restarted": {
			pod:  running().RestartPolicy(corev1.RestartPolicyOnFailure).After(time.Minute).Terminated(1).Restarted(),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRestarting},
			msg:  "last exited with code 1",
		},
		"OnFailure: main exited 1, kubelet has not restarted it yet": {
			pod:  running().RestartPolicy(corev1.RestartPolicyOnFailure).After(time.Minute).Terminated(1),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRestarting},
		},
		"OnFailure: main runs again after a restart": {
			pod: running().RestartPolicy(corev1.RestartPolicyOnFailure).After(time.Minute).Terminated(1).Restarted().
				After(10 * time.Second).Running(),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRunning},
		},
		"OnFailure: main succeeded after a restart": {
			pod: running().RestartPolicy(corev1.RestartPolicyOnFailure).After(time.Minute).Terminated(1).Restarted().
				After(10 * time.Second).Running().After(time.Minute).Terminated(0).Phase(corev1.PodSucceeded),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0)},
		},
		"OnFailure: run timeout counts from the first start, not the last restart": {
			pod: running().RestartPolicy(corev1.RestartPolicyOnFailure).After(8 * time.Minute).Terminated(1).Restarted().
				After(10 * time.Second).Running(),
			policy: &podstate.Policy{MainContainer: "base", RunTimeout: 5 * time.Minute},
			want:   outcome{Phase: podstate.Failed, Reason: podstate.ReasonRunTimeout, StopPod: true},
		},
		"container restart rule restarts main on exit code 42": {
			pod:  running().ContainerRestartPolicy(corev1.ContainerRestartPolicyNever).RestartRule(42).After(time.Minute).Terminated(42),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRestarting},
		},
		"container restart rule does not match exit code 1": {
			pod:  running().ContainerRestartPolicy(corev1.ContainerRestartPolicyNever).RestartRule(42).After(time.Minute).Terminated(1),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, Exit: exit(1)},
		},

		// --- scheduling ---
		"unschedulable within the schedule timeout": {
			pod:  pod().Main("base").Unschedulable("0/3 nodes are available: 3 Insufficient cpu."),
			want: outcome{Phase: podstate.Pending, Reason: podstate.ReasonUnschedulable},
			msg:  "Insufficient cpu",
		},
		"unschedulable beyond the schedule timeout": {
			pod:   pod().Main("base").Unschedulable("0/3 nodes are available: 3 Insufficient cpu."),
			after: 10 * time.Minute,
			want:  outcome{Phase: podstate.Failed, Reason: podstate.ReasonScheduleTimeout, StopPod: true},
			msg:   "Insufficient cpu",
		},
		"unschedulable with no schedule timeout waits forever": {
			pod:    pod().Main("base").Unschedulable("0/3 nodes are available"),
			policy: &podstate.Policy{MainContainer: "base"},
			after:  1000 * time.Hour,
			want:   outcome{Phase: podstate.Pending, Reason: podstate.ReasonUnschedulable},
		},
		"scheduling gated (queued by Kueue)": {
			pod:  pod().Main("base").SchedulingGated(),
			want: outcome{Phase: podstate.Pending, Reason: podstate.ReasonScheduling},
			msg:  "scheduling gates",
		},

		// --- starting: images and configuration (Airflow #15218, #37670) ---
		"ErrImagePull within the image pull grace": {
			pod:   pod().Scheduled().Main("base").Waiting("ErrImagePull", "rpc error: not found"),
			after: time.Minute,
			want:  outcome{Phase: podstate.Pending, Reason: podstate.ReasonImagePullFailed},
			msg:   "keeps retrying",
		},
		"ImagePullBackOff beyond the image pull grace (Flyte: 3 minutes)": {
			pod:   pod().Scheduled().Main("base").Waiting("ImagePullBackOff", `Back-off pulling image "registry.example/base:1"`),
			after: 3 * time.Minute,
			want:  outcome{Phase: podstate.Failed, Reason: podstate.ReasonImagePullFailed, StopPod: true},
			msg:   "imagePullSecrets",
		},
		"ImagePullBackOff with no grace fails at once (Tekton)": {
			pod:    pod().Scheduled().Main("base").Waiting("ImagePullBackOff", "Back-off pulling image"),
			policy: &podstate.Policy{MainContainer: "base"},
			want:   outcome{Phase: podstate.Failed, Reason: podstate.ReasonImagePullFailed, StopPod: true},
		},
		"ErrImageNeverPull fails at once": {
			pod:  pod().Scheduled().Main("base").Waiting("ErrImageNeverPull", "Container image is not present with pull policy of Never"),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonImagePullFailed, StopPod: true},
		},
		"InvalidImageName fails at once": {
			pod:  pod().Scheduled().Main("base").Image("Registry/UPPER:tag").Waiting("InvalidImageName", `Failed to apply default image tag "Registry/UPPER:tag"`),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonInvalidImage, StopPod: true},
			msg:  "Registry/UPPER:tag",
		},
		"missing Secret (CreateContainerConfigError) within the grace": {
			pod:  pod().Scheduled().Main("base").Waiting("CreateContainerConfigError", `secret "db-password" not found`),
			want: outcome{Phase: podstate.Pending, Reason: podstate.ReasonConfigError},
			msg:  "db-password",
		},
		"missing Secret (CreateContainerConfigError) beyond the grace": {
			pod:   pod().Scheduled().Main("base").Waiting("CreateContainerConfigError", `secret "db-password" not found`),
			after: time.Minute,
			want:  outcome{Phase: podstate.Failed, Reason: podstate.ReasonConfigError, StopPod: true},
			msg:   "db-password",
		},
		"CreateContainerError beyond the grace": {
			pod:   pod().Scheduled().Main("base").Waiting("CreateContainerError", "failed to reserve container name"),
			after: 2 * time.Minute,
			want:  outcome{Phase: podstate.Failed, Reason: podstate.ReasonConfigError, StopPod: true},
		},
		"volume never attaches: ContainerCreating beyond the startup timeout": {
			pod:   pod().Scheduled().Main("base"),
			after: 10 * time.Minute,
			want:  outcome{Phase: podstate.Failed, Reason: podstate.ReasonStartupTimeout, Retryable: true, StopPod: true},
		},
		"image pull still retrying when the startup timeout passes": {
			pod:    pod().Scheduled().Main("base").Waiting("ImagePullBackOff", "Back-off pulling image"),
			policy: &podstate.Policy{MainContainer: "base", StartupTimeout: 2 * time.Minute, ImagePullGrace: time.Hour},
			after:  2 * time.Minute,
			want:   outcome{Phase: podstate.Failed, Reason: podstate.ReasonStartupTimeout, Retryable: true, StopPod: true},
		},

		// --- init containers and native sidecars during startup ---
		"init container running": {
			pod:  pod().Scheduled().Init("migrate").Running().Main("base").Phase(corev1.PodPending),
			want: outcome{Phase: podstate.Pending, Reason: podstate.ReasonInitializing},
		},
		"init container failed under restartPolicy Never: pod Failed": {
			pod: pod().Scheduled().Init("migrate").Running().After(time.Minute).Terminated(1).
				Main("base").Phase(corev1.PodFailed),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonInitFailed},
			msg:  `init container "migrate" exited with code 1`,
		},
		"init container failed, the kubelet has not reported the pod phase yet": {
			pod:  pod().Scheduled().Init("migrate").Running().After(time.Minute).Terminated(1).Main("base"),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonInitFailed, StopPod: true},
		},
		"init container OOMKilled": {
			pod:  pod().Scheduled().Init("migrate").Running().After(time.Minute).OOMKilled().Main("base").Phase(corev1.PodFailed),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonInitFailed},
			msg:  "OOMKilled",
		},
		"init container failed under OnFailure is restarted": {
			pod: pod().RestartPolicy(corev1.RestartPolicyOnFailure).Scheduled().
				Init("migrate").Running().After(time.Minute).Terminated(1).Main("base"),
			want: outcome{Phase: podstate.Pending, Reason: podstate.ReasonInitializing},
		},
		"init container image cannot be pulled beyond the grace": {
			pod:   pod().Scheduled().Init("migrate").Waiting("ImagePullBackOff", "Back-off pulling image").Main("base"),
			after: 5 * time.Minute,
			want:  outcome{Phase: podstate.Failed, Reason: podstate.ReasonImagePullFailed, StopPod: true},
			msg:   `container "migrate"`,
		},
		"native sidecar image cannot be pulled: main can never start": {
			pod:   pod().Scheduled().NativeSidecar("envoy").Waiting("ImagePullBackOff", "Back-off pulling image").Main("base"),
			after: 5 * time.Minute,
			want:  outcome{Phase: podstate.Failed, Reason: podstate.ReasonImagePullFailed, StopPod: true},
		},
		"native sidecar started, main being created": {
			pod:  pod().Scheduled().NativeSidecar("envoy").Running().Main("base"),
			want: outcome{Phase: podstate.Pending, Reason: podstate.ReasonStarting},
		},
		"init containers done, main running": {
			pod: pod().Scheduled().Init("migrate").Running().After(time.Minute).Terminated(0).
				Main("base").Running().Phase(corev1.PodRunning),
			want: outcome{Phase: podstate.Running, Reason: podstate.ReasonRunning},
		},

		// --- disruptions: retried ---
		"evicted for node pressure while main runs": {
			pod: running().After(time.Minute).
				DisruptionTarget("TerminationByKubelet", "The node was low on resource: memory.").
				Terminated(137).Phase(corev1.PodFailed).Reason("Evicted", "The node was low on resource: memory."),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonEvicted, Exit: exit(137), Retryable: true},
			msg:  "low on resource",
		},
		"evicted (old kubelet, no DisruptionTarget condition), main status lost": {
			pod: running().After(time.Minute).
				TerminatedReason(137, "ContainerStatusUnknown", "The container could not be located when the pod was terminated").
				Phase(corev1.PodFailed).Reason("Evicted", "The node was low on resource: ephemeral-storage."),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonEvicted, Exit: exit(137), Retryable: true},
		},
		"evicted after main had exited 0, sidecar still running": {
			pod: running().Sidecar("envoy").Running().After(time.Minute).On("base").Terminated(0).
				After(time.Minute).DisruptionTarget("TerminationByKubelet", "The node was low on resource: memory.").
				On("envoy").Terminated(137).Phase(corev1.PodFailed).Reason("Evicted", ""),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0)},
		},
		"evicted after main had failed on its own: the failure stands": {
			pod: running().Sidecar("envoy").Running().After(time.Minute).On("base").Terminated(1).
				After(time.Minute).DisruptionTarget("EvictionByEvictionAPI", "Eviction API: evicting").Deleted(30 * time.Second),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, Exit: exit(1)},
		},
		"preempted by the scheduler": {
			pod: running().After(time.Minute).
				DisruptionTarget("PreemptionByScheduler", "default-scheduler: preempting to accommodate a higher priority pod").
				Deleted(30 * time.Second),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonPreempted, Retryable: true},
			msg:  "higher priority",
		},
		"preemption condition set, pod not yet deleted": {
			pod: running().After(time.Minute).
				DisruptionTarget("PreemptionByScheduler", "default-scheduler: preempting"),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonPreempted, Retryable: true, StopPod: true},
		},
		"deleted by the taint manager (node unreachable)": {
			pod: running().After(time.Minute).
				DisruptionTarget("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint").
				Deleted(30 * time.Second),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonEvicted, Retryable: true},
			msg:  "NoExecute",
		},
		"evicted through the Eviction API (node drain)": {
			pod: running().After(time.Minute).
				DisruptionTarget("EvictionByEvictionAPI", "Eviction API: evicting").Deleted(30 * time.Second).
				After(2 * time.Second).Terminated(143),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonEvicted, Exit: exit(143), Retryable: true},
		},
		"deleted by the pod garbage collector (node gone)": {
			pod: running().After(time.Minute).
				DisruptionTarget("DeletionByPodGC", "PodGC: node no longer exists").
				Phase(corev1.PodFailed).Deleted(0),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonNodeLost, Retryable: true},
		},
		"terminated by the kubelet on graceful node shutdown": {
			pod: running().After(time.Minute).
				DisruptionTarget("TerminationByKubelet", "Pod was terminated in response to imminent node shutdown.").
				Terminated(143).Phase(corev1.PodFailed).Reason("Terminated", "Pod was terminated in response to imminent node shutdown."),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonEvicted, Exit: exit(143), Retryable: true},
			msg:  "node shutdown",
		},
		"node shutdown without DisruptionTarget (older kubelet)": {
			pod: running().After(time.Minute).Phase(corev1.PodFailed).
				Reason("Shutdown", "Pod was terminated in response to imminent node shutdown."),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonEvicted, Retryable: true},
		},
		"unknown DisruptionTarget reason": {
			pod:  running().After(time.Minute).DisruptionTarget("SomethingNew", "").Deleted(time.Second),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonEvicted, Retryable: true},
		},
		"kubelet admission rejected the pod (OutOfcpu)": {
			pod: pod().Scheduled().Main("base").Phase(corev1.PodFailed).
				Reason("OutOfcpu", "Pod was rejected: Node didn't have enough resource: cpu"),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonPodFailed, Retryable: true},
			msg:  "OutOfcpu",
		},

		// --- node lost ---
		"phase Unknown while main runs": {
			pod:  running().After(time.Minute).Phase(corev1.PodUnknown),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonNodeLost, Retryable: true, StopPod: true},
		},
		"phase Unknown after main had exited 0": {
			pod: running().Sidecar("envoy").Running().After(time.Minute).On("base").Terminated(0).
				After(time.Minute).Phase(corev1.PodUnknown),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0), StopPod: true},
		},
		"main container status lost (ContainerStatusUnknown)": {
			pod: running().After(time.Minute).
				TerminatedReason(137, "ContainerStatusUnknown", "The container could not be located when the pod was deleted.").
				Phase(corev1.PodFailed),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonNodeLost, Exit: exit(137), Retryable: true},
		},
		"old node controller marked the pod NodeLost": {
			pod:  running().After(time.Minute).Reason("NodeLost", "Node node-1 which was running pod task-1 is unresponsive"),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonNodeLost, Retryable: true, StopPod: true},
		},

		// --- deletion and cancellation ---
		"deleted by someone else while main runs (deletionTimestamp set)": {
			pod:  running().After(time.Minute).Deleted(30 * time.Second),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonDeletedExternally, Retryable: true},
		},
		"deleted by someone else while pending": {
			pod:  pod().Main("base").Deleted(30 * time.Second),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonDeletedExternally, Retryable: true},
		},
		"main killed by the deletion's SIGTERM": {
			pod: running().After(time.Minute).Deleted(30 * time.Second).After(time.Second).Terminated(143).
				Phase(corev1.PodFailed),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonDeletedExternally, Exit: exit(143), Retryable: true},
		},
		"deleted in the same second main failed on its own (kubectl delete right after the exit)": {
			pod: running().Sidecar("envoy").Running().After(time.Minute).On("base").Terminated(2).
				Deleted(0),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, Exit: exit(2)},
		},
		"main killed by a signal in the same second the deletion was requested": {
			pod:  running().After(time.Minute).Deleted(0).On("base").Terminated(143),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonDeletedExternally, Exit: exit(143), Retryable: true},
		},
		"deleted after main had exited 0": {
			pod: running().Sidecar("envoy").Running().After(time.Minute).On("base").Terminated(0).
				After(time.Minute).Deleted(30 * time.Second),
			want: outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0)},
		},
		"deleted after main had failed on its own": {
			pod: running().Sidecar("envoy").Running().After(time.Minute).On("base").Terminated(5).
				After(time.Minute).Deleted(30 * time.Second),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, Exit: exit(5)},
		},
		"pod gone": {
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonDeletedExternally, Retryable: true},
		},
		"pod gone after kubetask cancelled the task": {
			policy: &podstate.Policy{MainContainer: "base", CancelledAt: podtest.T0},
			want:   outcome{Phase: podstate.Failed, Reason: podstate.ReasonCancelled},
		},
		"cancelled while main runs": {
			pod:    running().After(time.Minute),
			policy: &podstate.Policy{MainContainer: "base", CancelledAt: podtest.T0.Add(time.Minute)},
			want:   outcome{Phase: podstate.Failed, Reason: podstate.ReasonCancelled, StopPod: true},
		},
		"cancelled, main killed by the stop": {
			pod: running().After(time.Minute).ActiveDeadlineSeconds(61).
				After(2*time.Second).Terminated(137).Phase(corev1.PodFailed).Reason("DeadlineExceeded", ""),
			policy: &podstate.Policy{MainContainer: "base", CancelledAt: podtest.T0.Add(90 * time.Second)},
			want:   outcome{Phase: podstate.Failed, Reason: podstate.ReasonCancelled, Exit: exit(137)},
		},
		"cancelled after main had exited 0": {
			pod:    running().Sidecar("envoy").Running().After(time.Minute).On("base").Terminated(0),
			policy: &podstate.Policy{MainContainer: "base", CancelledAt: podtest.T0.Add(5 * time.Minute)},
			after:  5 * time.Minute,
			want:   outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, Exit: exit(0), StopPod: true},
		},

		// --- timeouts ---
		"run timeout not reached": {
			pod:    running(),
			policy: &podstate.Policy{MainContainer: "base", RunTimeout: time.Hour},
			after:  59 * time.Minute,
			want:   outcome{Phase: podstate.Running, Reason: podstate.ReasonRunning},
		},
		"run timeout reached while main runs": {
			pod:    running().Sidecar("envoy").Running(),
			policy: &podstate.Policy{MainContainer: "base", RunTimeout: time.Hour},
			after:  time.Hour,
			want:   outcome{Phase: podstate.Failed, Reason: podstate.ReasonRunTimeout, StopPod: true},
			msg:    "run timeout (1h0m0s)",
		},
		"main killed after the run timeout": {
			pod: running().ActiveDeadlineSeconds(3631).After(time.Hour+time.Minute).Terminated(137).
				Phase(corev1.PodFailed).Reason("DeadlineExceeded", ""),
			policy: &podstate.Policy{MainContainer: "base", RunTimeout: time.Hour},
			want:   outcome{Phase: podstate.Failed, Reason: podstate.ReasonRunTimeout, Exit: exit(137)},
		},

		// --- broken inputs ---
		"no container matches the main container name": {
			pod:    running(),
			policy: &podstate.Policy{MainContainer: "app"},
			want:   outcome{Phase: podstate.Failed, Reason: podstate.ReasonConfigError, StopPod: true},
			msg:    `no regular container named "app"`,
		},
		"several containers and no main container named": {
			pod:    pod().Scheduled().Main("app").Running().Sidecar("envoy").Running(),
			policy: &podstate.Policy{},
			want:   outcome{Phase: podstate.Failed, Reason: podstate.ReasonConfigError, StopPod: true},
			msg:    "spec.mainContainer",
		},
		"pod Succeeded without a status for main": {
			pod:  pod().Phase(corev1.PodSucceeded),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonConfigError},
		},
		"pod Succeeded but main has no termination record": {
			pod:  pod().Scheduled().Main("base").Phase(corev1.PodSucceeded),
			want: outcome{Phase: podstate.Failed, Reason: podstate.ReasonPodFailed, Retryable: true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := policy
			if tc.policy != nil {
				p = *tc.policy
			}
			var in *corev1.Pod
			now := podtest.T0.Add(tc.after)
			if tc.pod != nil {
				in = tc.pod.Obj()
				now = tc.pod.Now().Add(tc.after)
			}
			before := in.DeepCopy()
			got := podstate.Derive(in, p, now)
			if diff := cmp.Diff(tc.want, outcome{got.Phase, got.Reason, got.ExitCode, got.Retryable, got.StopPod}); diff != "" {
				t.Errorf("Derive() mismatch (-want +got):\n%s\nmessage: %s", diff, got.Message)
			}
			if got.Message == "" {
				t.Error("Derive() returned an empty message")
			}
			if !strings.Contains(got.Message, tc.msg) {
				t.Errorf("message %q does not contain %q", got.Message, tc.msg)
			}
			if diff := cmp.Diff(before, in); diff != "" {
				t.Errorf("Derive() mutated its input:\n%s", diff)
			}
		})
	}
}

func TestDeriveRecheck(t *testing.T) {
	cases := map[string]struct {
		pod    *podtest.PodWrapper
		policy podstate.Policy
		after  time.Duration
		want   time.Time
	}{
		"unschedulable: when the schedule timeout expires": {
			pod:    pod().Main("base").Unschedulable("no nodes"),
			policy: policy,
			after:  time.Minute,
			want:   podtest.T0.Add(10 * time.Minute),
		},
		"image pull backoff: when the grace expires, before the startup timeout": {
			pod:    pod().After(time.Minute).Scheduled().Main("base").Waiting("ImagePullBackOff", ""),
			policy: policy,
			want:   podtest.T0.Add(4 * time.Minute),
		},
		"running: when the run timeout expires": {
			pod:    running(),
			policy: podstate.Policy{MainContainer: "base", RunTimeout: time.Hour},
			want:   podtest.T0.Add(30*time.Second + time.Hour),
		},
		"running: when activeDeadlineSeconds passes": {
			pod:    running().ActiveDeadlineSeconds(600),
			policy: podstate.Policy{MainContainer: "base", RunTimeout: time.Hour},
			want:   podtest.T0.Add(600 * time.Second),
		},
		"running without timeouts: nothing to recheck": {
			pod:    running(),
			policy: podstate.Policy{MainContainer: "base"},
		},
		"terminal: nothing to recheck": {
			pod:    running().Terminated(0),
			policy: policy,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := podstate.Derive(tc.pod.Obj(), tc.policy, tc.pod.Now().Add(tc.after))
			if !got.Recheck.Equal(tc.want) {
				t.Errorf("Recheck = %v, want %v (state %v)", got.Recheck, tc.want, got)
			}
			if !got.Recheck.IsZero() {
				later := podstate.Derive(tc.pod.Obj(), tc.policy, got.Recheck)
				if later.Phase == podstate.Derive(tc.pod.Obj(), tc.policy, got.Recheck.Add(-time.Nanosecond)).Phase {
					t.Errorf("state does not change at Recheck %v: %v", got.Recheck, later)
				}
			}
		})
	}
}

func TestStopDeadlineSeconds(t *testing.T) {
	cases := map[string]struct {
		pod    *podtest.PodWrapper
		after  time.Duration
		want   int64
		wantOK bool
	}{
		"not on a node yet":              {pod: pod().Main("base"), wantOK: false},
		"started 90s ago":                {pod: running(), after: 60 * time.Second, want: 91, wantOK: true},
		"started just now":               {pod: running(), want: 31, wantOK: true},
		"never raises the user's value":  {pod: running().ActiveDeadlineSeconds(20), after: time.Minute, want: 20, wantOK: true},
		"lowers a larger existing value": {pod: running().ActiveDeadlineSeconds(3600), after: time.Minute, want: 91, wantOK: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := tc.pod.Obj()
			got, ok := podstate.StopDeadlineSeconds(p, tc.pod.Now().Add(tc.after))
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("StopDeadlineSeconds() = %d, %v; want %d, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// A main container that finished before kubetask stopped the pod with
// StopDeadlineSeconds keeps its outcome, whatever the sidecars do afterwards.
func TestStopDeadlineKeepsMainOutcome(t *testing.T) {
	for _, code := range []int32{0, 1, 137} {
		w := running().Sidecar("envoy").Running().After(17 * time.Minute).On("base").Terminated(code).
			After(400 * time.Millisecond)
		secs, ok := podstate.StopDeadlineSeconds(w.Obj(), w.Now())
		if !ok {
			t.Fatal("StopDeadlineSeconds() not ok for a started pod")
		}
		w.ActiveDeadlineSeconds(secs).After(time.Duration(secs)*time.Second).On("envoy").Terminated(137).
			Phase(corev1.PodFailed).Reason("DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
		got := podstate.Derive(w.Obj(), policy, w.Now())
		if got.ExitCode == nil || *got.ExitCode != code || (got.Reason != podstate.ReasonCompleted && got.Reason != podstate.ReasonExitCode) {
			t.Errorf("exit %d: after stopping sidecars got %v", code, got)
		}
	}
}

func TestReasonsAreDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/states.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[podstate.Reason]bool{}
	for _, r := range append(slices.Clone(podstate.Reasons), podstate.LifecycleReasons...) {
		if seen[r] {
			t.Errorf("reason %s listed twice", r)
		}
		seen[r] = true
		if !strings.Contains(string(doc), "| `"+string(r)+"` |") {
			t.Errorf("reason %s has no row in docs/states.md", r)
		}
	}
	if len(podstate.Reasons) != 23 {
		t.Errorf("Reasons has %d entries; update docs/states.md when the set changes", len(podstate.Reasons))
	}
}
