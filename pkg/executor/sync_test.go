package executor

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilexec "k8s.io/utils/exec"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Pod builders for the rows. The builder's clock starts at T0 when the pod
// is created; the fake clock is set to the builder's clock plus the row's
// "after".
func created() *podtest.PodWrapper { return podtest.MakePod("p", "ns").Main("main").Sidecar("envoy") }

func running() *podtest.PodWrapper {
	return podtest.MakePod("p", "ns").Scheduled().After(10 * time.Second).
		Main("main").Running().Sidecar("envoy").Running().Phase(corev1.PodRunning)
}

// mainExited: main exited with code a minute after it started; envoy runs on.
func mainExited(code int32) *podtest.PodWrapper {
	return running().After(time.Minute).On("main").Terminated(code)
}

func withResultHolder(w *podtest.PodWrapper) *podtest.PodWrapper {
	return w.Sidecar(task.ResultContainer).Running()
}

func keep(t *task.Task) { t.Spec.Cleanup = task.CleanupKeep }

func fileResult(t *task.Task) {
	t.Spec.Result = &task.Result{From: task.ResultFromFile, Path: "/out/result"}
}

func retryOn(reasons ...string) func(*task.Task) {
	return func(t *task.Task) {
		two := int32(2)
		t.Spec.Retries.Limit, t.Spec.Retries.RetryOn = &two, reasons
	}
}

func timeouts(edit func(*task.Timeouts)) func(*task.Task) {
	return func(t *task.Task) { edit(&t.Spec.Timeouts) }
}

const anyDelay = time.Duration(-1)

