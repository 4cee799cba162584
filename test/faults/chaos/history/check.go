package history

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Invariant is one promise the checker holds kubetask to (docs/chaos.md).
type Invariant int

// The invariants. Complete is not kubetask's promise but the checker's
// premise: a history with a gap cannot vouch for anything.
const (
	Complete Invariant = iota
	OneRunPerAttempt
	NoRunAfterOutcome
	NoConcurrentRuns
	OneTrueOutcome
	NothingLeft
	LogsArchived
)

// Invariants lists them in order.
var Invariants = []Invariant{Complete, OneRunPerAttempt, NoRunAfterOutcome, NoConcurrentRuns, OneTrueOutcome, NothingLeft, LogsArchived}

func (i Invariant) String() string {
	switch i {
	case Complete:
		return "0 history complete"
	case OneRunPerAttempt:
		return "1 at most one run per attempt"
	case NoRunAfterOutcome:
		return "2 no run of an attempt after its outcome"
	case NoConcurrentRuns:
		return "3 no two pods of a task running at once"
	case OneTrueOutcome:
		return "4 one terminal outcome, the main container's"
	case NothingLeft:
		return "5 no pod or finalizer left"
	case LogsArchived:
		return "6 every log complete or marked"
	}
	return fmt.Sprintf("invariant %d", int(i))
}

// Violation is one broken promise and its evidence.
type Violation struct {
	Invariant Invariant
	// Task is the task's ID ("" when none applies); Attempt -1 when the
	// violation is the task's, not an attempt's.
	Task    string
	Attempt int
	Detail  string
	// At is when the offending pod was created (invariant 1), ran after
	// the outcome (2: its creation, binding or main container's start, the
	// first of them that came after the outcome) or was bound (3); zero for
	// the others.
	At time.Time
}

func (v Violation) String() string {
	where := v.Task
	if v.Attempt >= 0 {
		where += fmt.Sprintf(" attempt %d", v.Attempt)
	}
	if where == "" {
		return fmt.Sprintf("[%s] %s", v.Invariant, v.Detail)
	}
	return fmt.Sprintf("[%s] %s: %s", v.Invariant, where, v.Detail)
}

// Input is what Check judges.
type Input struct {
	// Audit is the API server's history of the pods.
	Audit *Audit
	// Tasks are the store's records (with their logs).
	Tasks []Task
	// Namespaces are the namespaces whose every pod is one of Tasks':
	// pods elsewhere are not judged. Empty: every namespace.
	Namespaces []string
	// Left are the pods of those namespaces that exist at the end.
	Left []corev1.Pod
}

// Report is Check's verdict.
type Report struct {
	// Violations, by invariant, task and attempt.
	Violations []Violation
	// Tasks is the number of records, Outcomes the attempt outcomes
	// recorded.
	Tasks, Outcomes int
	// PodsCreated and PodsRan count the pods created and bound.
	PodsCreated, PodsRan int
	// Fenced are pods created with the fence's gate that never ran;
	// NotRun the other pods that never ran (deleted before binding).
	Fenced, NotRun int
	// SeveralCreates and SeveralRuns count attempts with more than one
	// pod created, and run.
	SeveralCreates, SeveralRuns int
	// CreatedAfterOutcome counts pods created after their attempt's
	// outcome was recorded, whether they ran or not.
	CreatedAfterOutcome int
	// Refused counts creates answered AlreadyExists (the same-name guard),
	// RefusedAfterOutcome those sent after the attempt's outcome was
	// recorded: stale creations the guard stopped because the pod was
	// still there.
	Refused, RefusedAfterOutcome int
	// Stopped counts how the pods that ran were seen to stop ("status",
	// "phase", "delete"; "never" for none).
	Stopped map[string]int
	// Logs counts archived logs; Markers the complete ones that end with a
	// marker line, by marker.
	Logs    int
	Markers map[string]int
	// Lost counts the attempts declared lost with their cluster
	// (ClusterLost): at least once by design, not judged by invariants 3,
	// 4 and 6.
	Lost int
}

// Count is the number of violations of inv.
func (r *Report) Count(inv Invariant) int {
	n := 0
	for _, v := range r.Violations {
		if v.Invariant == inv {
			n++
		}
	}
	return n
}

// Check judges in against every invariant.
func Check(in Input) *Report {
	r := &Report{Stopped: map[string]int{}, Markers: map[string]int{}}
	c := checker{in: in, r: r, namespaces: map[string]bool{}, pods: map[string]map[int][]*Pod{}}
	for _, ns := range in.Namespaces {
		c.namespaces[ns] = true
	}
	c.history()
	for _, t := range in.Tasks {
		c.task(t)
	}
	c.left()
	slices.SortStableFunc(r.Violations, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.Invariant, b.Invariant), cmp.Compare(a.Task, b.Task), cmp.Compare(a.Attempt, b.Attempt))
	})
	return r
}

