package executor

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// TestQueueState: the queue state (kubetask_tasks_queued's state label)
// of every phase and reason a task can show.
func TestQueueState(t *testing.T) {
	for name, tc := range map[string]struct {
		phase, reason, want string
	}{
		"just submitted":                    {"Pending", reasonSubmitted, QueueWaiting},
		"in the line for a slot":            {"Pending", reasonWaitingForSlot, QueueWaiting},
		"retry backoff":                     {"Pending", reasonRetryBackoff, QueueWaiting},
		"the previous attempt's pod stops":  {"Pending", reasonWaitingForStop, QueueWaiting},
		"a failed creation's retry":         {"Pending", reasonCreateFailed, QueueWaiting},
		"lost with its cluster, not placed": {"Pending", string(podstate.ReasonClusterLost), QueueWaiting},
		"a slot given, creating":            {"Pending", reasonCreating, QueueCreating},
		"pod created, scheduling":           {"Pending", string(podstate.ReasonScheduling), QueuePending},
		"unschedulable":                     {"Pending", string(podstate.ReasonUnschedulable), QueuePending},
		"image pull failing":                {"Pending", string(podstate.ReasonImagePullFailed), QueuePending},
		"configuration error":               {"Pending", string(podstate.ReasonConfigError), QueuePending},
		"init containers":                   {"Pending", string(podstate.ReasonInitializing), QueuePending},
		"an unbound pod deleted":            {"Pending", string(podstate.ReasonStopping), QueuePending},
		"main container running":            {"Running", string(podstate.ReasonRunning), QueueRunning},
		"reading the result":                {"Running", reasonReadingResult, QueueRunning},
		"succeeded: not queued":             {"Succeeded", string(podstate.ReasonCompleted), ""},
		"failed: not queued":                {"Failed", string(podstate.ReasonExitCode), ""},
	} {
		t.Run(name, func(t *testing.T) {
			if got := queueState(tc.phase, tc.reason); got != tc.want {
				t.Errorf("queueState(%s, %s) = %q, want %q", tc.phase, tc.reason, got, tc.want)
			}
		})
	}
}

