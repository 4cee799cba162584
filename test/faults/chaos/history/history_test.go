package history

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kubetask/kubetask/pkg/logcapture"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

const ns = "chaos"

var t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// at is t0 plus s seconds.
func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// pod is the pod kubetask builds for attempt of task id (main container
// "main", sidecar "envoy"), with uid.
func pod(tb testing.TB, id string, attempt int, uid string) *corev1.Pod {
	tb.Helper()
	return podOf(tb, id, "", attempt, uid)
}

// podOf is pod of the record with nonce ("": none).
func podOf(tb testing.TB, id, nonce string, attempt int, uid string) *corev1.Pod {
	tb.Helper()
	tk := &task.Task{TypeMeta: metav1.TypeMeta{APIVersion: task.APIVersion, Kind: task.Kind}, ObjectMeta: metav1.ObjectMeta{Name: "t"}}
	tk.Spec.MainContainer = "main"
	tk.Spec.Template.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox"}, {Name: "envoy", Image: "envoy"}}
	p, err := task.BuildPod(tk, task.Identity{Namespace: ns, Name: "t", RunID: id, Executor: "g-shard-1", Nonce: nonce}, attempt)
	if err != nil {
		tb.Fatal(err)
	}
	p.UID = types.UID(uid)
	return p
}

// gated is the pod of attempt of task id's record with nonce n1, created
// behind the fence's gate by a term of epoch 7.
func gated(tb testing.TB, id string, attempt int, uid string) *corev1.Pod {
	tb.Helper()
	p := podOf(tb, id, "n1", attempt, uid)
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: FenceGate}}
	p.Annotations[AnnotationEpoch] = "7"
	return p
}

func raw(tb testing.TB, v any) *runtime.Unknown {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return &runtime.Unknown{Raw: b}
}

// event is a ResponseComplete event received at recv that took 2 ms.
func event(verb, name, sub string, code int32, recv time.Time) auditv1.Event {
	return auditv1.Event{
		TypeMeta: metav1.TypeMeta{APIVersion: "audit.k8s.io/v1", Kind: "Event"},
		Level:    auditv1.LevelRequest, Stage: auditv1.StageResponseComplete, Verb: verb,
		AuditID:                  types.UID(fmt.Sprintf("%s-%s-%d", verb, name, recv.UnixNano())),
		RequestURI:               "/api/v1/namespaces/" + ns + "/pods/" + name,
		ObjectRef:                &auditv1.ObjectReference{Resource: "pods", Namespace: ns, Name: name, Subresource: sub, APIVersion: "v1"},
		ResponseStatus:           &metav1.Status{Code: code},
		RequestReceivedTimestamp: metav1.NewMicroTime(recv),
		StageTimestamp:           metav1.NewMicroTime(recv.Add(2 * time.Millisecond)),
	}
}

// h builds the audit events of a history.
type h struct {
	tb  testing.TB
	evs []auditv1.Event
}

func (h *h) create(p *corev1.Pod, s float64) *h {
	ev := event("create", p.Name, "", 201, at(s))
	ev.Level = auditv1.LevelRequestResponse
	ev.RequestURI = "/api/v1/namespaces/" + ns + "/pods"
	ev.ResponseObject = raw(h.tb, p)
	h.evs = append(h.evs, ev)
	return h
}

// createFails is a create answered AlreadyExists.
func (h *h) createFails(p *corev1.Pod, s float64) *h {
	ev := event("create", p.Name, "", 409, at(s))
	ev.RequestURI = "/api/v1/namespaces/" + ns + "/pods"
	h.evs = append(h.evs, ev)
	return h
}

func (h *h) bind(p *corev1.Pod, node string, s float64) *h {
	ev := event("create", p.Name, "binding", 201, at(s))
	ev.RequestObject = raw(h.tb, corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns, UID: p.UID}, Target: corev1.ObjectReference{Kind: "Node", Name: node}})
	h.evs = append(h.evs, ev)
	return h
}

// status is a strategic merge patch of pods/status naming the containers
// given: "running" (started at s, in whole seconds as a node writes it), or
// an exit code (a container that never started: no startedAt).
func (h *h) status(p *corev1.Pod, s float64, containers map[string]any) *h {
	var cs []map[string]any
	for name, st := range containers {
		state := map[string]any{"running": map[string]any{"startedAt": metav1.NewTime(at(math.Floor(s)))}}
		if code, ok := st.(int); ok {
			state = map[string]any{"terminated": map[string]any{"exitCode": code, "reason": "Completed"}}
		}
		cs = append(cs, map[string]any{"name": name, "state": state})
	}
	ev := event("patch", p.Name, "status", 200, at(s))
	ev.RequestObject = raw(h.tb, map[string]any{"metadata": map[string]any{"uid": p.UID}, "status": map[string]any{
		"$setElementOrder/containerStatuses": []map[string]string{{"name": "main"}, {"name": "envoy"}}, "containerStatuses": cs}})
	h.evs = append(h.evs, ev)
	return h
}

