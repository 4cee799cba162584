package podlog

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestProgressOf(t *testing.T) {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	exited := func(code int32) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}
	}
	waiting := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	always := corev1.ContainerRestartPolicyAlways
	never := corev1.ContainerRestartPolicyNever
	restartOn42 := []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart,
		ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{42}}}}
	type status struct {
		state    corev1.ContainerState
		last     corev1.ContainerState
		restarts int32
	}
	for name, tc := range map[string]struct {
		policy   corev1.RestartPolicy
		phase    corev1.PodPhase
		deleting bool
		grace0   bool // deleted with grace period 0 (forced, or by a kubelet that stopped everything)
		init     bool
		c        corev1.Container
		st       *status
		want     Progress
	}{
		"no status yet":             {policy: corev1.RestartPolicyNever, want: Progress{NeverRestarts: true}},
		"waiting":                   {policy: corev1.RestartPolicyNever, st: &status{state: waiting}, want: Progress{NeverRestarts: true}},
		"running":                   {policy: corev1.RestartPolicyNever, st: &status{state: running}, want: Progress{Started: true, NeverRestarts: true}},
		"exited under Never":        {policy: corev1.RestartPolicyNever, st: &status{state: exited(1)}, want: Progress{Started: true, Terminated: true, NeverRestarts: true}},
		"failed under OnFailure":    {policy: corev1.RestartPolicyOnFailure, st: &status{state: exited(1)}, want: Progress{Started: true}},
		"succeeded under OnFailure": {policy: corev1.RestartPolicyOnFailure, st: &status{state: exited(0)}, want: Progress{Started: true, Terminated: true}},
		"waiting to restart": {policy: corev1.RestartPolicyOnFailure, st: &status{state: waiting, last: exited(1), restarts: 2},
			want: Progress{Started: true, RestartCount: 2}},
		"exited, pod deleted": {policy: corev1.RestartPolicyAlways, deleting: true, st: &status{state: exited(1)},
			want: Progress{Started: true, Terminated: true}},
		"running, pod deleted with a grace period": {policy: corev1.RestartPolicyNever, deleting: true, st: &status{state: running},
			want: Progress{Started: true, NeverRestarts: true}},
		// A forced deletion (or a node's pods evicted by a simulated node)
		// leaves the container's last status Running for good: nothing runs
		// any more as far as the control plane knows (podstate.Stopped), so
		// the log is as complete as it gets.
		"running, pod deleted with grace period 0": {policy: corev1.RestartPolicyNever, deleting: true, grace0: true, st: &status{state: running},
			want: Progress{Started: true, Terminated: true, NeverRestarts: true}},
		"never started, pod deleted with grace period 0": {policy: corev1.RestartPolicyNever, deleting: true, grace0: true, st: &status{state: waiting},
			want: Progress{Terminated: true, NeverRestarts: true}},
		"never started, pod failed": {policy: corev1.RestartPolicyNever, phase: corev1.PodFailed, st: &status{state: waiting},
			want: Progress{Terminated: true, NeverRestarts: true}},
		"restart rule restarts on 42": {policy: corev1.RestartPolicyNever, c: corev1.Container{RestartPolicy: &never, RestartPolicyRules: restartOn42},
			st: &status{state: exited(42)}, want: Progress{Started: true}},
		"restart rule does not match 1": {policy: corev1.RestartPolicyNever, c: corev1.Container{RestartPolicy: &never, RestartPolicyRules: restartOn42},
			st: &status{state: exited(1)}, want: Progress{Started: true, Terminated: true}},
		"init container done under Always": {policy: corev1.RestartPolicyAlways, init: true, st: &status{state: exited(0)},
			want: Progress{Started: true, Terminated: true}},
		"init container failed under Always": {policy: corev1.RestartPolicyAlways, init: true, st: &status{state: exited(1)},
			want: Progress{Started: true}},
		"native sidecar exited": {policy: corev1.RestartPolicyNever, init: true, c: corev1.Container{RestartPolicy: &always},
			st: &status{state: exited(0), restarts: 1}, want: Progress{Started: true, RestartCount: 1}},
		"native sidecar, pod succeeded": {policy: corev1.RestartPolicyNever, phase: corev1.PodSucceeded, init: true, c: corev1.Container{RestartPolicy: &always},
			st: &status{state: exited(0)}, want: Progress{Started: true, Terminated: true}},
		"init container failed under Never": {policy: corev1.RestartPolicyNever, init: true, st: &status{state: exited(1)},
			want: Progress{Started: true, Terminated: true, NeverRestarts: true}},
		"container Never in an Always pod": {policy: corev1.RestartPolicyAlways, c: corev1.Container{RestartPolicy: &never},
			st: &status{state: running}, want: Progress{Started: true, NeverRestarts: true}},
	} {
		t.Run(name, func(t *testing.T) {
			tc.c.Name = "c"
			p := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: tc.policy}, Status: corev1.PodStatus{Phase: tc.phase}}
			if tc.deleting {
				p.DeletionTimestamp = &metav1.Time{}
			}
			if tc.grace0 {
				p.DeletionGracePeriodSeconds = new(int64)
			}
			var sts *[]corev1.ContainerStatus
			if tc.init {
				p.Spec.InitContainers = []corev1.Container{tc.c}
				sts = &p.Status.InitContainerStatuses
			} else {
				p.Spec.Containers = []corev1.Container{tc.c}
				sts = &p.Status.ContainerStatuses
			}
			if tc.st != nil {
				*sts = []corev1.ContainerStatus{{Name: "c", State: tc.st.state, LastTerminationState: tc.st.last, RestartCount: tc.st.restarts}}
			}
			if d := cmp.Diff(tc.want, ProgressOf(p, "c")); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
	if got := ProgressOf(nil, "c"); got != (Progress{Gone: true}) {
		t.Errorf("nil pod: %+v, want Gone", got)
	}
}

func TestTail(t *testing.T) {
	tl := NewTail(3)
	for i := range 5 {
		tl.Add(Line{Text: fmt.Sprint(i), Newline: true})
	}
	// A line in pieces, then an unterminated last line.
	tl.Add(Line{Text: "lo"})
	tl.Add(Line{Text: "ng", Newline: true})
	tl.Add(Line{Text: "end"})
	if d := cmp.Diff([]string{"4", "long", "end"}, tl.Lines()); d != "" {
		t.Error(d)
	}
}
