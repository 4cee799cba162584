package simulation

import (
	"fmt"
	"sort"
	"strings"
)

// The invariants, as the checker names them.
const (
	InvOneRun     = "1 one run per attempt"
	InvAfter      = "2 no run after the attempt's outcome"
	InvConcurrent = "3 no two runs of a task at once"
	InvOutcome    = "4 one true outcome, the main container's"
	InvLeft       = "5 nothing left"
	InvLiveness   = "6 liveness: every task ends once the faults stop"
	InvValid      = "7 a valid task is not refused"
	InvOwnPod     = "8 kubetask never deletes a running attempt's pod before its outcome"
	InvBlame      = "9 an outcome blames someone else's deletion only after one"
	InvLogs       = "10 logs archived"
	InvOwnRecord  = "11 a record takes only its own pods (an ID used again)"
	InvDiscarded  = "12 a lost attempt's discarded end is its pod's, and only a lost attempt has one"
)

// Violation is one broken invariant, with the history event (Seq) that
// shows it.
type Violation struct {
	Invariant string
	Task      string
	Attempt   int
	Seq       int
	Msg       string
}

func (v Violation) String() string {
	return fmt.Sprintf("[%s] %s/%d at event %d: %s", v.Invariant, v.Task, v.Attempt, v.Seq, v.Msg)
}

type podLife struct {
	uid      string
	task     string
	attempt  int
	bound    int // seq of the binding (0: never ran)
	stopped  int // seq it stopped (0: not yet)
	exit     *int32
	exitSeq  int
	deleting bool
	released int      // seq it was created ungated or its gate was removed
	cluster  string   // the clusters scenario: the cluster it was created in
	deleters []string // who asked for its deletion (KDelete's Note), in order
}