// TestSyncDecisions is the attempt lifecycle's specification: given a task
// whose pod of attempt 0 exists (as the informer cache shows it, and as the
// API server has it), what one sync pass decides, records and does.
func TestSyncDecisions(t *testing.T) {
	cases := map[string]struct {
		task   []func(*task.Task)
		config func(*Config)
		pod    *podtest.PodWrapper // the cache's (and, unless live is set, the API server's) pod
		live   *podtest.PodWrapper // the API server's pod when the cache is stale
		after  time.Duration
		exec   error
		setup  func(f *fx, id string)

		state    string // Phase/Reason as Get reports it after the pass
		terminal bool
		verbs    []string
		requeue  time.Duration // anyDelay: some positive delay
		check    func(t *testing.T, f *fx, id string)
	}{
		// --- following a running attempt ---
		"main container running: the new phase and reason recorded (lists filter on them), no request": {
			pod: running(), state: "Running/Running", verbs: nil,
			check: func(t *testing.T, f *fx, id string) {
				if r := f.record(id); r.Phase != "Running" || r.Reason != "Running" {
					t.Errorf("the record says %s/%s, want Running/Running", r.Phase, r.Reason)
				}
			},
		},
		"main container running, recorded as running with another message: nothing written": {
			pod: running(), state: "Running/Running", verbs: nil,
			setup: func(f *fx, id string) {
				f.update(id, func(r *store.Record) { r.Phase, r.Reason, r.Message = "Running", "Running", "an older message" })
			},
			check: func(t *testing.T, f *fx, id string) {
				if r := f.record(id); r.Message != "an older message" {
					t.Errorf("a change of the message alone was written: %q", r.Message)
				}
			},
		},
		"main exited 0 beside a running sidecar, cleanup Delete: Succeeded, pod deleted; its finalizer stays until no container runs": {
			pod: mainExited(0), state: "Succeeded/Completed", terminal: true,
			verbs: []string{"delete pods"},
			check: func(t *testing.T, f *fx, id string) {
				if got := f.eventTypes(id); !slices.Equal(got, []string{"AttemptFinished", "PodDeleting"}) {
					t.Errorf("events %v", got)
				}
			},
		},
		"main exited 0 beside a running sidecar, cleanup Keep: Succeeded, the sidecar is stopped by lowering activeDeadlineSeconds": {
			task: []func(*task.Task){keep}, pod: mainExited(0), state: "Succeeded/Completed", terminal: true,
			verbs: []string{"patch pods"},
			check: func(t *testing.T, f *fx, id string) {
				p := f.serverPod(task.PodName(identOf(f, id), 0))
				if p.Spec.ActiveDeadlineSeconds == nil || !hasFinalizer(p) {
					t.Errorf("want activeDeadlineSeconds set and the finalizer kept, got %v %v", p.Spec.ActiveDeadlineSeconds, p.Finalizers)
				}
			},
		},
		"kept pod that has finished: released and labelled released (it leaves the cache)": {
			task: []func(*task.Task){keep}, pod: mainExited(0).On("envoy").Terminated(0).Phase(corev1.PodSucceeded),
			state: "Succeeded/Completed", terminal: true, verbs: []string{"patch pods"},
			check: func(t *testing.T, f *fx, id string) {
				p := f.serverPod(task.PodName(identOf(f, id), 0))
				if hasFinalizer(p) || p.Labels[task.LabelReleased] != "true" {
					t.Errorf("finalizers %v labels %v", p.Finalizers, p.Labels)
				}
			},
		},
		"main exited 3: Failed/ExitCode, final (no retry on ExitCode)": {
			pod: mainExited(3), state: "Failed/ExitCode", terminal: true, verbs: []string{"delete pods"},
		},
		"main exited 1 with retries on ExitCode: attempt 1 after the backoff; the pod is deleted": {
			task: []func(*task.Task){retryOn("ExitCode")}, pod: mainExited(1), state: "Pending/RetryBackoff",
			verbs: []string{"delete pods"}, requeue: 10 * time.Second,
			check: func(t *testing.T, f *fx, id string) {
				if r := f.record(id); r.Attempt != 1 || len(r.Attempts) != 1 || r.Terminal {
					t.Errorf("record: attempt %d, %d outcomes, terminal %v", r.Attempt, len(r.Attempts), r.Terminal)
				}
			},
		},

		// --- stopped by someone else: no decision while a container may run (defect b) ---
		"deleted by someone else while main runs: Stopping, nothing recorded, no next attempt": {
			task: []func(*task.Task){retryOn("Infrastructure")}, pod: running().Deleted(30 * time.Second),
			state: "Running/Stopping", verbs: nil, requeue: stopRecheck,
		},
		"deleted by someone else, main exited 0 on SIGTERM and the pod stopped: Succeeded (its own outcome)": {
			pod:   running().Deleted(30 * time.Second).After(2 * time.Second).On("main").Terminated(0).On("envoy").Terminated(143).Phase(corev1.PodFailed),
			state: "Succeeded/Completed", terminal: true, verbs: []string{"patch pods"},
		},
		"deleted by someone else, main killed by the signal, the kubelet done (grace 0): DeletedExternally": {
			pod:   running().After(2 * time.Second).On("main").Terminated(143).On("envoy").Terminated(143).Deleted(0),
			state: "Failed/DeletedExternally", terminal: true, verbs: []string{"patch pods"},
		},
		"evicted (DisruptionTarget) while main runs: Stopping": {
			pod:   running().DisruptionTarget("EvictionByEvictionAPI", "Eviction API: evicting"),
			state: "Running/Stopping", requeue: stopRecheck,
		},
		// --- a deletion with grace period 0 waits for the kubelet's final report (issue 31, item 7) ---
		"evicted with grace period 0 while main runs: Stopping until the kubelet's final report": {
			pod:   running().DisruptionTarget("EvictionByEvictionAPI", "Eviction API: evicting").Deleted(0),
			state: "Running/Stopping", requeue: finalReportSettle,
		},
		"evicted with grace period 0, the final report shows main exited 0 (chaos seed 1796527408169114668): Succeeded": {
			pod: running().DisruptionTarget("EvictionByEvictionAPI", "Eviction API: evicting").Deleted(0).
				On("main").Terminated(0).On("envoy").Terminated(0).Phase(corev1.PodSucceeded),
			state: "Succeeded/Completed", terminal: true, verbs: []string{"patch pods"},
		},
		"evicted with grace period 0, the cache behind the API server's main exit 0: Succeeded": {
			pod: running().DisruptionTarget("EvictionByEvictionAPI", "Eviction API: evicting").Deleted(0),
			live: running().DisruptionTarget("EvictionByEvictionAPI", "Eviction API: evicting").Deleted(0).
				On("main").Terminated(0).On("envoy").Terminated(0).Phase(corev1.PodSucceeded),
			after: finalReportSettle, state: "Succeeded/Completed", terminal: true, verbs: []string{"get pods", "patch pods"},
		},
		"evicted with grace period 0, no final report within finalReportSettle (a lost node): Evicted": {
			pod:   running().DisruptionTarget("EvictionByEvictionAPI", "Eviction API: evicting").Deleted(0),
			after: finalReportSettle, state: "Failed/Evicted", terminal: true, verbs: []string{"get pods", "patch pods"},
		},
		"node stopped reporting (phase Unknown): Stopping, the pod may still run": {
			pod: running().Phase(corev1.PodUnknown), state: "Running/Stopping", requeue: stopRecheck,
		},
		"node gone, the pod garbage collector force-deleted the pod: NodeLost": {
			pod:   running().DisruptionTarget("DeletionByPodGC", "node gone").Deleted(0),
			state: "Failed/NodeLost", terminal: true, verbs: []string{"get pods", "patch pods"},
		},

		// --- decisions of the clock are confirmed on a fresh read (defect d) ---
		"schedule timeout on a stale cache, the API server shows the pod running: no timeout": {
			pod: created(), live: running(), after: 11 * time.Minute,
			state: "Running/Running", verbs: []string{"get pods"},
		},
		"schedule timeout confirmed by a fresh read: the pod, never bound, deleted first; ScheduleTimeout once that shows": {
			pod: created().Unschedulable("0/1 nodes are available"), after: 11 * time.Minute,
			state: "Pending/Stopping", verbs: []string{"get pods", "delete pods"},
			check: func(t *testing.T, f *fx, id string) {
				f.reflect(task.PodName(identOf(f, id), 0))
				if _, _, err := f.sync(id); err != nil || f.state(id) != "Failed/ScheduleTimeout" {
					t.Errorf("once the deletion shows: %v %s, want Failed/ScheduleTimeout", err, f.state(id))
				}
			},
		},
		"run timeout on a stale cache, the API server shows main exited 0: Succeeded": {
			task: []func(*task.Task){timeouts(func(to *task.Timeouts) { to.Run = "90s" })},
			pod:  running(), live: running().After(30 * time.Second).On("main").Terminated(0), after: 2 * time.Minute,
			state: "Succeeded/Completed", terminal: true, verbs: []string{"get pods", "delete pods"},
		},
		"behind scheduling gates for an hour: no schedule timeout": {
			pod: created().SchedulingGated(), after: time.Hour, state: "Pending/Scheduling",
		},

		// --- results (defects a and g) ---
		"File result read through the holder: Succeeded with the result": {
			task: []func(*task.Task){fileResult}, pod: withResultHolder(mainExited(0)),
			state: "Succeeded/Completed", terminal: true, verbs: []string{"delete pods"},
			check: func(t *testing.T, f *fx, id string) {
				if r := f.record(id); string(r.Result) != "42" {
					t.Errorf("result %q", r.Result)
				}
			},
		},
		"File result, exec fails for a passing reason: read again in 2s, nothing recorded": {
			task: []func(*task.Task){fileResult}, pod: withResultHolder(mainExited(0)), exec: errors.New("connection reset by peer"),
			state: "Running/ReadingResult", requeue: resultRetry,
		},
		"File result, exec still failing ResultTimeout after the main container exited: ResultFailed": {
			task: []func(*task.Task){fileResult}, pod: withResultHolder(mainExited(0)), exec: errors.New("connection reset by peer"),
			after: 3 * time.Minute, state: "Failed/ResultFailed", terminal: true, verbs: []string{"delete pods"},
		},
		"File result, exec forbidden (RBAC): ResultFailed at once": {
			task: []func(*task.Task){fileResult}, pod: withResultHolder(mainExited(0)),
			exec:  apierrors.NewForbidden(schema.GroupResource{Resource: "pods/exec"}, "p", errors.New("no")),
			state: "Failed/ResultFailed", terminal: true, verbs: []string{"delete pods"},
		},
		"File result, the pod was deleted and the holder stopped before the read: ResultFailed at once": {
			task: []func(*task.Task){fileResult}, exec: errors.New("container not found"),
			pod:   withResultHolder(mainExited(0)).Deleted(30 * time.Second).After(time.Second).On(task.ResultContainer).Terminated(0),
			state: "Failed/ResultFailed", terminal: true, requeue: stopRecheck,
		},
		"File result missing (the read exits 1): ResultFailed": {
			task: []func(*task.Task){fileResult}, pod: withResultHolder(mainExited(0)), exec: utilexec.CodeExitError{Err: errors.New("exit 1"), Code: 1},
			state: "Failed/ResultFailed", terminal: true, verbs: []string{"delete pods"},
		},
		"termination message result: read from the status": {
			task:  []func(*task.Task){func(t *task.Task) { t.Spec.Result = &task.Result{From: task.ResultFromTerminationMessage} }},
			pod:   running().After(time.Minute).On("main").TerminatedReason(0, "Completed", "hello"),
			state: "Succeeded/Completed", terminal: true, verbs: []string{"delete pods"},
			check: func(t *testing.T, f *fx, id string) {
				if r := f.record(id); string(r.Result) != "hello" || f.exec.calls != 0 {
					t.Errorf("result %q, %d execs", r.Result, f.exec.calls)
				}
			},
		},

		// --- identity (defect c) ---
		"a pod with the attempt's name that is not the task's is never acted on": {
			pod:   running(),
			setup: func(f *fx, id string) { f.both(foreign(f.podOf(id, 0, running()))) },
			state: "Failed/DeletedExternally", terminal: true, verbs: []string{"get pods"},
		},

		// --- the embedding holds a decided pod (kubetask run reads the rest of the log) ---
		"Hold: the decided pod is left as it is": {
			config: func(c *Config) { c.Hold = func(string, int) bool { return true } },
			pod:    mainExited(0), state: "Succeeded/Completed", terminal: true, verbs: nil, requeue: 30 * time.Second,
		},

		// --- cancellation ---
		"cancelled while main runs: Cancelled at once, the pod deleted": {
			pod: running(), setup: func(f *fx, id string) { f.update(id, func(r *store.Record) { r.CancelledAt = f.clk.Now() }) },
			state: "Failed/Cancelled", terminal: true, verbs: []string{"delete pods"},
		},
		"cancelled while the pod waits for the scheduler, cleanup Keep: the pod, never bound, is deleted before Cancelled is recorded": {
			// Released unbound instead, it was bound a moment later and ran
			// on after the outcome (simulation seed 1796531263076793643).
			task: []func(*task.Task){keep}, pod: created(),
			setup: func(f *fx, id string) { f.update(id, func(r *store.Record) { r.CancelledAt = f.clk.Now() }) },
			state: "Pending/Stopping", verbs: []string{"delete pods"},
			check: func(t *testing.T, f *fx, id string) {
				f.reflect(task.PodName(identOf(f, id), 0))
				if _, _, err := f.sync(id); err != nil || f.state(id) != "Failed/Cancelled" {
					t.Errorf("once the deletion shows: %v %s, want Failed/Cancelled", err, f.state(id))
				}
			},
		},
		"cancelled after main exited 0: Succeeded": {
			pod: mainExited(0), after: time.Second,
			setup: func(f *fx, id string) { f.update(id, func(r *store.Record) { r.CancelledAt = f.clk.Now() }) },
			state: "Succeeded/Completed", terminal: true, verbs: []string{"delete pods"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFx(t, tc.config)
			f.exec.err = tc.exec
			const id = "t1"
			f.submit(id, newTask(tc.task...))
			f.update(id, func(r *store.Record) { r.PodCreated, r.Phase, r.Reason = true, "Pending", "Scheduling" })
			f.clk.SetTime(tc.pod.Now().Add(tc.after))
			if tc.setup != nil {
				tc.setup(f, id)
			}
			if tc.pod != nil && f.serverPod(task.PodName(identOf(f, id), 0)) == nil {
				f.both(f.podOf(id, 0, tc.pod))
				if tc.live != nil {
					f.server(f.podOf(id, 0, tc.live))
				}
			}
			d, verbs, err := f.sync(id)
			if err != nil {
				t.Fatalf("sync: %v", err)
			}
			if got := f.state(id); got != tc.state {
				t.Errorf("state %s, want %s", got, tc.state)
			}
			if r := f.record(id); r.Terminal != tc.terminal {
				t.Errorf("terminal %v, want %v (%s: %s)", r.Terminal, tc.terminal, r.Reason, r.Message)
			}
			if d := cmp.Diff(tc.verbs, verbs); d != "" {
				t.Errorf("API requests (-want +got):\n%s", d)
			}
			switch {
			case tc.requeue == anyDelay && d <= 0, tc.requeue != anyDelay && d != tc.requeue:
				t.Errorf("requeue %s, want %s", d, tc.requeue)
			}
			if tc.check != nil {
				tc.check(t, f, id)
			}
		})
	}
}

func identOf(f *fx, id string) task.Identity {
	r := f.record(id)
	return task.Identity{Namespace: r.Namespace, Name: r.Name, RunID: r.ID, Executor: f.ex.cfg.InstanceID, Nonce: r.Nonce}
}

// foreign turns pod into one of another run that happens to have its name.
func foreign(pod *corev1.Pod) *corev1.Pod {
	p := pod.DeepCopy()
	p.Annotations[task.AnnotationRun] = "someone-else"
	return p
}

func TestSyncDecisionsMessagesNameTheCause(t *testing.T) {
	f := newFx(t, nil)
	f.submit("t1", newTask())
	f.update("t1", func(r *store.Record) { r.PodCreated = true })
	f.both(f.podOf("t1", 0, running().Deleted(30*time.Second)))
	if _, _, err := f.sync("t1"); err != nil {
		t.Fatal(err)
	}
	rec, _ := f.ex.Get(f.ctx, "t1")
	if !strings.Contains(rec.Message, "waiting for the pod's containers to stop") || !strings.Contains(rec.Message, "deleted by someone else") {
		t.Errorf("message %q", rec.Message)
	}
}
