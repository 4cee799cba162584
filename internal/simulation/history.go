package simulation

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// Kinds of history events. The API server and the kubelet write the pod's
// (what happened, as the cluster saw it); the store wrapper writes the
// records' milestones; the users and the world write theirs.
const (
	KSubmit    = "submit"    // a user submitted Task
	KCancel    = "cancel"    // a user cancelled Task (sent the request)
	KCancelled = "cancelled" // the store recorded Task's cancellation
	KCreate    = "create"    // a pod of Task/Attempt was created (UID; Note "gated" or "node")
	KRefused   = "refused"   // the API server refused a pod's creation (Note: why)
	KBind      = "bind"      // the pod was bound to a node: from here it runs
	KStart     = "start"     // the kubelet started its containers
	KExit      = "exit"      // the kubelet reported the main container's exit (Code)
	KStopped   = "stopped"   // no container of the pod runs any more (reported, or a grace-0 delete)
	KUngate    = "ungate"    // the fence's gate was removed
	KDelete    = "delete"    // a deletion was requested (Grace; Note who)
	KGone      = "gone"      // the pod object was removed
	KRecord    = "record"    // the store recorded the pod (UID) as the attempt's
	KOutcome   = "outcome"   // the store recorded the attempt's outcome (Phase, Reason, Code, UID)
	KFinal     = "final"     // the store recorded the task's final outcome
	KDiscarded = "discarded" // the store recorded how a lost attempt's pod (UID) ended (Code)
	KFault     = "fault"     // the world injected a fault (Note)
	KProcess   = "process"   // a process started, crashed, paused (Note)
	KEnd       = "end"       // the run ended (Note: why); what follows describes the end state
	KLeft      = "left"      // at the end: a pod is left (Note: finalizer, running)
	KOpen      = "open"      // at the end: a task has no final outcome
	KLog       = "log"       // at the end: a main container's log as written and as archived (Log)
	KRetire    = "retire"    // retention deleted Task's finished record (its ID may be used again)
)

// Event is one line of a run's history.
type Event struct {
	Seq     int
	At      time.Duration // simulated time since the run's start
	Kind    string
	Task    string
	Attempt int
	UID     string
	Code    *int32
	Phase   string
	Reason  string
	Grace   int64
	Note    string
	Log     *LogFacts `json:",omitempty"`
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%5d %9s %-8s", e.Seq, e.At.Truncate(time.Millisecond), e.Kind)
	if e.Task != "" {
		fmt.Fprintf(&b, " %s/%d", e.Task, e.Attempt)
	}
	if e.UID != "" {
		fmt.Fprintf(&b, " uid=%s", e.UID)
	}
	if e.Phase != "" {
		fmt.Fprintf(&b, " %s/%s", e.Phase, e.Reason)
	}
	if e.Code != nil {
		fmt.Fprintf(&b, " code=%d", *e.Code)
	}
	if e.Kind == KDelete {
		fmt.Fprintf(&b, " grace=%d", e.Grace)
	}
	if e.Note != "" {
		fmt.Fprintf(&b, " (%s)", e.Note)
	}
	return b.String()
}

// History is a run's record of what happened, in order.
type History struct {
	mu     sync.Mutex
	start  time.Time
	now    func() time.Time
	Events []Event

	// A task ID used again after retention deleted its record names two
	// tasks, told apart by their records' nonces: the first record's is
	// the ID, a later one's the ID and "#2" (plan.label). labels maps a
	// record's nonce to its task's name, current an ID to the name its
	// next record takes.
	labels  map[string]string
	current map[string]string
}

// name is the history's name of the task of record id with nonce: the ID,
// or the name of the record a nonce was registered for.
func (h *History) name(id, nonce string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if l, ok := h.labels[nonce]; ok && nonce != "" {
		return l
	}
	return id
}

// register names the record of id just created, with nonce, by the name
// its ID's next record takes.
func (h *History) register(id, nonce string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.labels == nil {
		h.labels = map[string]string{}
	}
	if _, ok := h.labels[nonce]; ok || nonce == "" {
		return
	}
	l, ok := h.current[id]
	if !ok {
		l = id
	}
	h.labels[nonce] = l
}

// reuse says that the next record of id is task label.
func (h *History) reuse(id, label string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.current == nil {
		h.current = map[string]string{}
	}
	h.current[id] = label
}

func (h *History) add(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e.Seq = len(h.Events) + 1
	if h.now != nil {
		e.At = h.now().Sub(h.start)
	}
	h.Events = append(h.Events, e)
}

// String is the whole history, one event a line: the bytes two runs of one
// seed must share.
func (h *History) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, e := range h.Events {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}