// TestTimeToStart: creationTimestamp to the main container's startedAt,
// whether it runs or has ended; nothing before it started.
func TestTimeToStart(t *testing.T) {
	for name, tc := range map[string]struct {
		pod    *corev1.Pod
		want   time.Duration
		wantOK bool
	}{
		"not started":                  {pod: created().Obj()},
		"main waiting for its image":   {pod: created().Waiting("ImagePullBackOff", "").Obj()},
		"main running 10 s after":      {pod: running().Obj(), want: 10 * time.Second, wantOK: true},
		"main ended: its start counts": {pod: mainExited(0).Obj(), want: 10 * time.Second, wantOK: true},
		"only the sidecar runs": {pod: podtest.MakePod("p", "ns").Scheduled().After(5*time.Second).Main("main").
			Waiting("ContainerCreating", "").Sidecar("envoy").Running().Obj()},
		"no creation time": {pod: func() *corev1.Pod {
			p := running().Obj()
			p.CreationTimestamp = metav1.Time{}
			return p
		}()},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := timeToStart(tc.pod, "main")
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("timeToStart = %s, %v; want %s, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// TestAdmissionWait: from the submission, or from when a retry (or a
// delayed start) was due.
func TestAdmissionWait(t *testing.T) {
	t0 := podtest.T0
	for name, tc := range map[string]struct {
		rec  store.Record
		want time.Duration
	}{
		"first attempt: from the submission":   {rec: store.Record{CreatedAt: t0}, want: 5 * time.Second},
		"a retry: from the end of its backoff": {rec: store.Record{CreatedAt: t0.Add(-time.Hour), NextAttemptAt: t0.Add(2 * time.Second)}, want: 3 * time.Second},
		"a backoff older than the submission":  {rec: store.Record{CreatedAt: t0, NextAttemptAt: t0.Add(-time.Hour)}, want: 5 * time.Second},
		"clocks apart: never negative":         {rec: store.Record{CreatedAt: t0.Add(time.Minute)}, want: 0},
	} {
		t.Run(name, func(t *testing.T) {
			if got := admissionWait(tc.rec, t0.Add(5*time.Second)); got != tc.want {
				t.Errorf("admissionWait = %s, want %s", got, tc.want)
			}
		})
	}
}

// metricFx is an fx whose executor registers its metrics in reg and
// counts its tasks in the scrape-time gauges, as Start makes it.
func metricFx(t *testing.T, mod func(*Config)) (*fx, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	f := newFx(t, func(c *Config) {
		c.Registerer = reg
		if mod != nil {
			mod(c)
		}
	})
	f.ex.metrics.queue.add(f.ex)
	return f, reg
}

// scrape gathers reg as `name{label="value",...}` -> value, the gauges'
// and counters' values and the histograms' _count and _sum, for the
// metrics named in names.
func scrape(t *testing.T, reg prometheus.Gatherer, names ...string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !slices.Contains(names, mf.GetName()) {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			labels := "{" + strings.Join(ls, ",") + "}"
			switch {
			case m.Histogram != nil:
				out[mf.GetName()+"_count"+labels] = float64(m.Histogram.GetSampleCount())
				out[mf.GetName()+"_sum"+labels] = m.Histogram.GetSampleSum()
			case m.Gauge != nil:
				out[mf.GetName()+labels] = m.Gauge.GetValue()
			case m.Counter != nil:
				out[mf.GetName()+labels] = m.Counter.GetValue()
			}
		}
	}
	return out
}

var queueMetrics = []string{"kubetask_tasks_queued", "kubetask_pending_tasks",
	"kubetask_admission_wait_seconds", "kubetask_time_to_start_seconds", "kubetask_task_duration_seconds"}

// TestMetricsFollowTheAttempt: what the queue gauges, the time to start
// and the task duration say of a task whose pod shows each state, after
// one pass or two (a second pass observes nothing again).
func TestMetricsFollowTheAttempt(t *testing.T) {
	for name, tc := range map[string]struct {
		task   []func(*task.Task)
		pod    *podtest.PodWrapper
		before *podtest.PodWrapper // the pod as a pass saw it first, when set
		passes int                 // default 1
		setup  func(f *fx, id string)
		want   map[string]float64
	}{
		"waiting for the scheduler: pending/Scheduling": {
			pod: created(),
			want: map[string]float64{
				`kubetask_tasks_queued{namespace="ns",state="pending"}`:      1,
				`kubetask_pending_tasks{namespace="ns",reason="Scheduling"}`: 1,
			},
		},
		"unschedulable: pending/Unschedulable": {
			pod: created().Unschedulable("0/3 nodes are available"),
			want: map[string]float64{
				`kubetask_tasks_queued{namespace="ns",state="pending"}`:         1,
				`kubetask_pending_tasks{namespace="ns",reason="Unschedulable"}`: 1,
			},
		},
		"image pull back-off: pending/ImagePullFailed": {
			pod: podtest.MakePod("p", "ns").Scheduled().Main("main").Waiting("ImagePullBackOff", "back-off").Sidecar("envoy").Running(),
			want: map[string]float64{
				`kubetask_tasks_queued{namespace="ns",state="pending"}`:           1,
				`kubetask_pending_tasks{namespace="ns",reason="ImagePullFailed"}`: 1,
			},
		},
		"main running: running, its start observed once": {
			pod: running(), passes: 2,
			want: map[string]float64{
				`kubetask_tasks_queued{namespace="ns",state="running"}`: 1,
				`kubetask_time_to_start_seconds_count{namespace="ns"}`:  1,
				`kubetask_time_to_start_seconds_sum{namespace="ns"}`:    10,
			},
		},
		"main started and ended between two passes: its start observed as the attempt ends, and the task's duration": {
			pod: mainExited(0),
			want: map[string]float64{
				`kubetask_time_to_start_seconds_count{namespace="ns"}`:                   1,
				`kubetask_time_to_start_seconds_sum{namespace="ns"}`:                     10,
				`kubetask_task_duration_seconds_count{namespace="ns",phase="Succeeded"}`: 1,
				`kubetask_task_duration_seconds_sum{namespace="ns",phase="Succeeded"}`:   70,
			},
		},
		"seen running, then ended: one start, one duration": {
			before: running(), pod: mainExited(3),
			want: map[string]float64{
				`kubetask_time_to_start_seconds_count{namespace="ns"}`:                1,
				`kubetask_time_to_start_seconds_sum{namespace="ns"}`:                  10,
				`kubetask_task_duration_seconds_count{namespace="ns",phase="Failed"}`: 1,
				`kubetask_task_duration_seconds_sum{namespace="ns",phase="Failed"}`:   70,
			},
		},
		"an attempt that fails and is retried: waiting/RetryBackoff, no task duration yet": {
			task: []func(*task.Task){retryOn("ExitCode")}, pod: mainExited(1),
			want: map[string]float64{
				`kubetask_tasks_queued{namespace="ns",state="waiting"}`:        1,
				`kubetask_pending_tasks{namespace="ns",reason="RetryBackoff"}`: 1,
				`kubetask_time_to_start_seconds_count{namespace="ns"}`:         1,
				`kubetask_time_to_start_seconds_sum{namespace="ns"}`:           10,
			},
		},
		"recorded Running by an earlier process: its start is not observed again": {
			pod: running(),
			setup: func(f *fx, id string) {
				f.update(id, func(r *store.Record) { r.Phase, r.Reason = "Running", "Running" })
			},
			want: map[string]float64{
				`kubetask_tasks_queued{namespace="ns",state="running"}`: 1,
			},
		},
		"an image that never pulls: Failed, no start, its duration": {
			pod: podtest.MakePod("p", "ns").Scheduled().Main("main").Waiting("InvalidImageName", "bad").Sidecar("envoy").Running(),
			want: map[string]float64{
				`kubetask_task_duration_seconds_count{namespace="ns",phase="Failed"}`: 1,
				`kubetask_task_duration_seconds_sum{namespace="ns",phase="Failed"}`:   0,
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			f, reg := metricFx(t, nil)
			const id = "t1"
			f.submit(id, newTask(tc.task...))
			f.update(id, func(r *store.Record) { r.PodCreated, r.Phase, r.Reason = true, "Pending", "Scheduling" })
			if tc.setup != nil {
				tc.setup(f, id)
			}
			if tc.before != nil {
				f.clk.SetTime(tc.before.Now())
				f.both(f.podOf(id, 0, tc.before))
				if _, _, err := f.sync(id); err != nil {
					t.Fatal(err)
				}
			}
			f.clk.SetTime(tc.pod.Now())
			f.both(f.podOf(id, 0, tc.pod))
			for range max(tc.passes, 1) {
				if _, _, err := f.sync(id); err != nil {
					t.Fatal(err)
				}
			}
			if d := cmp.Diff(tc.want, scrape(t, reg, queueMetrics...)); d != "" {
				t.Errorf("metrics (-want +got):\n%s", d)
			}
		})
	}
}

// TestMetricsBeforeThePod: a task's queue state from its submission to its
// pod's creation, and the admission wait, observed once when the creator
// records the pod.
func TestMetricsBeforeThePod(t *testing.T) {
	f, reg := metricFx(t, func(c *Config) { c.Parallelism = 1 })
	f.submit("a", newTask())
	f.submit("b", newTask())
	want := map[string]float64{
		`kubetask_tasks_queued{namespace="ns",state="waiting"}`:          2,
		`kubetask_pending_tasks{namespace="ns",reason="Submitted"}`:      1,
		`kubetask_pending_tasks{namespace="ns",reason="WaitingForSlot"}`: 1, // b: the slot is a's
	}
	if d := cmp.Diff(want, scrape(t, reg, queueMetrics...)); d != "" {
		t.Errorf("submitted (-want +got):\n%s", d)
	}
	for _, id := range []string{"a", "b"} {
		if _, _, err := f.sync(id); err != nil {
			t.Fatal(err)
		}
	}
	want = map[string]float64{
		`kubetask_tasks_queued{namespace="ns",state="creating"}`:         1,
		`kubetask_tasks_queued{namespace="ns",state="waiting"}`:          1,
		`kubetask_pending_tasks{namespace="ns",reason="Creating"}`:       1,
		`kubetask_pending_tasks{namespace="ns",reason="WaitingForSlot"}`: 1,
	}
	if d := cmp.Diff(want, scrape(t, reg, queueMetrics...)); d != "" {
		t.Errorf("after a pass each (-want +got):\n%s", d)
	}
	f.clk.Step(3 * time.Second)
	if got := f.drainCreations(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("created %v, want a's pod", got)
	}
	for range 2 {
		if _, _, err := f.sync("a"); err != nil {
			t.Fatal(err)
		}
	}
	want = map[string]float64{
		`kubetask_tasks_queued{namespace="ns",state="pending"}`:          1,
		`kubetask_tasks_queued{namespace="ns",state="waiting"}`:          1,
		`kubetask_pending_tasks{namespace="ns",reason="Scheduling"}`:     1,
		`kubetask_pending_tasks{namespace="ns",reason="WaitingForSlot"}`: 1,
		`kubetask_admission_wait_seconds_count{namespace="ns"}`:          1,
		`kubetask_admission_wait_seconds_sum{namespace="ns"}`:            3,
	}
	if d := cmp.Diff(want, scrape(t, reg, queueMetrics...)); d != "" {
		t.Errorf("a's pod created (-want +got):\n%s", d)
	}
}

// TestQueueGaugesCountTheRunningTerm: the scrape-time gauges count an
// executor's tasks only while its term is on and it runs, drop a task
// moved to another instance, and sum the executors sharing a registry
// (the shards of a replica).
func TestQueueGaugesCountTheRunningTerm(t *testing.T) {
	queued := `kubetask_tasks_queued{namespace="ns",state="waiting"}`
	for name, tc := range map[string]struct {
		act  func(t *testing.T, f *fx, reg *prometheus.Registry)
		want float64
	}{
		"running, in its term": {want: 1},
		"between terms": {
			act:  func(_ *testing.T, f *fx, _ *prometheus.Registry) { f.ex.epoch.Store(0) },
			want: 0,
		},
		"stopped (Start returned)": {
			act:  func(_ *testing.T, f *fx, _ *prometheus.Registry) { f.ex.metrics.queue.remove(f.ex) },
			want: 0,
		},
		"the task moved to another instance": {
			act: func(t *testing.T, f *fx, _ *prometheus.Registry) {
				f.update("a", func(r *store.Record) { r.Executor = "other" })
				if _, _, err := f.sync("a"); err != nil {
					t.Fatal(err)
				}
			},
			want: 0,
		},
		"a second executor on the same registry": {
			act: func(t *testing.T, f *fx, reg *prometheus.Registry) {
				g := newFx(t, func(c *Config) { c.Registerer, c.InstanceID = reg, "ex2" })
				g.ex.metrics.queue.add(g.ex)
				g.submit("b", newTask())
			},
			want: 2,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f, reg := metricFx(t, nil)
			f.submit("a", newTask())
			if tc.act != nil {
				tc.act(t, f, reg)
			}
			got := scrape(t, reg, "kubetask_tasks_queued")[queued]
			if got != tc.want {
				t.Errorf("%s = %v, want %v (all: %v)", queued, got, tc.want, slices.Sorted(maps.Keys(scrape(t, reg, "kubetask_tasks_queued"))))
			}
		})
	}
}