type checker struct {
	in         Input
	r          *Report
	namespaces map[string]bool
	// pods by task ID and attempt, in creation order.
	pods map[string]map[int][]*Pod
}

func (c *checker) judged(ns string) bool { return len(c.namespaces) == 0 || c.namespaces[ns] }

func (c *checker) violate(inv Invariant, taskID string, attempt int, format string, args ...any) {
	c.violateAt(time.Time{}, inv, taskID, attempt, format, args...)
}

func (c *checker) violateAt(at time.Time, inv Invariant, taskID string, attempt int, format string, args ...any) {
	c.r.Violations = append(c.r.Violations, Violation{Invariant: inv, Task: taskID, Attempt: attempt, Detail: fmt.Sprintf(format, args...), At: at})
}

// history indexes the pods and reports the gaps of the history.
func (c *checker) history() {
	a := c.in.Audit
	if a.BadLines > 0 {
		c.violate(Complete, "", -1, "%d lines of the audit log did not decode (a torn write): events may be missing", a.BadLines)
	}
	for _, w := range a.Unresolved {
		if c.judged(w.Namespace) {
			c.violate(Complete, "", -1, "%s: the pod's create is not in the audit log", w)
		}
	}
	for _, u := range a.Unidentified {
		if c.judged(u.Namespace) {
			c.violate(Complete, "", -1, "%s: a pod the checker cannot place (%s)", u.Write, u.Err)
		}
	}
	known := map[string]bool{}
	for _, t := range c.in.Tasks {
		known[t.Record.ID] = true
	}
	for _, p := range a.Order {
		if !c.judged(p.Namespace) {
			continue
		}
		if !known[p.Task] {
			c.violate(Complete, p.Task, p.Attempt, "pod %s belongs to a task the store does not know", p)
			continue
		}
		if c.pods[p.Task] == nil {
			c.pods[p.Task] = map[int][]*Pod{}
		}
		c.pods[p.Task][p.Attempt] = append(c.pods[p.Task][p.Attempt], p)
		c.r.PodsCreated++
		c.r.Refused += len(p.Refused)
		switch {
		case p.Ran():
			c.r.PodsRan++
			by := p.StoppedBy
			if by == "" {
				by = "never"
			}
			c.r.Stopped[by]++
		case p.Gated:
			c.r.Fenced++
		default:
			c.r.NotRun++
		}
	}
}

func (c *checker) task(t Task) {
	rec := t.Record
	if !c.judged(rec.Namespace) {
		return
	}
	c.r.Tasks++
	c.r.Outcomes += len(rec.Attempts)
	byAttempt := c.pods[rec.ID]
	last := rec.Attempt
	for a := range byAttempt {
		last = max(last, a)
	}
	var ran []*Pod
	for a := 0; a <= last; a++ {
		pods := byAttempt[a]
		out := outcomeOf(rec, a)
		var attemptRan []*Pod
		for _, p := range pods {
			if p.Ran() {
				attemptRan = append(attemptRan, p)
			}
		}
		ran = append(ran, attemptRan...)
		if len(pods) > 1 {
			c.r.SeveralCreates++
		}
		if len(attemptRan) > 1 {
			c.r.SeveralRuns++
			c.violateAt(attemptRan[len(attemptRan)-1].Created, OneRunPerAttempt, rec.ID, a, "%d pods ran: %s", len(attemptRan), describe(attemptRan))
		}
		for _, p := range attemptRan {
			if out != nil && out.Cluster != "" && p.Cluster != "" && p.Cluster != out.Cluster {
				c.violateAt(p.Bound, OneRunPerAttempt, rec.ID, a, "pod %s ran on cluster %s, but the attempt is recorded on %s", p, p.Cluster, out.Cluster)
			}
		}
		c.afterOutcome(rec, a, pods, out)
		if lost(out) {
			// Declared lost by an operator: at least once by design
			// (docs/multicluster.md). Its pod may run on beside the next
			// attempt, its outcome is not its pod's, its log may be
			// missing. Invariants 1 and 2 still hold for it.
			c.r.Lost++
			ran = ran[:len(ran)-len(attemptRan)]
			continue
		}
		if out != nil {
			c.outcome(rec, a, *out, attemptRan)
			c.mainLog(t, a, *out, attemptRan)
		}
	}
	c.concurrent(rec.ID, ran)
	c.terminal(rec)
	for _, l := range t.Logs {
		c.r.Logs++
		if !l.Info.Complete {
			c.violate(LogsArchived, rec.ID, l.Key.Attempt, "the log of container %s is not complete (%d bytes archived) and has no marker", l.Key.Container, l.Info.Size)
			continue
		}
		if m := marker(l.Tail); m != "" {
			c.r.Markers[m]++
		}
	}
}

