package executor

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// recorded drains a fake recorder's events ("Type Reason message").
func recorded(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestPodEvents: the Kubernetes Events each executor event means for a
// person reading kubectl describe pod, on the pod it names (by UID: none
// without one); a retry's events go to the ended attempt's pod until the
// next attempt has one.
func TestPodEvents(t *testing.T) {
	pod0, pod1 := "ns/job-0", "ns/job-1"
	cases := map[string]struct {
		events []Event
		want   []string // "Type Reason" prefixes, in order
	}{
		"succeeded with a result, sidecars stopped, released": {
			events: []Event{
				{ID: "a", Type: EventPodCreated, Pod: pod0, PodUID: "u0"},
				{ID: "a", Type: EventAttemptFinished, Pod: pod0, PodUID: "u0", Phase: "Succeeded", Reason: "Completed", Terminal: true, Result: []byte(`{"rows":5}`)},
				{ID: "a", Type: EventPodStopping, Pod: pod0, PodUID: "u0"},
				{ID: "a", Type: EventPodReleased, Pod: pod0, PodUID: "u0"},
			},
			want: []string{"Normal AttemptSucceeded attempt 0 succeeded (Completed)", "Normal ResultRead read the task's result, 10 bytes",
				"Normal StoppingSidecars", "Normal Released"},
		},
		"failed, a retry scheduled and waiting for a slot on the failed pod; none once the next has a pod": {
			events: []Event{
				{ID: "a", Type: EventAttemptFinished, Pod: pod0, PodUID: "u0", Phase: "Failed", Reason: "OOMKilled", Message: "main container \"main\" was OOMKilled"},
				{ID: "a", Attempt: 1, Type: EventState, Phase: "Pending", Reason: reasonRetryBackoff, Message: "attempt 0 ended Failed/OOMKilled; attempt 1 starts in 10s"},
				{ID: "a", Attempt: 1, Type: EventState, Phase: "Pending", Reason: reasonWaitingForSlot, Message: "all 1 slots in use"},
				{ID: "a", Attempt: 1, Type: EventPodCreated, Pod: pod1, PodUID: "u1"},
				{ID: "a", Attempt: 1, Type: EventState, Phase: "Pending", Reason: reasonWaitingForSlot, Message: "not the pod's to say"},
			},
			want: []string{`Warning AttemptFailed attempt 0 failed (OOMKilled): main container "main" was OOMKilled`,
				"Normal RetryScheduled attempt 0 ended Failed/OOMKilled; attempt 1 starts in 10s", "Normal WaitingForSlot attempt 1 waits for a slot: all 1 slots in use"},
		},
		"no pod, or no UID: nothing": {
			events: []Event{
				{ID: "a", Type: EventAttemptFinished, Phase: "Failed", Reason: "Cancelled", Terminal: true},
				{ID: "b", Type: EventPodStopping, Pod: pod0},
				{ID: "c", Type: EventState, Phase: "Pending", Reason: reasonWaitingForSlot},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rec := record.NewFakeRecorder(20)
			e := &Executor{cfg: Config{Recorder: rec}}
			for _, ev := range tc.events {
				e.tellPod(ev)
			}
			got := recorded(rec)
			if len(got) != len(tc.want) {
				t.Fatalf("events %q, want %d: %q", got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("event %d: %q, want %q...", i, got[i], tc.want[i])
				}
			}
			if n := len(e.lastPods.last); n != 0 && name != "failed, a retry scheduled and waiting for a slot on the failed pod; none once the next has a pod" {
				t.Errorf("%d pods remembered after the events", n)
			}
		})
	}
}

// refRecorder keeps the objects and reasons of the events it is given.
type refRecorder struct {
	refs    []*corev1.ObjectReference
	reasons []string
}

func (r *refRecorder) Event(obj runtime.Object, _, reason, _ string) {
	ref, _ := obj.(*corev1.ObjectReference)
	r.refs, r.reasons = append(r.refs, ref), append(r.reasons, reason)
}

func (r *refRecorder) Eventf(obj runtime.Object, typ, reason, _ string, _ ...any) {
	r.Event(obj, typ, reason, "")
}

func (r *refRecorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, typ, reason, _ string, _ ...any) {
	r.Event(obj, typ, reason, "")
}

// TestPodEventsFromASync: a real pass records its events on the attempt's
// pod, named by its namespace, name and UID (what kubectl describe finds
// them by): the failed attempt's outcome, then the retry scheduled.
func TestPodEventsFromASync(t *testing.T) {
	rec := &refRecorder{}
	f := newFx(t, func(c *Config) { c.Recorder = rec })
	f.submit("a", newTask(retryOn("ExitCode")))
	pod := f.podOf("a", 0, mainExited(1))
	pod.UID = "uid-0"
	f.both(pod)
	if _, _, err := f.sync("a"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rec.reasons, []string{PodEventFailed, PodEventRetry}) {
		t.Errorf("events %q; want AttemptFailed then RetryScheduled", rec.reasons)
	}
	for i, ref := range rec.refs {
		if ref == nil || ref.Kind != "Pod" || ref.Namespace != pod.Namespace || ref.Name != pod.Name || ref.UID != "uid-0" {
			t.Errorf("event %s names %+v, want pod %s/%s uid-0", rec.reasons[i], ref, pod.Namespace, pod.Name)
		}
	}
}