// Check judges a history: it returns every violation of the invariants
// (docs/simulation.md). valid names the tasks whose documents the API server
// accepts (a refusal of one is a violation).
func Check(events []Event, valid map[string]bool) []Violation {
	var out []Violation
	add := func(inv string, e Event, format string, args ...any) {
		out = append(out, Violation{Invariant: inv, Task: e.Task, Attempt: e.Attempt, Seq: e.Seq, Msg: fmt.Sprintf(format, args...)})
	}
	pods := map[string]*podLife{}
	type ta struct {
		task    string
		attempt int
	}
	outcome := map[ta]int{}        // seq of the attempt's recorded outcome
	final := map[string]int{}      // seq of the task's final outcome
	cancelled := map[string]int{}  // seq of the first cancellation
	cancelRec := map[string]int{}  // seq of the store's record of it
	recorded := map[ta]string{}    // the attempt's recorded pod
	submitted := map[string]bool{} // tasks a user submitted
	ran := map[ta][]string{}       // UIDs of the attempt's pods that ran
	lost := map[ta]bool{}          // attempts declared lost with their cluster (ClusterLost)
	declared := map[string]int{}   // seq of each cluster's declaration of loss
	for _, e := range events {
		k := ta{e.Task, e.Attempt}
		p := pods[e.UID]
		switch e.Kind {
		case KSubmit:
			submitted[e.Task] = true
		case KCancel:
			if cancelled[e.Task] == 0 {
				cancelled[e.Task] = e.Seq
			}
		case KCancelled:
			if cancelRec[e.Task] == 0 {
				cancelRec[e.Task] = e.Seq
			}
		case KRecord:
			recorded[k] = e.UID
			if p != nil && p.task != e.Task {
				add(InvOwnRecord, e, "the record took pod %s, which is %s's (attempt %d)", e.UID, p.task, p.attempt)
			}
		case KCreate:
			pods[e.UID] = &podLife{uid: e.UID, task: e.Task, attempt: e.Attempt}
			if _, c, ok := strings.Cut(e.Note, "on cluster "); ok {
				pods[e.UID].cluster = c
			}
			if !strings.HasPrefix(e.Note, "gated") {
				pods[e.UID].released = e.Seq
			}
		case KUngate:
			if p != nil && p.released == 0 {
				p.released = e.Seq
			}
		case KBind:
			if p == nil || p.bound != 0 {
				continue
			}
			p.bound = e.Seq
			ran[k] = append(ran[k], e.UID)
			if len(ran[k]) > 1 {
				add(InvOneRun, e, "pod %s is the attempt's second pod to run (pods %v)", e.UID, ran[k])
			}
			// kubetask's part in a run is the creation of an ungated pod
			// or the removal of its gate: neither may come after the
			// outcome, nor after the task's cancellation was recorded when
			// the pod runs after the outcome (the scheduler may bind a pod
			// released before).
			// A lost attempt's pod (ClusterLost) may start after the
			// declaration: its gate's removal may have been on its way,
			// decided on the claim before the loss. The declaration made
			// that attempt at-least-once; the Returning pass stops it.
			oc, fin, c := outcome[k], final[e.Task], cancelRec[e.Task]
			switch {
			case lost[k]: // at-least-once, declared
			case oc != 0 && p.released > oc:
				add(InvAfter, e, "pod %s runs: it was released to the scheduler (event %d) after the attempt's outcome was recorded (event %d)", e.UID, p.released, oc)
			case fin != 0 && p.released > fin:
				add(InvAfter, e, "pod %s runs: it was released to the scheduler (event %d) after the task's final outcome was recorded (event %d)", e.UID, p.released, fin)
			case max(oc, fin) != 0 && c != 0 && p.released > c:
				add(InvAfter, e, "pod %s runs after the outcome (event %d): it was released to the scheduler (event %d) after the task's cancellation was recorded (event %d)", e.UID, max(oc, fin), p.released, c)
			}
			for _, o := range pods {
				if o == p || o.task != p.task || o.bound == 0 || o.stopped != 0 {
					continue
				}
				switch {
				case lost[ta{o.task, o.attempt}] || lost[k]:
					// A pod of an attempt declared lost with its cluster
					// may run on beside the next attempt's: that is what
					// the declaration is (at-least-once for that attempt).
				case o.cluster != p.cluster && (declared[o.cluster] != 0 || declared[p.cluster] != 0):
					// Nor may any pod left on a cluster declared lost (the
					// sidecars of a finished attempt, stopping): the
					// declaration gives up waiting for that cluster.
				default:
					add(InvConcurrent, e, "pod %s was bound while pod %s (attempt %d) still ran", e.UID, o.uid, o.attempt)
				}
			}
		case KExit:
			if p != nil && p.exit == nil {
				p.exit, p.exitSeq = e.Code, e.Seq
			}
		case KStopped, KGone:
			if p != nil && p.bound != 0 && p.stopped == 0 {
				p.stopped = e.Seq
			}
		case KDelete:
			if p == nil {
				continue
			}
			if e.Note == "client" && p.bound != 0 && p.stopped == 0 && !p.deleting && outcome[k] == 0 && cancelled[e.Task] == 0 {
				add(InvOwnPod, e, "kubetask deleted pod %s, which runs attempt %d, before the attempt's outcome was recorded", e.UID, e.Attempt)
			}
			p.deleting = true
			p.deleters = append(p.deleters, e.Note)
		case KOutcome:
			if s := outcome[k]; s != 0 {
				add(InvOutcome, e, "a second outcome %s/%s for the attempt (the first at event %d)", e.Phase, e.Reason, s)
				continue
			}
			outcome[k] = e.Seq
			if e.Reason == "ClusterLost" {
				lost[k] = true
			}
			if p != nil && p.task != e.Task {
				add(InvOwnRecord, e, "the outcome names pod %s, which is %s's (attempt %d)", e.UID, p.task, p.attempt)
			}
			// The attempt's pod: the one the outcome names, else the last
			// of its pods bound.
			var ap *podLife
			for _, uid := range ran[k] {
				if uid == e.UID || ap == nil || e.UID == "" {
					ap = pods[uid]
				}
			}
			var code *int32
			if ap != nil && ap.exit != nil {
				code = ap.exit
			}
			switch {
			case e.Reason == "Cancelled", e.Reason == "ClusterLost": // kubetask's, not the container's
			case code != nil && (e.Code == nil || *e.Code != *code):
				add(InvOutcome, e, "the main container of pod %s exited %d (reported at event %d, before the outcome), but the outcome %s/%s has exit code %s",
					ap.uid, *code, ap.exitSeq, e.Phase, e.Reason, fmtCode(e.Code))
			case code == nil && e.Code != nil:
				add(InvOutcome, e, "the outcome %s/%s has exit code %d, but no exit of the attempt's main container was reported before it", e.Phase, e.Reason, *e.Code)
			}
			if e.Phase == "Succeeded" && (code == nil || *code != 0) {
				add(InvOutcome, e, "Succeeded without a reported exit 0 of the main container")
			}
			// DeletedExternally says someone else deleted the pod: a pod
			// only kubetask deleted was its own decision, taken on a
			// record that did not take the pod.
			uid := e.UID
			if uid == "" {
				uid = recorded[k]
			}
			if dp := pods[uid]; e.Reason == "DeletedExternally" && dp != nil && len(dp.deleters) > 0 && dp.deleters[0] == "client" {
				add(InvBlame, e, "the outcome %s/%s, but kubetask deleted pod %s first (deletions by %v)", e.Phase, e.Reason, uid, dp.deleters)
			}
		case KDiscarded:
			dp := pods[e.UID]
			switch {
			case !lost[k]:
				add(InvDiscarded, e, "a discarded end for attempt %d, which was not declared lost", e.Attempt)
			case dp == nil || dp.task != e.Task || dp.attempt != e.Attempt:
				add(InvDiscarded, e, "the discarded end names pod %s, which is not the lost attempt's", e.UID)
			case dp.exit == nil || e.Code == nil || *dp.exit != *e.Code:
				add(InvDiscarded, e, "the discarded end has exit code %s, but the kubelet reported %s for pod %s before it", fmtCode(e.Code), fmtCode(dp.exit), e.UID)
			}
		case KFault:
			if _, rest, ok := strings.Cut(e.Note, "declares cluster "); ok {
				if c, _, ok := strings.Cut(rest, " lost"); ok && declared[c] == 0 {
					declared[c] = e.Seq
				}
			}
		case KFinal:
			if s := final[e.Task]; s != 0 {
				add(InvOutcome, e, "a second final outcome (the first at event %d)", s)
			}
			final[e.Task] = e.Seq
			if e.Reason == "ConfigError" && valid[e.Task] {
				add(InvValid, e, "the task ended %s/%s although the API server accepts its pods", e.Phase, e.Reason)
			}
		case KLog:
			if msg := judgeLog(e.Log); msg != "" {
				add(InvLogs, e, "the main container's log of pod %s: %s", e.UID, msg)
			}
		case KLeft:
			add(InvLeft, e, "pod %s is left at the end: %s", e.UID, e.Note)
		case KOpen:
			add(InvLiveness, e, "no final outcome at the end (%s/%s: %s)", e.Phase, e.Reason, e.Note)
		case KEnd:
			if e.Note == "step limit" {
				add(InvLiveness, e, "the run did not settle within the step limit")
			}
		}
	}
	for t := range submitted {
		if final[t] == 0 && !hasOpen(events, t) {
			add(InvLiveness, Event{Task: t}, "no final outcome recorded")
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

func hasOpen(events []Event, t string) bool {
	for _, e := range events {
		if e.Kind == KOpen && e.Task == t || e.Kind == KEnd && e.Note != "quiet" {
			return true
		}
	}
	return false
}

func fmtCode(c *int32) string {
	if c == nil {
		return "none"
	}
	return fmt.Sprint(*c)
}

// judgeLog says what is wrong with an archived log ("" when nothing is):
// it must be complete, and hold every byte the container wrote, once and
// in order; only a log whose node was lost may end early, with one marker
// line that says so.
func judgeLog(f *LogFacts) string {
	switch {
	case f == nil:
		return "no facts"
	case f.None:
		return fmt.Sprintf("nothing archived (%d bytes written)", len(f.Written))
	case !f.Complete:
		return fmt.Sprintf("not complete at the end (%d of %d bytes archived)", len(f.Archived), len(f.Written))
	case f.Archived == f.Written:
		return ""
	}
	body, marker := f.Archived, ""
	if i := strings.LastIndex(strings.TrimSuffix(body, "\n"), "\n[kubetask: "); i >= 0 || strings.HasPrefix(body, "[kubetask: ") {
		body, marker = body[:i+1], body[i+1:]
	}
	switch {
	case marker != "" && !f.Lost:
		return fmt.Sprintf("ends with a marker although its node was never lost: %q", strings.TrimSpace(marker))
	case marker != "" && strings.HasPrefix(f.Written, body):
		return ""
	}
	n := 0
	for n < len(body) && n < len(f.Written) && body[n] == f.Written[n] {
		n++
	}
	return fmt.Sprintf("the archive differs from what the container wrote at byte %d: archived %q, written %q", n, clip(body[n:]), clip(f.Written[n:]))
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
