package podstate_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/podstate"
)

// TestScheduleTimeoutAndSchedulingGates: time behind scheduling gates (a queue
// such as Kueue holding the pod) is not scheduling time (issue 9, defect j).
func TestScheduleTimeoutAndSchedulingGates(t *testing.T) {
	gatedFor := func(d time.Duration) *podtest.PodWrapper { return pod().Main("base").SchedulingGated().After(d) }
	cases := map[string]struct {
		pod       *podtest.PodWrapper
		ungatedAt time.Duration // after T0; 0: not known
		after     time.Duration
		want      podstate.Reason
	}{
		"gated far beyond the schedule timeout still waits": {
			pod: gatedFor(0), after: 1000 * time.Hour, want: podstate.ReasonScheduling,
		},
		"ungated after 30 minutes, unschedulable 5 minutes later: waiting": {
			pod: gatedFor(30 * time.Minute).Ungated().Unschedulable("0/1 nodes"), ungatedAt: 30 * time.Minute,
			after: 5 * time.Minute, want: podstate.ReasonUnschedulable,
		},
		"ungated after 30 minutes, unschedulable for the schedule timeout: timed out": {
			pod: gatedFor(30 * time.Minute).Ungated().Unschedulable("0/1 nodes"), ungatedAt: 30 * time.Minute,
			after: 10 * time.Minute, want: podstate.ReasonScheduleTimeout,
		},
		"ungated with the stale SchedulingGated condition: waiting for the scheduler": {
			pod: gatedFor(30 * time.Minute).Ungated(), ungatedAt: 30 * time.Minute,
			after: time.Minute, want: podstate.ReasonScheduling,
		},
		"ungated time unknown: counts from creation": {
			pod: gatedFor(30 * time.Minute).Ungated().Unschedulable("0/1 nodes"), want: podstate.ReasonScheduleTimeout,
		},
		"an UngatedAt before creation does not extend the timeout": {
			pod: pod().Main("base").Unschedulable("0/1 nodes"), ungatedAt: -time.Hour,
			after: 10 * time.Minute, want: podstate.ReasonScheduleTimeout,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := policy
			if tc.ungatedAt != 0 {
				p.UngatedAt = podtest.T0.Add(tc.ungatedAt)
			}
			got := podstate.Derive(tc.pod.Obj(), p, tc.pod.Now().Add(tc.after))
			if got.Reason != tc.want {
				t.Errorf("reason %s, want %s (%v)", got.Reason, tc.want, got)
			}
		})
	}
}

// TestDeriveTimed: a terminal state the clock decided is marked Timed, one the
// pod reports is not (issue 9, defect d: such decisions are confirmed on a
// fresh read).
func TestDeriveTimed(t *testing.T) {
	cases := map[string]struct {
		pod   *podtest.PodWrapper
		p     podstate.Policy
		after time.Duration
		want  podstate.Reason
		timed bool
	}{
		"schedule timeout": {
			pod: pod().Main("base").Unschedulable("0/1"), p: policy, after: 10 * time.Minute,
			want: podstate.ReasonScheduleTimeout, timed: true,
		},
		"startup timeout": {
			pod: pod().Scheduled().Main("base"), p: policy, after: 10 * time.Minute,
			want: podstate.ReasonStartupTimeout, timed: true,
		},
		"run timeout of a running main container": {
			pod: running(), p: podstate.Policy{MainContainer: "base", RunTimeout: time.Minute}, after: time.Minute,
			want: podstate.ReasonRunTimeout, timed: true,
		},
		"image pull beyond its grace": {
			pod: pod().Scheduled().Main("base").Waiting("ImagePullBackOff", ""), p: policy, after: 3 * time.Minute,
			want: podstate.ReasonImagePullFailed, timed: true,
		},
		"activeDeadlineSeconds passed by the clock only": {
			pod: running().ActiveDeadlineSeconds(60), p: policy, after: 2 * time.Minute,
			want: podstate.ReasonDeadlineExceeded, timed: true,
		},
		"activeDeadlineSeconds reported by the kubelet": {
			pod: running().ActiveDeadlineSeconds(60).After(2*time.Minute).On("base").Terminated(137).
				Phase(corev1.PodFailed).Reason("DeadlineExceeded", "Pod was active on the node longer than the specified deadline"),
			p: policy, want: podstate.ReasonDeadlineExceeded,
		},
		"main container exited": {
			pod: running().After(time.Minute).On("base").Terminated(3), p: policy, after: time.Hour,
			want: podstate.ReasonExitCode,
		},
		"image pull with no grace fails at once, not by the clock": {
			pod: pod().Scheduled().Main("base").Waiting("ImagePullBackOff", ""), p: podstate.Policy{MainContainer: "base"},
			want: podstate.ReasonImagePullFailed,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := podstate.Derive(tc.pod.Obj(), tc.p, tc.pod.Now().Add(tc.after))
			if got.Reason != tc.want || got.Timed != tc.timed {
				t.Errorf("got %s timed=%v, want %s timed=%v (%v)", got.Reason, got.Timed, tc.want, tc.timed, got)
			}
		})
	}
}

// TestStopped is the rule for "no container of the pod runs any more".
func TestStopped(t *testing.T) {
	cases := map[string]struct {
		pod  *podtest.PodWrapper // nil: gone
		want bool
	}{
		"gone":                                    {nil, true},
		"never scheduled":                         {pod().Main("base"), true},
		"never scheduled, being deleted":          {pod().Main("base").Deleted(30 * time.Second), true},
		"running":                                 {running(), false},
		"main exited, sidecar running":            {running().Sidecar("envoy").Running().After(time.Minute).On("base").Terminated(0), false},
		"pod Failed":                              {running().On("base").Terminated(1).Phase(corev1.PodFailed), true},
		"pod Succeeded":                           {running().On("base").Terminated(0).Phase(corev1.PodSucceeded), true},
		"being deleted with a grace period":       {running().Deleted(30 * time.Second), false},
		"deleted with grace 0 (kubelet or force)": {running().Deleted(0), true},
		"phase Unknown (node lost)":               {running().Phase(corev1.PodUnknown), false},
		"being deleted, every container reported terminated": {
			running().Sidecar("envoy").Running().Deleted(30 * time.Second).On("base").Terminated(143).On("envoy").Terminated(0), true},
		"being deleted, a sidecar still running": {
			running().Sidecar("envoy").Running().Deleted(30 * time.Second).On("base").Terminated(143), false},
		"being deleted, deletion deadline long passed, still reported running": {
			running().Deleted(30 * time.Second).After(time.Hour), false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var p *corev1.Pod
			if tc.pod != nil {
				p = tc.pod.Obj()
			}
			if got := podstate.Stopped(p); got != tc.want {
				t.Errorf("Stopped = %v, want %v", got, tc.want)
			}
		})
	}
}