// phase is a status update (PUT of the whole pod) with a phase.
func (h *h) phase(p *corev1.Pod, s float64, phase corev1.PodPhase) *h {
	q := p.DeepCopy()
	q.Status.Phase = phase
	ev := event("update", p.Name, "status", 200, at(s))
	ev.RequestObject = raw(h.tb, q)
	h.evs = append(h.evs, ev)
	return h
}

// del deletes with grace seconds (-1: none given).
func (h *h) del(p *corev1.Pod, s float64, grace int64) *h {
	ev := event("delete", p.Name, "", 200, at(s))
	opts := metav1.DeleteOptions{TypeMeta: metav1.TypeMeta{Kind: "DeleteOptions", APIVersion: "meta.k8s.io/v1"}}
	if grace >= 0 {
		opts.GracePeriodSeconds = &grace
	}
	ev.RequestObject = raw(h.tb, opts)
	h.evs = append(h.evs, ev)
	return h
}

// forceByQuery deletes with ?gracePeriodSeconds=0 and no body.
func (h *h) forceByQuery(p *corev1.Pod, s float64) *h {
	ev := event("delete", p.Name, "", 200, at(s))
	ev.RequestURI += "?gracePeriodSeconds=0"
	h.evs = append(h.evs, ev)
	return h
}

// createUnanswered is a create answered 504: the request's pod, no UID.
func (h *h) createUnanswered(p *corev1.Pod, s float64) *h {
	q := p.DeepCopy()
	q.UID = ""
	ev := event("create", p.Name, "", 504, at(s))
	ev.RequestURI = "/api/v1/namespaces/" + ns + "/pods"
	ev.RequestObject = raw(h.tb, q)
	h.evs = append(h.evs, ev)
	return h
}

