package executor

import (
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/pkg/podstate"
)

// The reasons of the Kubernetes Events kubetask records on its pods
// (Config.Recorder): what `kubectl describe pod` shows a person of
// kubetask's decisions.
const (
	// PodEventSucceeded (Normal): the attempt's outcome, Succeeded, is
	// recorded, decided from the main container.
	PodEventSucceeded = "AttemptSucceeded"
	// PodEventFailed (Warning): the attempt's outcome, Failed, is
	// recorded, with the reason (ExitCode, OOMKilled, Evicted ...).
	PodEventFailed = "AttemptFailed"
	// PodEventResult (Normal): the task's result was read from the pod.
	PodEventResult = "ResultRead"
	// PodEventStopping (Normal): the outcome is recorded and what still
	// runs in the kept pod (sidecars, the result holder) is being stopped.
	PodEventStopping = "StoppingSidecars"
	// PodEventReleased (Normal): nothing runs in the pod any more and the
	// logs kubetask captures are archived: its finalizer is removed.
	PodEventReleased = "Released"
	// PodEventRetry (Normal, on the failed attempt's pod): the next
	// attempt is scheduled, after its backoff.
	PodEventRetry = "RetryScheduled"
	// PodEventWaiting (Normal, on the previous attempt's pod): the next
	// attempt waits for a parallelism slot, and which limit holds it.
	PodEventWaiting = "WaitingForSlot"
)

// PodEventReasons are the reasons above, in the order a task meets them.
var PodEventReasons = []string{PodEventSucceeded, PodEventFailed, PodEventResult, PodEventStopping, PodEventReleased, PodEventRetry, PodEventWaiting}

// podRefs remembers, for a task between an attempt's end and the next
// attempt's pod, the ended attempt's pod: where the retry's events go.
type podRefs struct {
	mu   sync.Mutex
	last map[string]*corev1.ObjectReference
}

// tellPod records the Kubernetes Event ev means for its pod, if any.
func (e *Executor) tellPod(ev Event) {
	ref := podRef(ev)
	switch ev.Type {
	case EventPodCreated, EventPodAdopted:
		e.lastPods.forget(ev.ID)
	case EventAttemptFinished:
		if ref == nil {
			return
		}
		if ev.Phase == string(podstate.Succeeded) {
			e.cfg.Recorder.Eventf(ref, corev1.EventTypeNormal, PodEventSucceeded, "attempt %d succeeded (%s): %s", ev.Attempt, ev.Reason, ev.Message)
		} else {
			e.cfg.Recorder.Eventf(ref, corev1.EventTypeWarning, PodEventFailed, "attempt %d failed (%s): %s", ev.Attempt, ev.Reason, ev.Message)
		}
		if len(ev.Result) > 0 {
			e.cfg.Recorder.Eventf(ref, corev1.EventTypeNormal, PodEventResult, "read the task's result, %d bytes", len(ev.Result))
		}
		if ev.Terminal {
			e.lastPods.forget(ev.ID)
		} else {
			e.lastPods.remember(ev.ID, ref)
		}
	case EventPodStopping:
		if ref != nil {
			e.cfg.Recorder.Event(ref, corev1.EventTypeNormal, PodEventStopping, "the attempt's outcome is recorded; stopping what still runs in the pod (sidecars)")
		}
	case EventPodReleased:
		if ref != nil {
			e.cfg.Recorder.Event(ref, corev1.EventTypeNormal, PodEventReleased, "nothing runs in the pod any more and its logs are archived; kubetask removed its finalizer")
		}
	case EventState, EventSubmitted:
		prev := e.lastPods.get(ev.ID)
		switch {
		case prev == nil:
		case ev.Reason == reasonRetryBackoff:
			e.cfg.Recorder.Event(prev, corev1.EventTypeNormal, PodEventRetry, ev.Message)
		case ev.Reason == reasonWaitingForSlot:
			e.cfg.Recorder.Eventf(prev, corev1.EventTypeNormal, PodEventWaiting, "attempt %d waits for a slot: %s", ev.Attempt, ev.Message)
		}
	}
}

// podRef is the reference of ev's pod (nil when it names none, or not
// its UID: kubectl describe finds a pod's events by its UID).
func podRef(ev Event) *corev1.ObjectReference {
	ns, name, ok := strings.Cut(ev.Pod, "/")
	if !ok || ev.PodUID == "" {
		return nil
	}
	return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: name, UID: ev.PodUID}
}

func (p *podRefs) remember(id string, ref *corev1.ObjectReference) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil {
		p.last = map[string]*corev1.ObjectReference{}
	}
	p.last[id] = ref
}

func (p *podRefs) get(id string) *corev1.ObjectReference {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last[id]
}

func (p *podRefs) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.last[id]; ok {
		delete(p.last, id)
		p.last = emptied(p.last)
	}
}