// lost reports whether out is an attempt's declared loss with its cluster.
func lost(out *store.AttemptOutcome) bool {
	return out != nil && out.Reason == string(podstate.ReasonClusterLost)
}

// outcomeOf is the recorded outcome of attempt a, nil when none.
func outcomeOf(rec store.Record, a int) *store.AttemptOutcome {
	if a < len(rec.Attempts) && rec.Attempts[a].Attempt == a {
		return &rec.Attempts[a]
	}
	return nil
}

// afterOutcome: invariant 2. No pod of an attempt runs after the attempt's
// outcome was recorded (or any pod of an attempt after the task's final
// one): none is created after it and bound, none is bound after it, and no
// main container starts after it. Each comparison is one-sided: a binding
// is received after the scheduler decided and before anything runs, and a
// reported start is in whole seconds, never later than the start itself.
func (c *checker) afterOutcome(rec store.Record, a int, pods []*Pod, out *store.AttemptOutcome) {
	var at time.Time
	switch {
	case out != nil:
		at = out.ObservedAt
	case rec.Terminal && a > rec.Attempt && len(rec.Attempts) > 0:
		at = rec.Attempts[len(rec.Attempts)-1].ObservedAt
	default:
		return
	}
	when := at.Format(time.RFC3339Nano)
	for _, p := range pods {
		for _, r := range p.Refused {
			if r.After(at) {
				c.r.RefusedAfterOutcome++
			}
		}
		created := p.Created.After(at)
		if created {
			c.r.CreatedAfterOutcome++
		}
		switch {
		case !p.Ran():
		case created:
			c.violateAt(p.Created, NoRunAfterOutcome, rec.ID, a, "pod %s was created %s after the outcome was recorded (%s) and ran on %s from %s",
				p, p.Created.Sub(at).Round(time.Millisecond), when, p.Node, p.Bound.Format(time.RFC3339Nano))
		case p.Bound.After(at):
			c.violateAt(p.Bound, NoRunAfterOutcome, rec.ID, a, "pod %s, created before the outcome was recorded (%s), was bound to %s %s after it",
				p, when, p.Node, p.Bound.Sub(at).Round(time.Millisecond))
		case p.MainStartedAt.After(at):
			c.violateAt(p.MainStartedAt, NoRunAfterOutcome, rec.ID, a, "the main container of pod %s, bound to %s before the outcome was recorded (%s), started after it, at %s",
				p, p.Node, when, p.MainStartedAt.Format(time.RFC3339))
		}
	}
}

// concurrent: invariant 3, over the task's pods that ran.
func (c *checker) concurrent(id string, ran []*Pod) {
	slices.SortFunc(ran, func(a, b *Pod) int { return a.Bound.Compare(b.Bound) })
	for i, p := range ran {
		for _, q := range ran[i+1:] {
			if p.RunningAt(q.Bound) {
				until := "it was never seen to stop"
				if !p.Stopped.IsZero() {
					until = fmt.Sprintf("it stopped (%s) %s later", p.StoppedBy, p.Stopped.Sub(q.Bound).Round(time.Millisecond))
				}
				c.violateAt(q.Bound, NoConcurrentRuns, id, q.Attempt, "pod %s (attempt %d) was bound at %s while pod %s (attempt %d) ran: %s",
					q, q.Attempt, q.Bound.Format(time.RFC3339Nano), p, p.Attempt, until)
			}
		}
	}
}

// terminal: invariant 4, the record's side: finished, one outcome per
// attempt, the final outcome the last attempt's.
func (c *checker) terminal(rec store.Record) {
	if !rec.Terminal {
		c.violate(OneTrueOutcome, rec.ID, -1, "no terminal outcome: the record is %s/%s at attempt %d", rec.Phase, rec.Reason, rec.Attempt)
		return
	}
	if len(rec.Attempts) != rec.Attempt+1 {
		c.violate(OneTrueOutcome, rec.ID, -1, "%d attempt outcomes recorded for %d attempts", len(rec.Attempts), rec.Attempt+1)
	}
	for i, o := range rec.Attempts {
		if o.Attempt != i {
			c.violate(OneTrueOutcome, rec.ID, i, "outcome %d is recorded as attempt %d's", i, o.Attempt)
		}
	}
	if n := len(rec.Attempts); n > 0 {
		o := rec.Attempts[n-1]
		if rec.Phase != o.Phase || !sameCode(rec.ExitCode, o.ExitCode) {
			c.violate(OneTrueOutcome, rec.ID, -1, "the final outcome %s exit %s differs from the last attempt's %s exit %s",
				rec.Phase, code(rec.ExitCode), o.Phase, code(o.ExitCode))
		}
	}
}