// discard is kubetask's discard of a stray pod: a delete with p's UID as
// precondition, then a JSON patch that tests the UID and removes the
// finalizer.
func (h *h) discard(p *corev1.Pod, s float64) *h {
	ev := event("delete", p.Name, "", 200, at(s))
	ev.RequestObject = raw(h.tb, map[string]any{"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "preconditions": map[string]any{"uid": p.UID}})
	h.evs = append(h.evs, ev)
	ev = event("patch", p.Name, "", 200, at(s+0.1))
	ev.RequestObject = raw(h.tb, []map[string]any{{"op": "test", "path": "/metadata/uid", "value": p.UID}, {"op": "remove", "path": "/metadata/finalizers/0"}})
	h.evs = append(h.evs, ev)
	return h
}

func (h *h) evict(p *corev1.Pod, s float64) *h {
	h.evs = append(h.evs, event("create", p.Name, "eviction", 201, at(s)))
	return h
}

func (h *h) ungate(p *corev1.Pod, s float64) *h {
	ev := event("patch", p.Name, "", 200, at(s))
	ev.RequestObject = &runtime.Unknown{Raw: []byte(`{"spec":{"schedulingGates":null}}`)}
	h.evs = append(h.evs, ev)
	return h
}

// run is a whole clean life of p on node sim-0 from s: bound, main exits
// code at s+2 while envoy runs, deleted by the executor at s+3 and removed
// by the node at once.
func (h *h) run(p *corev1.Pod, s float64, code int) *h {
	return h.create(p, s).bind(p, "sim-0", s+0.1).
		status(p, s+0.5, map[string]any{"main": "running", "envoy": "running"}).
		status(p, s+2, map[string]any{"main": code, "envoy": "running"}).
		del(p, s+3, 30).del(p, s+3.1, 0)
}

// log renders the events as an audit log.
func (h *h) log() []byte {
	var b bytes.Buffer
	for _, ev := range h.evs {
		line, err := json.Marshal(ev)
		if err != nil {
			h.tb.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func exit(c int32) *int32 { return &c }

// outcome is attempt a's outcome, recorded at s.
func outcome(a int, phase, reason string, code *int32, s float64) store.AttemptOutcome {
	return store.AttemptOutcome{Attempt: a, Phase: phase, Reason: reason, ExitCode: code, ObservedAt: at(s), FinishedAt: at(s - 0.5)}
}

// record is a terminal record with outcomes.
func record(id string, outs ...store.AttemptOutcome) store.Record {
	last := outs[len(outs)-1]
	return store.Record{ID: id, Namespace: ns, Name: "t", Executor: "g-shard-1", Attempt: len(outs) - 1, Terminal: true,
		Phase: last.Phase, Reason: last.Reason, ExitCode: last.ExitCode, Attempts: outs}
}

// withLogs gives r a complete log of "main" for each attempt.
func withLogs(r store.Record) Task {
	t := Task{Record: r}
	for a := range r.Attempts {
		t.Logs = append(t.Logs, Log{Key: store.LogKey{TaskID: r.ID, Attempt: a, Container: "main"}, Info: store.LogInfo{Size: 6, Complete: true}, Tail: "hello\n"})
	}
	return t
}

// TestCheck: each invariant, violated by a hand-made history, and the same
// histories kept whole.
func TestCheck(t *testing.T) {
	succeeded := func(id string, s float64) store.Record {
		return record(id, outcome(0, "Succeeded", "Completed", exit(0), s))
	}
	cases := map[string]struct {
		history func(*h)
		tasks   []Task
		left    []corev1.Pod
		garbage string
		want    map[Invariant]int
		check   func(*testing.T, *Report)
	}{
		"a clean run": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 0) },
			tasks:   []Task{withLogs(succeeded("a", 2.5))},
			check: func(t *testing.T, r *Report) {
				if r.PodsCreated != 1 || r.PodsRan != 1 || r.Stopped["delete"] != 1 {
					t.Errorf("created %d ran %d stopped %v", r.PodsCreated, r.PodsRan, r.Stopped)
				}
			},
		},
		"a dry-run create is no pod": {
			history: func(h *h) {
				h.run(pod(t, "a", 0, "u1"), 0, 0)
				h.create(pod(t, "zz", 0, "u2"), 1)
				h.evs[len(h.evs)-1].RequestURI += "?dryRun=All"
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			check: func(t *testing.T, r *Report) {
				if r.PodsCreated != 1 {
					t.Errorf("created %d, want 1", r.PodsCreated)
				}
			},
		},
		"a create answered after its pod was bound": {
			history: func(h *h) {
				p := pod(t, "a", 0, "u1")
				h.run(p, 0, 0)
				h.evs[0].StageTimestamp = metav1.NewMicroTime(at(1.5)) // the response took 1.5 s
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			check: func(t *testing.T, r *Report) {
				if r.PodsRan != 1 {
					t.Errorf("ran %d, want 1", r.PodsRan)
				}
			},
		},
		"a duplicate create answered AlreadyExists is no pod": {
			history: func(h *h) {
				p := pod(t, "a", 0, "u1")
				h.run(p, 0, 0).createFails(p, 1)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			check: func(t *testing.T, r *Report) {
				if r.PodsCreated != 1 || r.Refused != 1 || r.RefusedAfterOutcome != 0 {
					t.Errorf("created %d, refused %d (%d after the outcome), want 1, 1 (0)", r.PodsCreated, r.Refused, r.RefusedAfterOutcome)
				}
			},
		},
		"a stale create the same-name guard refused": {
			history: func(h *h) {
				p := pod(t, "a", 0, "u1")
				h.create(p, 0).bind(p, "sim-0", 0.1).status(p, 2, map[string]any{"main": 0, "envoy": "running"}).
					createFails(p, 3).del(p, 4, 0)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			check: func(t *testing.T, r *Report) {
				if r.Refused != 1 || r.RefusedAfterOutcome != 1 {
					t.Errorf("refused %d (%d after the outcome), want 1 (1)", r.Refused, r.RefusedAfterOutcome)
				}
			},
		},
		"defect 1: a stale create after the outcome runs the attempt again": {
			history: func(h *h) {
				h.run(pod(t, "a", 0, "u1"), 0, 0)
				h.run(pod(t, "a", 0, "u2"), 10, 0) // same name, after the first was removed
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			want:  map[Invariant]int{OneRunPerAttempt: 1, NoRunAfterOutcome: 1},
			check: func(t *testing.T, r *Report) {
				if r.SeveralRuns != 1 || r.CreatedAfterOutcome != 1 {
					t.Errorf("several runs %d, created after outcome %d", r.SeveralRuns, r.CreatedAfterOutcome)
				}
			},
		},
		"a stale create the fence gated never runs": {
			history: func(h *h) {
				h.run(gated(t, "a", 0, "u1"), 0, 0)
				stale := gated(t, "a", 0, "u2")
				h.create(stale, 10).del(stale, 10.2, 0)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			check: func(t *testing.T, r *Report) {
				if r.Fenced != 1 || r.CreatedAfterOutcome != 1 || r.PodsRan != 1 {
					t.Errorf("fenced %d, created after outcome %d, ran %d", r.Fenced, r.CreatedAfterOutcome, r.PodsRan)
				}
			},
		},
		"a create answered 504 whose pod exists, discarded by UID": {
			history: func(h *h) {
				h.run(gated(t, "a", 0, "u1"), 0, 0)
				stale := gated(t, "a", 0, "u2")
				h.createUnanswered(stale, 10).discard(stale, 11)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			check: func(t *testing.T, r *Report) {
				if r.PodsCreated != 2 || r.Fenced != 1 || r.PodsRan != 1 {
					t.Errorf("created %d, fenced %d, ran %d", r.PodsCreated, r.Fenced, r.PodsRan)
				}
			},
		},
		"a create answered 504 that made no pod": {
			history: func(h *h) {
				h.run(gated(t, "a", 0, "u1"), 0, 0)
				h.createUnanswered(gated(t, "a", 0, "u2"), 10)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			check: func(t *testing.T, r *Report) {
				if r.PodsCreated != 1 {
					t.Errorf("created %d, want 1", r.PodsCreated)
				}
			},
		},
		"an ungated pod binds and runs": {
			history: func(h *h) {
				p := gated(t, "a", 0, "u1")
				h.create(p, 0).ungate(p, 0.05).bind(p, "sim-0", 0.1).
					status(p, 2, map[string]any{"main": 0, "envoy": 0})
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			check: func(t *testing.T, r *Report) {
				if r.Fenced != 0 || r.PodsRan != 1 || r.Stopped["status"] != 1 {
					t.Errorf("fenced %d, ran %d, stopped %v", r.Fenced, r.PodsRan, r.Stopped)
				}
			},
		},
		"a pod created before its attempt's outcome and bound after it": {
			// A cancelled task's recorded pod, still gated when the outcome
			// was recorded, ungated after it: it runs after the outcome.
			history: func(h *h) {
				p := gated(t, "a", 0, "u1")
				h.create(p, 0).ungate(p, 1.1).bind(p, "sim-0", 1.2).
					status(p, 1.5, map[string]any{"main": "running", "envoy": "running"}).
					del(p, 3, 30).status(p, 3.5, map[string]any{"main": 137, "envoy": 137}).del(p, 3.6, 0)
			},
			tasks: []Task{withLogs(record("a", outcome(0, "Failed", "Cancelled", nil, 1.0)))},
			want:  map[Invariant]int{NoRunAfterOutcome: 1},
			check: func(t *testing.T, r *Report) {
				if r.CreatedAfterOutcome != 0 || r.PodsRan != 1 {
					t.Errorf("created after outcome %d, ran %d", r.CreatedAfterOutcome, r.PodsRan)
				}
			},
		},
		"a pod bound before its attempt's outcome whose main container started after it": {
			history: func(h *h) {
				p := pod(t, "a", 0, "u1")
				h.create(p, 0).bind(p, "sim-0", 0.1).status(p, 0.5, map[string]any{"envoy": "running"}).
					status(p, 2.3, map[string]any{"main": "running"}).
					del(p, 2.5, 30).status(p, 3, map[string]any{"main": 137, "envoy": 137}).del(p, 3.1, 0)
			},
			tasks: []Task{withLogs(record("a", outcome(0, "Failed", "Cancelled", nil, 1.0)))},
			want:  map[Invariant]int{NoRunAfterOutcome: 1},
		},
		"a pod bound before its attempt's outcome and deleted after it": {
			// A running task cancelled: the outcome first, then the delete,
			// the kubelet's stop and the release.
			history: func(h *h) {
				p := pod(t, "a", 0, "u1")
				h.create(p, 0).bind(p, "sim-0", 0.1).status(p, 0.5, map[string]any{"main": "running", "envoy": "running"}).
					del(p, 1.1, 30).status(p, 1.6, map[string]any{"main": 143, "envoy": 143}).del(p, 1.7, 0)
			},
			tasks: []Task{withLogs(record("a", outcome(0, "Failed", "Cancelled", nil, 1.0)))},
		},
		"a main container reported ended, never started, after the outcome": {
			// Evicted before its main container started: the node reports
			// it terminated, without a start, after the outcome.
			history: func(h *h) {
				p := pod(t, "a", 0, "u1")
				h.create(p, 0).bind(p, "sim-0", 0.1).status(p, 0.5, map[string]any{"envoy": "running"}).
					evict(p, 0.8).del(p, 0.8, 30).status(p, 2.2, map[string]any{"main": 137, "envoy": 137}).del(p, 2.3, 0)
			},
			tasks: []Task{withLogs(record("a", outcome(0, "Failed", "Evicted", nil, 1.0)))},
		},
		"a gated pod created before its attempt's outcome and discarded after it": {
			// A creation in flight when the task was cancelled: the record
			// does not take the pod, which is discarded, never bound.
			history: func(h *h) {
				p := gated(t, "a", 0, "u1")
				h.create(p, 0).discard(p, 1.2)
			},
			tasks: []Task{{Record: record("a", outcome(0, "Failed", "Cancelled", nil, 1.0))}},
			check: func(t *testing.T, r *Report) {
				if r.Fenced != 1 || r.PodsRan != 0 {
					t.Errorf("fenced %d, ran %d", r.Fenced, r.PodsRan)
				}
			},
		},
		"two creates of an attempt before its outcome, both run": {
			history: func(h *h) {
				p1, p2 := pod(t, "a", 0, "u1"), pod(t, "a", 0, "u2")
				h.create(p1, 0).bind(p1, "sim-0", 0.1).forceByQuery(p1, 0.5).
					create(p2, 0.6).bind(p2, "sim-1", 0.7).status(p2, 2, map[string]any{"main": 0, "envoy": "running"}).del(p2, 3, 0)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			want:  map[Invariant]int{OneRunPerAttempt: 1},
		},
		"a retry after the previous pod stopped": {
			history: func(h *h) {
				p0, p1 := pod(t, "a", 0, "u1"), pod(t, "a", 1, "u2")
				h.create(p0, 0).bind(p0, "sim-0", 0.1).status(p0, 0.5, map[string]any{"main": "running", "envoy": "running"}).
					evict(p0, 1).status(p0, 1.5, map[string]any{"main": 137, "envoy": 137})
				h.run(p1, 12, 0)
			},
			tasks: []Task{withLogs(record("a", outcome(0, "Failed", "Evicted", exit(137), 2), outcome(1, "Succeeded", "Completed", exit(0), 14.5)))},
		},
		"the next attempt runs while the evicted pod still runs": {
			history: func(h *h) {
				p0, p1 := pod(t, "a", 0, "u1"), pod(t, "a", 1, "u2")
				h.create(p0, 0).bind(p0, "sim-0", 0.1).status(p0, 0.5, map[string]any{"main": "running", "envoy": "running"}).
					evict(p0, 1).del(p0, 1, 30)
				h.run(p1, 12, 0)
				h.status(p0, 20, map[string]any{"main": 143, "envoy": 143})
			},
			tasks: []Task{withLogs(record("a", outcome(0, "Failed", "Evicted", nil, 2), outcome(1, "Succeeded", "Completed", exit(0), 14.5)))},
			want:  map[Invariant]int{NoConcurrentRuns: 1},
		},
		"a pod never seen stopped overlaps every later one": {
			history: func(h *h) {
				p0, p1 := pod(t, "a", 0, "u1"), pod(t, "a", 1, "u2")
				h.create(p0, 0).bind(p0, "sim-0", 0.1)
				h.run(p1, 12, 0)
			},
			tasks: []Task{withLogs(record("a", outcome(0, "Failed", "NodeLost", nil, 2), outcome(1, "Succeeded", "Completed", exit(0), 14.5)))},
			want:  map[Invariant]int{NoConcurrentRuns: 1},
		},
		"a phase Succeeded stops the pod": {
			history: func(h *h) {
				p0, p1 := pod(t, "a", 0, "u1"), pod(t, "a", 1, "u2")
				h.create(p0, 0).bind(p0, "sim-0", 0.1).phase(p0, 1, corev1.PodSucceeded)
				h.run(p1, 12, 0)
			},
			tasks: []Task{withLogs(record("a", outcome(0, "Failed", "PodFailed", nil, 2), outcome(1, "Succeeded", "Completed", exit(0), 14.5)))},
			check: func(t *testing.T, r *Report) {
				if r.Stopped["phase"] != 1 {
					t.Errorf("stopped %v", r.Stopped)
				}
			},
		},
		"the outcome's exit code is not the main container's": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 3) },
			tasks:   []Task{withLogs(succeeded("a", 2.5))},
			want:    map[Invariant]int{OneTrueOutcome: 1},
		},
		"an exit code no status reported": {
			history: func(h *h) {
				p := pod(t, "a", 0, "u1")
				h.create(p, 0).bind(p, "sim-0", 0.1).del(p, 3, 0)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			want:  map[Invariant]int{OneTrueOutcome: 1},
		},
		"an exit reported after the outcome does not count": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 0) },
			tasks:   []Task{withLogs(succeeded("a", 1.9))},
			want:    map[Invariant]int{OneTrueOutcome: 1},
		},
		"an outcome without the exit code the status reported": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 1) },
			tasks:   []Task{withLogs(record("a", outcome(0, "Failed", "PodFailed", nil, 2.5)))},
			want:    map[Invariant]int{OneTrueOutcome: 1},
		},
		"a task without a terminal outcome": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 0) },
			tasks: []Task{{Record: store.Record{ID: "a", Namespace: ns, Name: "t", Phase: "Running", Reason: "Running",
				Attempts: []store.AttemptOutcome{}}}},
			want: map[Invariant]int{OneTrueOutcome: 1},
		},
		"outcomes that do not match the attempts": {
			history: func(h *h) { h.run(pod(t, "a", 1, "u1"), 0, 0) },
			tasks: []Task{withLogs(func() store.Record {
				r := record("a", outcome(1, "Succeeded", "Completed", exit(0), 2.5))
				r.Attempt = 1
				return r
			}())},
			want: map[Invariant]int{OneTrueOutcome: 2},
		},
		"a final outcome that is not the last attempt's": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 0) },
			tasks: []Task{withLogs(func() store.Record {
				r := succeeded("a", 2.5)
				r.Phase, r.ExitCode = "Failed", exit(1)
				return r
			}())},
			want: map[Invariant]int{OneTrueOutcome: 1},
		},
		"a pod left with its finalizer": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 0) },
			tasks:   []Task{withLogs(succeeded("a", 2.5))},
			left:    []corev1.Pod{*pod(t, "a", 0, "u1")},
			want:    map[Invariant]int{NothingLeft: 1},
		},
		"a log neither complete nor marked": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 0) },
			tasks: []Task{func() Task {
				tk := withLogs(succeeded("a", 2.5))
				tk.Logs[0].Info.Complete = false
				return tk
			}()},
			want: map[Invariant]int{LogsArchived: 1},
		},
		"a main container that started without an archived log": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 0) },
			tasks:   []Task{{Record: succeeded("a", 2.5)}},
			want:    map[Invariant]int{LogsArchived: 1},
		},
		"a log ended by a marker is complete": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 0) },
			tasks: []Task{func() Task {
				tk := withLogs(succeeded("a", 2.5))
				tk.Logs[0].Tail = "hello\n" + logcapture.NoAddressMarker
				return tk
			}()},
			check: func(t *testing.T, r *Report) {
				if r.Markers["the pod's node has no address to read logs from"] != 1 {
					t.Errorf("markers %v", r.Markers)
				}
			},
		},
		"a binding of a pod whose create is not in the log": {
			history: func(h *h) {
				h.run(pod(t, "a", 0, "u1"), 0, 0)
				h.bind(pod(t, "a", 1, "u9"), "sim-0", 5)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			want:  map[Invariant]int{Complete: 1},
		},
		"a torn line": {
			history: func(h *h) { h.run(pod(t, "a", 0, "u1"), 0, 0) },
			tasks:   []Task{withLogs(succeeded("a", 2.5))},
			garbage: `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Req`,
			want:    map[Invariant]int{Complete: 1},
		},
		"a pod whose identity does not parse": {
			history: func(h *h) {
				h.run(pod(t, "a", 0, "u1"), 0, 0)
				bad := pod(t, "a", 1, "u2")
				bad.Annotations[AnnotationNonce] = "n9" // its name is not the one the nonce gives
				h.run(bad, 5, 0)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			want:  map[Invariant]int{Complete: 1},
		},
		"a pod that is not kubetask's": {
			history: func(h *h) {
				h.run(pod(t, "a", 0, "u1"), 0, 0)
				other := pod(t, "b", 0, "u2")
				delete(other.Labels, task.LabelManagedBy)
				h.run(other, 5, 0)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			want:  map[Invariant]int{Complete: 1},
		},
		"a pod of a task the store does not know": {
			history: func(h *h) {
				h.run(pod(t, "a", 0, "u1"), 0, 0)
				h.run(pod(t, "zz", 0, "u2"), 0, 0)
			},
			tasks: []Task{withLogs(succeeded("a", 2.5))},
			want:  map[Invariant]int{Complete: 1},
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			hist := &h{tb: t}
			c.history(hist)
			log := hist.log()
			if c.garbage != "" {
				log = append(log, c.garbage...)
			}
			a, err := ReadAudit(bytes.NewReader(log))
			if err != nil {
				t.Fatal(err)
			}
			r := Check(Input{Audit: a, Tasks: c.tasks, Namespaces: []string{ns}, Left: c.left})
			for _, inv := range Invariants {
				if got := r.Count(inv); got != c.want[inv] {
					t.Errorf("[%s]: %d violations, want %d", inv, got, c.want[inv])
				}
			}
			if t.Failed() {
				t.Logf("violations:\n%s", r.Examples(10))
			}
			if c.check != nil {
				c.check(t, r)
			}
			// The table always renders.
			if tbl := r.Table(); !strings.Contains(tbl, OneRunPerAttempt.String()) {
				t.Errorf("table without the invariants:\n%s", tbl)
			}
		})
	}
}

