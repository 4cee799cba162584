package podstate_test

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/podstate"
)

var phaseReasons = map[podstate.Phase][]podstate.Reason{
	podstate.Pending: {podstate.ReasonScheduling, podstate.ReasonUnschedulable, podstate.ReasonInitializing,
		podstate.ReasonStarting, podstate.ReasonImagePullFailed, podstate.ReasonConfigError},
	podstate.Running:   {podstate.ReasonRunning, podstate.ReasonRestarting},
	podstate.Succeeded: {podstate.ReasonCompleted},
}

// FuzzDerive checks that Derive is total and keeps its invariants on arbitrary pods
// (podtest.Arbitrary). Seeds live in testdata/fuzz/FuzzDerive; run
// `go test -fuzz FuzzDerive ./pkg/podstate`. The executor's FuzzCachedPod checks, on
// the same pods, that its compact pod cache keeps everything Derive reads.
func FuzzDerive(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 3, 3, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		pod, p, now := podtest.Arbitrary(data)
		s := podstate.Derive(pod, p, now)
		checkInvariants(t, pod, p, s)

		// The statuses of regular containers other than the main one never change
		// the outcome: drop them, or replace them with other states.
		if pod == nil {
			return
		}
		main := p.MainContainer
		if main == "" {
			main = podstate.DefaultMainContainer(&pod.Spec)
		}
		for _, variant := range []func(*corev1.ContainerStatus){
			nil, // removed
			func(st *corev1.ContainerStatus) {
				st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}}
			},
			func(st *corev1.ContainerStatus) {
				st.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}
				st.RestartCount = 7
			},
		} {
			other := pod.DeepCopy()
			other.Status.ContainerStatuses = slices.DeleteFunc(other.Status.ContainerStatuses, func(st corev1.ContainerStatus) bool {
				return variant == nil && st.Name != main
			})
			for i := range other.Status.ContainerStatuses {
				if st := &other.Status.ContainerStatuses[i]; st.Name != main && variant != nil {
					variant(st)
				}
			}
			o := podstate.Derive(other, p, now)
			if o.Phase != s.Phase || o.Reason != s.Reason || o.Retryable != s.Retryable || !equalPtr(o.ExitCode, s.ExitCode) {
				t.Fatalf("sidecar statuses changed the outcome: %v -> %v", s, o)
			}
		}
	})
}

func checkInvariants(t *testing.T, pod *corev1.Pod, p podstate.Policy, s podstate.State) {
	t.Helper()
	if !slices.Contains(podstate.Reasons, s.Reason) {
		t.Fatalf("reason %q is not in the closed set: %v", s.Reason, s)
	}
	if s.Message == "" {
		t.Fatalf("empty message: %v", s)
	}
	if allowed, ok := phaseReasons[s.Phase]; ok && !slices.Contains(allowed, s.Reason) {
		t.Fatalf("reason %s is not a %s reason", s.Reason, s.Phase)
	}
	if s.Phase != podstate.Failed && s.Phase != podstate.Succeeded && s.Phase != podstate.Pending && s.Phase != podstate.Running {
		t.Fatalf("unknown phase %q", s.Phase)
	}
	if s.Retryable != (s.Phase == podstate.Failed && s.Reason.Retryable()) {
		t.Fatalf("Retryable inconsistent: %v", s)
	}
	if !s.Terminal() && (s.StopPod || s.ExitCode != nil) {
		t.Fatalf("non-terminal state with StopPod or ExitCode: %v", s)
	}
	if s.Terminal() && !s.Recheck.IsZero() {
		t.Fatalf("terminal state with Recheck: %v", s)
	}
	if pod == nil {
		if s.Phase != podstate.Failed || s.StopPod {
			t.Fatalf("gone pod: %v", s)
		}
		return
	}
	main := p.MainContainer
	if main == "" {
		main = podstate.DefaultMainContainer(&pod.Spec)
	}
	var term *corev1.ContainerStateTerminated
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == main {
			term = st.State.Terminated
		}
	}
	if s.Phase == podstate.Succeeded && (term == nil || term.ExitCode != 0 || s.ExitCode == nil || *s.ExitCode != 0) {
		t.Fatalf("Succeeded without main %q terminated with 0: %v", main, s)
	}
	if s.ExitCode != nil && (term == nil || term.ExitCode != *s.ExitCode) {
		t.Fatalf("exit code %d does not come from main %q: %v", *s.ExitCode, main, s)
	}
	if (s.Reason == podstate.ReasonExitCode || s.Reason == podstate.ReasonOOMKilled) && term == nil {
		t.Fatalf("%s without a terminated main container: %v", s.Reason, s)
	}
	if s.StopPod && (pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded) {
		t.Fatalf("StopPod for a pod that is finished or being deleted: %v", s)
	}
}

func equalPtr(a, b *int32) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