// outcomePod is the pod an outcome was decided from: the last of the
// attempt's pods bound before the outcome was recorded.
func outcomePod(out store.AttemptOutcome, ran []*Pod) *Pod {
	var best *Pod
	for _, p := range ran {
		if p.Bound.Before(out.ObservedAt) && (best == nil || p.Bound.After(best.Bound)) {
			best = p
		}
	}
	return best
}

// outcome: invariant 4, the pod's side: the recorded exit code is the one
// the main container's status reported before the outcome was recorded.
func (c *checker) outcome(rec store.Record, a int, out store.AttemptOutcome, ran []*Pod) {
	p := outcomePod(out, ran)
	reported := p != nil && p.MainExit != nil && p.MainExitAt.Before(out.ObservedAt)
	switch {
	case p == nil && out.ExitCode != nil:
		c.violate(OneTrueOutcome, rec.ID, a, "recorded exit %d, but no pod of the attempt ran before the outcome was recorded", *out.ExitCode)
	case p == nil:
	case reported && out.ExitCode == nil:
		c.violate(OneTrueOutcome, rec.ID, a, "the main container of %s exited %d (reported %s before the outcome), but the outcome %s/%s has no exit code",
			p, *p.MainExit, out.ObservedAt.Sub(p.MainExitAt).Round(time.Millisecond), out.Phase, out.Reason)
	case reported && *out.ExitCode != *p.MainExit:
		c.violate(OneTrueOutcome, rec.ID, a, "the main container of %s exited %d, the outcome says %d", p, *p.MainExit, *out.ExitCode)
	case !reported && out.ExitCode != nil:
		c.violate(OneTrueOutcome, rec.ID, a, "recorded exit %d, but no status write reported the main container of %s terminated before the outcome was recorded", *out.ExitCode, p)
	}
	if out.Phase == "Succeeded" && out.ExitCode == nil && (!reported || *p.MainExit != 0) {
		c.violate(OneTrueOutcome, rec.ID, a, "recorded Succeeded, but no pod's main container was reported to exit 0 before")
	}
}

// mainLog: invariant 6 for an attempt whose main container started: its
// log is archived (complete is checked with the rest of the logs).
func (c *checker) mainLog(t Task, a int, out store.AttemptOutcome, ran []*Pod) {
	p := outcomePod(out, ran)
	if p == nil || !p.MainStarted || p.MainContainer == "" {
		return
	}
	for _, l := range t.Logs {
		if l.Key.Attempt == a && l.Key.Container == p.MainContainer {
			return
		}
	}
	c.violate(LogsArchived, t.Record.ID, a, "the main container %s of %s started, but its log is not archived", p.MainContainer, p)
}

// left: invariant 5.
func (c *checker) left() {
	for _, p := range c.in.Left {
		if !c.judged(p.Namespace) {
			continue
		}
		fin := ""
		if slices.Contains(p.Finalizers, task.Finalizer) {
			fin = ", finalizer " + task.Finalizer
		}
		c.violate(NothingLeft, p.Labels[task.LabelRun], -1, "pod %s/%s is left (phase %s, deleting %v%s)", p.Namespace, p.Name, p.Status.Phase, p.DeletionTimestamp != nil, fin)
	}
}

// marker is the kind of the marker line a log ends with ("" for none):
// its text up to the first ';'.
func marker(tail string) string {
	lines := strings.Split(strings.TrimRight(tail, "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "[kubetask: ") {
		return ""
	}
	m := strings.TrimPrefix(last, "[kubetask: ")
	if i := strings.IndexAny(m, ";]"); i >= 0 {
		m = m[:i]
	}
	return m
}

func describe(ps []*Pod) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%s created %s by %s, bound %s to %s", p, p.Created.Format(time.RFC3339Nano), p.Executor, p.Bound.Format(time.RFC3339Nano), p.Node))
	}
	return strings.Join(parts, "; ")
}

func sameCode(a, b *int32) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func code(c *int32) string {
	if c == nil {
		return "none"
	}
	return fmt.Sprint(*c)
}
