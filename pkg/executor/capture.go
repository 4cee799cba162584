package executor

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/pkg/podlog"
	"github.com/kubetask/kubetask/pkg/task"
)

// LogCapture is one container's log of one attempt, handed to
// Config.CaptureLogs.
type LogCapture struct {
	TaskID                    string
	Attempt                   int
	Namespace, Pod, Container string
	// UID is the pod's: the capture follows this pod, not any of its name.
	UID types.UID
	// Nonce is the record's the pod belongs to (its kubetask.dev/nonce
	// annotation): the capture writes only into that record's log
	// (store.LogAppend.Nonce), never into a later record of the task ID.
	Nonce string
	// Progress reports the container's progress as the executor's cache
	// last saw the pod with UID (podlog.ProgressOf): another pod of the
	// name is not it (an earlier one the cache still shows: not there
	// yet; a later one, once this one was seen: gone). Changed is
	// signalled when the pod changes. Both feed a podlog.Follower.
	Progress func() podlog.Progress
	Changed  <-chan struct{}
}

// captureKey names one capture: a container of the pod (uid) of an attempt.
// The UID tells apart the pods of one attempt of two records of a task ID
// used again after retention deleted the first (simulation seed 5030: a
// process that had captured the first record's attempt 0 took its done
// capture for the second's, and released that pod's finalizer with nothing
// of its log archived).
type captureKey struct {
	id        string
	attempt   int
	container string
	uid       types.UID
}

// captureRun is a capture started by the executor.
type captureRun struct {
	done    chan struct{}
	err     error
	changed chan struct{}
	podKey  string
}

// capturesDone starts the captures of attempt n of task id that are not
// running (for the containers the task keeps logs of) and reports whether
// all of them have finished. Without Config.CaptureLogs there is nothing to
// capture.
func (e *Executor) capturesDone(ctx context.Context, t *task.Task, id string, n int, pod *corev1.Pod) bool {
	if e.cfg.CaptureLogs == nil || pod == nil {
		return true
	}
	all := true
	for _, c := range logContainers(t) {
		k := captureKey{id: id, attempt: n, container: c, uid: pod.UID}
		e.capMu.Lock()
		run, ok := e.captures[k]
		if ok {
			select {
			case <-run.done:
				if run.err != nil {
					delete(e.captures, k) // failed (ctx ended): start again
					ok = false
				}
			default:
				all = false
			}
		}
		if !ok {
			run = &captureRun{done: make(chan struct{}), changed: make(chan struct{}, 1), podKey: pod.Namespace + "/" + pod.Name}
			e.captures[k] = run
			all = false
		}
		e.capMu.Unlock()
		if !ok {
			e.startCapture(ctx, k, pod, run)
		}
	}
	return all
}

func (e *Executor) startCapture(ctx context.Context, k captureKey, pod *corev1.Pod, run *captureRun) {
	ns, name, uid := pod.Namespace, pod.Name, pod.UID
	var seenMu sync.Mutex
	seen := false
	lc := LogCapture{TaskID: k.id, Attempt: k.attempt, Namespace: ns, Pod: name, Container: k.container, UID: pod.UID,
		Nonce: pod.Annotations[task.AnnotationNonce],
		Progress: func() podlog.Progress {
			p := e.CachedPod(ns, name)
			seenMu.Lock()
			defer seenMu.Unlock()
			if p != nil && p.UID != uid {
				// Another pod of the name: an earlier one (a discarded pod
				// deleted with grace 0 and never started read as "never
				// ran, never will": an empty log, complete) or, once this
				// one was seen, a later one: this one is gone.
				p = nil
			}
			if p == nil && !seen {
				return podlog.Progress{} // created, not in the cache yet
			}
			seen = true
			return podlog.ProgressOf(p, k.container)
		},
		Changed: run.changed}
	go func() {
		start := e.cfg.Clock.Now()
		err := e.cfg.CaptureLogs(ctx, lc)
		if err == nil {
			e.cfg.Tracer.logArchived(k.id, k.attempt, k.container, start, e.cfg.Clock.Now())
		}
		if err != nil && ctx.Err() == nil {
			e.cfg.Logger.Warn("log capture failed; it starts again", "task", k.id, "attempt", k.attempt, "container", k.container, "err", err)
		}
		run.err = err
		close(run.done)
		e.queue.Add(k.id)
	}()
}

// kickCaptures signals the captures that follow pod key that it changed.
func (e *Executor) kickCaptures(podKey string) {
	e.capMu.Lock()
	defer e.capMu.Unlock()
	for _, run := range e.captures {
		if run.podKey == podKey {
			select {
			case run.changed <- struct{}{}:
			default:
			}
		}
	}
}

// forgetCaptures drops the finished captures of task id.
func (e *Executor) forgetCaptures(id string) {
	e.capMu.Lock()
	defer e.capMu.Unlock()
	for k, run := range e.captures {
		if k.id != id {
			continue
		}
		select {
		case <-run.done:
			delete(e.captures, k)
		default:
		}
	}
}

// logContainers are the containers whose logs the task keeps (spec.logs),
// the main container by default.
func logContainers(t *task.Task) []string {
	if len(t.Spec.Logs.Containers) > 0 {
		return t.Spec.Logs.Containers
	}
	return []string{t.Spec.MainContainer}
}
