package podstate_test

import (
	"slices"

	"github.com/google/go-cmp/cmp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/podstate"
)

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
	return podtest.T0.Add(time.Duration(g.pick(240)) * 30 * time.Second)
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

// fuzzPod builds an arbitrary pod (and policy and time) from data. Containers are named
// "base" (usually the main one), "s0", "s1" (regular sidecars), "i0", "i1" (init
// containers or native sidecars).
func fuzzPod(data []byte) (*corev1.Pod, podstate.Policy, time.Time) {
	g := &gen{b: data}
	if g.pick(16) == 0 {
		return nil, podstate.Policy{MainContainer: "base"}, g.at()
	}
	pod := podtest.MakePod("p", "ns").Obj()
	pod.Spec.RestartPolicy = pickOf(g, corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure, corev1.RestartPolicyAlways, "")
	names := pickOf(g, []string{"base"}, []string{"base", "s0"}, []string{"s0", "base", "s1"}, []string{"s0", "s1"}, []string{}, []string{"s0"})
	for _, n := range names {
		c := corev1.Container{Name: n, Image: "img/" + n}
		if g.pick(8) == 0 {
			c.RestartPolicy = ptrTo(pickOf(g, corev1.ContainerRestartPolicyNever, corev1.ContainerRestartPolicyOnFailure, corev1.ContainerRestartPolicyAlways))
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
			c.RestartPolicy = ptrTo(corev1.ContainerRestartPolicyAlways)
		}
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, c)
		if g.pick(4) != 0 {
			pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, g.status(n))
		}
	}
	pod.Status.Phase = pickOf(g, corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed, corev1.PodUnknown, "")
	pod.Status.Reason = pickOf(g, "", "", "Evicted", "DeadlineExceeded", "Terminated", "Shutdown", "NodeLost", "OutOfcpu")
	if g.pick(2) == 0 {
		pod.Spec.NodeName = "node-1"
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
		pod.Spec.ActiveDeadlineSeconds = ptrTo(pickOf[int64](g, 1, 60, 3600, -5, 1<<62))
	}
	if g.pick(4) == 0 {
		t := metav1.NewTime(g.at())
		pod.DeletionTimestamp = &t
		pod.DeletionGracePeriodSeconds = ptrTo(pickOf[int64](g, 0, 30, -1))
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
	return pod, p, g.at()
}

func ptrTo[T any](v T) *T { return &v }

var phaseReasons = map[podstate.Phase][]podstate.Reason{
	podstate.Pending: {podstate.ReasonScheduling, podstate.ReasonUnschedulable, podstate.ReasonInitializing,
		podstate.ReasonStarting, podstate.ReasonImagePullFailed, podstate.ReasonConfigError},
	podstate.Running:   {podstate.ReasonRunning, podstate.ReasonRestarting},
	podstate.Succeeded: {podstate.ReasonCompleted},
}

// FuzzDerive checks that Derive is total and keeps its invariants on arbitrary pods.
// Seeds live in testdata/fuzz/FuzzDerive; run `go test -fuzz FuzzDerive ./internal/podstate`.
func FuzzDerive(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 3, 3, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		pod, p, now := fuzzPod(data)
		s := podstate.Derive(pod, p, now)
		checkInvariants(t, pod, p, s)

		// Trim keeps everything Derive reads: an informer that caches trimmed
		// pods decides exactly as one that caches whole pods.
		if pod != nil {
			trimmed := pod.DeepCopy()
			podstate.Trim(trimmed)
			if got := podstate.Derive(trimmed, p, now); !cmp.Equal(got, s) {
				t.Fatalf("Derive(Trim(pod)) differs from Derive(pod):\n%s", cmp.Diff(s, got))
			}
		}

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