// TestFromAuditOrder: a pod's history does not depend on the order of the
// log's lines.
func TestFromAuditOrder(t *testing.T) {
	hist := &h{tb: t}
	p := pod(t, "a", 0, "u1")
	hist.run(p, 0, 0)
	evs := hist.evs
	for i, j := 0, len(evs)-1; i < j; i, j = i+1, j-1 {
		evs[i], evs[j] = evs[j], evs[i]
	}
	a := FromAudit(evs)
	got := a.Pods["u1"]
	if got == nil || !got.Ran() || got.MainExit == nil || *got.MainExit != 0 || got.Stopped.IsZero() || len(a.Unresolved) > 0 {
		t.Fatalf("pod %+v, unresolved %v", got, a.Unresolved)
	}
	if got.Node != "sim-0" || !got.Bound.Equal(at(0.1)) || !got.Stopped.Equal(at(3.1)) || got.StoppedBy != "delete" {
		t.Errorf("node %s bound %s stopped %s by %s", got.Node, got.Bound, got.Stopped, got.StoppedBy)
	}
}

// TestReadAuditRealLog reads the audit log kube-apiserver wrote for two
// pods of a chaos run: one on a kwok node (main exits 0, its sidecar runs
// until kwok removes the deleted pod: strategic merge patches of the
// status, a grace-0 delete) and one on the local process node (JSON patches
// of the whole status, phase Succeeded).
func TestReadAuditRealLog(t *testing.T) {
	f, err := os.Open("testdata/audit.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, err := ReadAudit(f)
	if err != nil {
		t.Fatal(err)
	}
	if a.BadLines != 0 || len(a.Unresolved) != 0 || len(a.Order) != 2 {
		t.Fatalf("bad lines %d, unresolved %v, %d pods", a.BadLines, a.Unresolved, len(a.Order))
	}
	want := map[string]struct {
		node, stoppedBy string
		exit            int32
	}{
		"chaos-cspvbh5urq-0": {"sim-0", "delete", 0},
		"chaos-e72m7c3c43-0": {"local-0", "phase", 0},
	}
	for _, p := range a.Order {
		w, ok := want[p.Name]
		if !ok {
			t.Fatalf("unexpected pod %s", p)
		}
		if !p.Ran() || p.Node != w.node || p.StoppedBy != w.stoppedBy || !p.MainStarted || p.MainExit == nil || *p.MainExit != w.exit ||
			p.MainContainer != "main" || p.Attempt != 0 || p.Task == "" || p.Gated {
			t.Errorf("%s: ran %v on %q, stopped by %q, main started %v exit %s, main %q, task %q attempt %d, gated %v",
				p, p.Ran(), p.Node, p.StoppedBy, p.MainStarted, code(p.MainExit), p.MainContainer, p.Task, p.Attempt, p.Gated)
		}
		if !p.Bound.After(p.Created) || !p.MainExitAt.After(p.Bound) || p.Stopped.Before(p.MainExitAt) {
			t.Errorf("%s: created %s, bound %s, main exited %s, stopped %s: out of order", p, p.Created, p.Bound, p.MainExitAt, p.Stopped)
		}
		// The node's startedAt, in whole seconds: between the binding's
		// second and the report of the exit.
		if p.MainStartedAt.Before(p.Bound.Truncate(time.Second)) || p.MainStartedAt.After(p.MainExitAt) {
			t.Errorf("%s: bound %s, main started %s, exit reported %s", p, p.Bound, p.MainStartedAt, p.MainExitAt)
		}
	}
}

// TestRecheck judges a kept chaos run again with this checker:
// KUBETASK_CHAOS_RECHECK=<run directory> (it holds audit.log and
// input.json). Without it, it round-trips a history through SaveInput and
// LoadInput.
func TestRecheck(t *testing.T) {
	dir := os.Getenv("KUBETASK_CHAOS_RECHECK")
	if dir == "" {
		dir = t.TempDir()
		hist := &h{tb: t}
		hist.run(pod(t, "a", 0, "u1"), 0, 0)
		hist.run(pod(t, "a", 0, "u2"), 10, 0)
		if err := os.WriteFile(dir+"/audit.log", hist.log(), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := SaveInput(dir, Input{Tasks: []Task{withLogs(record("a", outcome(0, "Succeeded", "Completed", exit(0), 2.5)))}, Namespaces: []string{ns}}); err != nil {
			t.Fatal(err)
		}
	}
	in, err := LoadInput(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := Check(in)
	t.Logf("\n%s\n%s", r.Table(), r.Examples(5))
	if os.Getenv("KUBETASK_CHAOS_RECHECK") == "" && (r.Count(OneRunPerAttempt) != 1 || r.Count(NoRunAfterOutcome) != 1 || len(r.Violations) != 2) {
		t.Errorf("round trip: %d violations, want the two of the stale create", len(r.Violations))
	}
}

// TestCheckClusters: the histories of two clusters' audit logs merged
// (Merge), with the attempts' clusters in the store: an attempt declared
// lost on one runs on beside the next attempt elsewhere (at least once by
// design, not a violation), the same overlap without the loss is one, and
// a pod that ran on another cluster than its attempt's, or one attempt's
// pods on both, break invariant 1.
func TestCheckClusters(t *testing.T) {
	on := func(cluster string, o store.AttemptOutcome) store.AttemptOutcome {
		o.Cluster = cluster
		return o
	}
	// west's pod of attempt 0 runs from 0 until deleted at 20; east's pod
	// of attempt 1 runs a whole clean life from 5.
	overlap := func(h map[string]*h) {
		p := pod(t, "a", 0, "u-west")
		h["west"].create(p, 0).bind(p, "sim-0", 0.1).status(p, 0.5, map[string]any{"main": "running", "envoy": "running"}).
			del(p, 20, 30).del(p, 20.1, 0)
		h["east"].run(pod(t, "a", 1, "u-east"), 5, 0)
	}
	cases := map[string]struct {
		history func(map[string]*h)
		record  store.Record
		want    map[Invariant]int
		lost    int
	}{
		"an attempt lost on west runs on beside the next on east": {
			history: overlap,
			record: record("a", on("west", outcome(0, "Failed", "ClusterLost", nil, 4)),
				on("east", outcome(1, "Succeeded", "Completed", exit(0), 7.5))),
			lost: 1,
		},
		"the same overlap, not declared lost": {
			history: overlap,
			record: record("a", on("west", outcome(0, "Failed", "Evicted", nil, 4)),
				on("east", outcome(1, "Succeeded", "Completed", exit(0), 7.5))),
			want: map[Invariant]int{NoConcurrentRuns: 1},
		},
		"a pod on another cluster than its attempt's": {
			history: func(h map[string]*h) { h["west"].run(pod(t, "a", 0, "u-west"), 0, 0) },
			record:  record("a", on("east", outcome(0, "Succeeded", "Completed", exit(0), 2.5))),
			want:    map[Invariant]int{OneRunPerAttempt: 1},
		},
		"one attempt's pods on both clusters": {
			history: func(h map[string]*h) {
				h["east"].run(pod(t, "a", 0, "u-east"), 0, 0)
				h["west"].run(pod(t, "a", 0, "u-west"), 10, 0)
			},
			record: record("a", on("east", outcome(0, "Succeeded", "Completed", exit(0), 2.5))),
			want:   map[Invariant]int{OneRunPerAttempt: 2, NoRunAfterOutcome: 1, NoConcurrentRuns: 0},
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			hs := map[string]*h{"east": {tb: t}, "west": {tb: t}}
			c.history(hs)
			audits := map[string]*Audit{}
			for cl, h := range hs {
				a, err := ReadAudit(bytes.NewReader(h.log()))
				if err != nil {
					t.Fatal(err)
				}
				audits[cl] = a
			}
			merged := Merge(audits)
			for _, p := range merged.Order {
				if want := map[types.UID]string{"u-east": "east", "u-west": "west"}[p.UID]; p.Cluster != want {
					t.Errorf("pod %s: cluster %q, want %q", p, p.Cluster, want)
				}
			}
			rep := Check(Input{Audit: merged, Tasks: []Task{withLogs(c.record)}, Namespaces: []string{ns}})
			for _, inv := range Invariants {
				if got := rep.Count(inv); got != c.want[inv] {
					t.Errorf("invariant %s: %d violations, want %d\n%s", inv, got, c.want[inv], rep.Examples(10))
				}
			}
			if rep.Lost != c.lost {
				t.Errorf("lost attempts: %d, want %d", rep.Lost, c.lost)
			}
		})
	}
}
