package history

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kubetask/kubetask/pkg/task"
)

// The fence's marks on a pod (the contract of issue 20): the creating
// term's fencing epoch, the task record's nonce, and the scheduling gate a
// pod is created with and keeps until the store recorded its UID as the
// attempt's pod.
const (
	AnnotationEpoch = task.AnnotationEpoch
	AnnotationNonce = task.AnnotationNonce
	FenceGate       = task.FenceGate
)

// Pod is one pod kubetask created, as the audit log tells its life. Times
// are the API server's: when it received the request (every request here is
// judged by its receipt, see the package comment).
type Pod struct {
	UID             types.UID
	Namespace, Name string
	// Task is the run ID (the task's ID), Attempt the attempt number, both
	// from the pod's identity (task.IdentityFromPod); Executor the instance
	// that created it.
	Task     string
	Attempt  int
	Executor string
	// Cluster is the cluster whose API server's audit log told of the pod
	// (Merge); "" for a history of one cluster.
	Cluster string
	// Epoch and Nonce are the fence's annotations ("" on pods without them).
	Epoch, Nonce string
	// MainContainer is the container whose exit decides the task.
	MainContainer string
	// Containers are the regular containers and native sidecars (init
	// containers with restartPolicy Always): the pod runs while one of them
	// may.
	Containers []string
	// Gated is set when the pod was created with FenceGate; Ungated is when
	// a write removed it (zero if never).
	Gated   bool
	Ungated time.Time
	// Created is when the create was received, CreateAnswered when it was
	// answered.
	Created, CreateAnswered time.Time
	// Unanswered: the create was answered with a server error (its outcome
	// unknown to its client), and a later write named the pod's UID.
	Unanswered bool
	// Bound is when the binding was received (zero: never bound, never
	// ran); Node is the node.
	Bound time.Time
	Node  string
	// Stopped is when the pod was known to run nothing any more (zero:
	// never), StoppedBy how: "status", "phase" or "delete".
	Stopped   time.Time
	StoppedBy string
	// MainStarted is set once a status write reported the main container
	// running or terminated.
	MainStarted bool
	// MainStartedAt is the latest start of the main container that a status
	// write reported: the startedAt of its running or terminated state,
	// the node's clock in whole seconds (so never later than the start).
	// Zero when none reported one (a container that never started).
	MainStartedAt time.Time
	// MainExit is the main container's exit code from the first status
	// write that reported it terminated, at MainExitAt (nil: never reported).
	MainExit   *int32
	MainExitAt time.Time
	// Deleted is the first delete (also a force delete), Evicted the first
	// eviction that was granted (zero: none).
	Deleted, Evicted time.Time
	// Refused are the receipts of later creates of the pod's name that
	// were answered 409 AlreadyExists while it existed: creations the
	// same-name guard stopped.
	Refused []time.Time

	terminated map[string]bool
}

// Ran reports whether the pod was bound to a node.
func (p *Pod) Ran() bool { return !p.Bound.IsZero() }

// RunningAt reports whether the pod was running at t: bound at or before t
// and not stopped before t.
func (p *Pod) RunningAt(t time.Time) bool {
	return p.Ran() && !p.Bound.After(t) && (p.Stopped.IsZero() || t.Before(p.Stopped))
}

// String names the pod for messages: namespace/name and a short UID.
func (p *Pod) String() string {
	uid := string(p.UID)
	if len(uid) > 8 {
		uid = uid[:8]
	}
	return fmt.Sprintf("%s/%s (uid %s)", p.Namespace, p.Name, uid)
}

// Audit is what an audit log told about kubetask's pods.
type Audit struct {
	// Pods by UID, and in order of creation.
	Pods  map[types.UID]*Pod
	Order []*Pod
	// Events is the number of audit events read, BadLines the lines that
	// did not decode (a line torn by a killed API server).
	Events, BadLines int
	// Unresolved are successful writes (binding, status, delete, ...) to
	// a pod whose create is not in the log: a gap in the history when they
	// are in a namespace whose pods are all kubetask's.
	Unresolved []Write
	// Unidentified are successful creates of pods that are not kubetask's
	// or whose identity does not parse (task.IdentityFromPod): a pod the
	// checker cannot place, a gap when its namespace's pods are all
	// kubetask's.
	Unidentified []Unidentified
	// First and Last are the earliest and latest receipt in the log.
	First, Last time.Time
}

// Unidentified is a create of a pod the checker cannot place, and why.
type Unidentified struct {
	Write
	Err string
}

// Write is one successful request to a pod.
type Write struct {
	Verb, Namespace, Name, Subresource string
	At                                 time.Time
}

func (w Write) String() string {
	name := w.Namespace + "/" + w.Name
	if w.Subresource != "" {
		name += "/" + w.Subresource
	}
	return fmt.Sprintf("%s %s at %s", w.Verb, name, w.At.Format(time.RFC3339Nano))
}

// Merge is one history of the pods of several clusters, from each
// cluster's audit log by its name: each pod marked with its Cluster. Pod
// UIDs are unique across clusters, and the API servers of one machine share
// its clock, so the pods' times compare across clusters.
func Merge(byCluster map[string]*Audit) *Audit {
	out := &Audit{Pods: map[types.UID]*Pod{}}
	for _, name := range slices.Sorted(maps.Keys(byCluster)) {
		a := byCluster[name]
		for _, p := range a.Order {
			p.Cluster = name
			out.Pods[p.UID] = p
			out.Order = append(out.Order, p)
		}
		out.Events += a.Events
		out.BadLines += a.BadLines
		out.Unresolved = append(out.Unresolved, a.Unresolved...)
		out.Unidentified = append(out.Unidentified, a.Unidentified...)
		if !a.First.IsZero() && (out.First.IsZero() || a.First.Before(out.First)) {
			out.First = a.First
		}
		if a.Last.After(out.Last) {
			out.Last = a.Last
		}
	}
	slices.SortStableFunc(out.Order, func(a, b *Pod) int { return a.Created.Compare(b.Created) })
	return out
}

// ReadAudit reads an audit log (JSON lines of audit.k8s.io/v1 Events, as
// written under localcluster.PodAuditPolicy; other events are skipped) and
// returns kubetask's pods. It fails only on a read error; lines that do not
// decode are counted in BadLines.
func ReadAudit(r io.Reader) (*Audit, error) {
	var evs []auditv1.Event
	bad := 0
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var ev auditv1.Event
			if jerr := json.Unmarshal(line, &ev); jerr != nil {
				bad++
			} else {
				evs = append(evs, ev)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the audit log: %w", err)
		}
	}
	a := FromAudit(evs)
	a.BadLines = bad
	return a, nil
}

// FromAudit builds the pods' histories from audit events (in any order).
func FromAudit(evs []auditv1.Event) *Audit {
	a := &Audit{Pods: map[types.UID]*Pod{}}
	var writes []*auditv1.Event
	// The creates first, each name's in the order they were received: a
	// create's response can complete after the scheduler has bound the pod
	// (seen at 1.1 s under load), so completion order is not the order of
	// the pod's life.
	creates := map[string][]create{}
	// Creates answered with a server error, by name: each may have made
	// its pod, which a later write then names by UID.
	unanswered := map[string][]*auditv1.Event{}
	for i := range evs {
		ev := &evs[i]
		ref := ev.ObjectRef
		if ev.Stage != auditv1.StageResponseComplete || ref == nil || ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		a.Events++
		at := ev.RequestReceivedTimestamp.Time
		if a.First.IsZero() || at.Before(a.First) {
			a.First = at
		}
		if at.After(a.Last) {
			a.Last = at
		}
		if dryRun(ev) {
			continue
		}
		key := ref.Namespace + "/" + ref.Name
		if ev.Verb == "create" && ref.Subresource == "" && ev.ResponseStatus != nil && ev.ResponseStatus.Code >= 500 {
			unanswered[key] = append(unanswered[key], ev)
			continue
		}
		if ev.Verb == "create" && ref.Subresource == "" && succeeded(ev) {
			p, err := a.created(ev)
			if err != nil {
				a.Unidentified = append(a.Unidentified, Unidentified{Write: Write{Verb: ev.Verb, Namespace: ref.Namespace, Name: ref.Name, At: at}, Err: err.Error()})
			}
			creates[key] = append(creates[key], create{received: at, pod: p})
			continue
		}
		writes = append(writes, ev)
	}
	for _, cs := range creates {
		slices.SortStableFunc(cs, func(x, y create) int { return x.received.Compare(y.received) })
	}
	slices.SortStableFunc(a.Order, func(x, y *Pod) int { return x.Created.Compare(y.Created) })
	slices.SortStableFunc(writes, func(x, y *auditv1.Event) int {
		return x.RequestReceivedTimestamp.Compare(y.RequestReceivedTimestamp.Time)
	})
	for _, ev := range writes {
		ref := ev.ObjectRef
		at := ev.RequestReceivedTimestamp.Time
		key := ref.Namespace + "/" + ref.Name
		// The pod a write went to: the one its body names, else the one of
		// the name's latest create received before the write completed
		// (two pods of one name never exist at once; a write needs its pod
		// to exist). seen is false when no create of the name is known.
		var p *Pod
		seen := false
		for _, c := range creates[key] {
			if !c.received.After(ev.StageTimestamp.Time) {
				p, seen = c.pod, true
			}
		}
		if uid := writtenUID(ev); uid != "" {
			if _, ok := a.Pods[uid]; !ok {
				// The pod of a create answered with a server error?
				for i, u := range unanswered[key] {
					if u == nil || u.RequestReceivedTimestamp.After(ev.StageTimestamp.Time) {
						continue
					}
					if q := a.createdUnanswered(u, uid); q != nil {
						unanswered[key][i] = nil
						creates[key] = append(creates[key], create{received: q.Created, pod: q})
						slices.SortStableFunc(creates[key], func(x, y create) int { return x.received.Compare(y.received) })
						break
					}
				}
			}
			if q, ok := a.Pods[uid]; ok {
				p, seen = q, true
			} else if p != nil {
				p, seen = nil, false // a UID the log never saw created
			}
		}
		if !succeeded(ev) {
			if p != nil && ev.Verb == "create" && ref.Subresource == "" && ev.ResponseStatus != nil && ev.ResponseStatus.Code == 409 {
				p.Refused = append(p.Refused, at)
			}
			continue
		}
		if p == nil {
			if !seen {
				a.Unresolved = append(a.Unresolved, Write{Verb: ev.Verb, Namespace: ref.Namespace, Name: ref.Name, Subresource: ref.Subresource, At: at})
			}
			continue // a pod that is not kubetask's
		}
		switch {
		case ev.Verb == "create" && ref.Subresource == "binding":
			if p.Bound.IsZero() || at.Before(p.Bound) {
				p.Bound = at
				var b corev1.Binding
				if decode(ev.RequestObject, &b) == nil {
					p.Node = b.Target.Name
				}
			}
		case ev.Verb == "create" && ref.Subresource == "eviction":
			if p.Evicted.IsZero() {
				p.Evicted = at
			}
		case (ev.Verb == "update" || ev.Verb == "patch") && ref.Subresource == "status":
			p.statusWritten(ev, at)
		case (ev.Verb == "update" || ev.Verb == "patch") && ref.Subresource == "":
			if p.Gated && p.Ungated.IsZero() && gateRemoved(ev) {
				p.Ungated = at
			}
		case ev.Verb == "delete" && ref.Subresource == "":
			if p.Deleted.IsZero() {
				p.Deleted = at
			}
			if gracePeriod(ev) == 0 {
				p.stop(at, "delete")
			}
		}
	}
	// Pods of creates answered with a server error joined the order late.
	slices.SortStableFunc(a.Order, func(x, y *Pod) int { return x.Created.Compare(y.Created) })
	return a
}

// create is a successful create of a name: when it was received, and its
// pod (nil for a pod that is not kubetask's).
type create struct {
	received time.Time
	pod      *Pod
}

// created records a successful pod create; an error for a pod it cannot
// place: not kubetask's, or its identity does not parse.
func (a *Audit) created(ev *auditv1.Event) (*Pod, error) {
	var pod corev1.Pod
	if err := decode(ev.ResponseObject, &pod); err != nil {
		return nil, fmt.Errorf("the create's response: %w", err)
	}
	if pod.UID == "" {
		return nil, errors.New("the create's response has no pod UID")
	}
	return a.podOf(&pod, ev)
}

// createdUnanswered records the pod of a create answered with a server
// error (a 504 while etcd was slow: the pod may exist all the same) once a
// later write names its UID; nil when the request is not a kubetask pod.
func (a *Audit) createdUnanswered(ev *auditv1.Event, uid types.UID) *Pod {
	var pod corev1.Pod
	if decode(ev.RequestObject, &pod) != nil {
		return nil
	}
	if pod.Namespace == "" && ev.ObjectRef != nil {
		pod.Namespace = ev.ObjectRef.Namespace
	}
	pod.UID = uid
	p, err := a.podOf(&pod, ev)
	if err != nil {
		return nil
	}
	p.Unanswered = true
	return p
}

// podOf records pod, created by ev.
func (a *Audit) podOf(pod *corev1.Pod, ev *auditv1.Event) (*Pod, error) {
	id, attempt, err := task.IdentityFromPod(pod)
	if err != nil {
		return nil, err
	}
	p := &Pod{
		UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name,
		Task: id.RunID, Attempt: attempt, Executor: id.Executor,
		Epoch: pod.Annotations[AnnotationEpoch], Nonce: pod.Annotations[AnnotationNonce],
		MainContainer:  pod.Annotations[task.AnnotationMainContainer],
		Created:        ev.RequestReceivedTimestamp.Time,
		CreateAnswered: ev.StageTimestamp.Time,
		terminated:     map[string]bool{},
	}
	for _, c := range pod.Spec.Containers {
		p.Containers = append(p.Containers, c.Name)
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			p.Containers = append(p.Containers, c.Name)
		}
	}
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name == FenceGate {
			p.Gated = true
		}
	}
	if pod.Spec.NodeName != "" {
		p.Bound, p.Node = p.Created, pod.Spec.NodeName
	}
	if old := a.Pods[p.UID]; old != nil {
		return old, nil // the same event twice
	}
	a.Pods[p.UID] = p
	a.Order = append(a.Order, p)
	return p, nil
}

// status is what a status write says: a strategic merge patch that names
// only the containers that changed is read as well as a whole status.
type status struct {
	Phase                 corev1.PodPhase   `json:"phase"`
	ContainerStatuses     []containerReport `json:"containerStatuses"`
	InitContainerStatuses []containerReport `json:"initContainerStatuses"`
}

type containerReport struct {
	Name  string `json:"name"`
	State struct {
		Running *struct {
			StartedAt metav1.Time `json:"startedAt"`
		} `json:"running"`
		Terminated *struct {
			ExitCode  int32       `json:"exitCode"`
			StartedAt metav1.Time `json:"startedAt"`
		} `json:"terminated"`
	} `json:"state"`
}

// startedAt is when the container's reported state says it started (zero:
// it does not say, or it never started).
func (c containerReport) startedAt() time.Time {
	switch {
	case c.State.Running != nil:
		return c.State.Running.StartedAt.Time
	case c.State.Terminated != nil:
		return c.State.Terminated.StartedAt.Time
	}
	return time.Time{}
}

func (p *Pod) statusWritten(ev *auditv1.Event, at time.Time) {
	r, ok := readStatus(ev)
	if !ok {
		return
	}
	for _, c := range append(r.ContainerStatuses, r.InitContainerStatuses...) {
		if c.Name == p.MainContainer && (c.State.Running != nil || c.State.Terminated != nil) {
			p.MainStarted = true
			if s := c.startedAt(); s.After(p.MainStartedAt) {
				p.MainStartedAt = s
			}
		}
		if c.State.Terminated == nil {
			continue
		}
		p.terminated[c.Name] = true
		if c.Name == p.MainContainer && p.MainExit == nil {
			code := c.State.Terminated.ExitCode
			p.MainExit, p.MainExitAt = &code, at
		}
	}
	if r.Phase == corev1.PodSucceeded || r.Phase == corev1.PodFailed {
		p.stop(at, "phase")
	}
	all := len(p.Containers) > 0
	for _, c := range p.Containers {
		all = all && p.terminated[c]
	}
	if all {
		p.stop(at, "status")
	}
}

// readStatus reads what a status write says, whatever its form: a whole
// pod (update), a strategic or JSON merge patch ({"status": ...}), or a
// JSON patch whose operations set /status, its phase or its container
// status lists (as the local node writes). ok is false for a body it cannot
// read.
func readStatus(ev *auditv1.Event) (st status, ok bool) {
	if ev.RequestObject == nil || len(ev.RequestObject.Raw) == 0 {
		return st, false
	}
	raw := ev.RequestObject.Raw
	if bytes.HasPrefix(bytes.TrimSpace(raw), []byte("[")) {
		var ops []struct {
			Op    string          `json:"op"`
			Path  string          `json:"path"`
			Value json.RawMessage `json:"value"`
		}
		if json.Unmarshal(raw, &ops) != nil {
			return st, false
		}
		for _, op := range ops {
			if op.Op != "replace" && op.Op != "add" {
				continue
			}
			var err error
			switch op.Path {
			case "/status":
				err = json.Unmarshal(op.Value, &st)
			case "/status/phase":
				err = json.Unmarshal(op.Value, &st.Phase)
			case "/status/containerStatuses":
				err = json.Unmarshal(op.Value, &st.ContainerStatuses)
			case "/status/initContainerStatuses":
				err = json.Unmarshal(op.Value, &st.InitContainerStatuses)
			}
			if err != nil {
				return st, false
			}
		}
		return st, true
	}
	var body struct {
		Status status `json:"status"`
	}
	if json.Unmarshal(raw, &body) != nil {
		return st, false
	}
	return body.Status, true
}

func (p *Pod) stop(at time.Time, by string) {
	if p.Stopped.IsZero() || at.Before(p.Stopped) {
		p.Stopped, p.StoppedBy = at, by
	}
}

// succeeded reports a 2xx answer.
func succeeded(ev *auditv1.Event) bool {
	return ev.ResponseStatus != nil && ev.ResponseStatus.Code >= 200 && ev.ResponseStatus.Code < 300
}

// dryRun reports a request made with dryRun (kubetask validates tasks
// with a dry-run create): it changed nothing.
func dryRun(ev *auditv1.Event) bool {
	u, err := url.Parse(ev.RequestURI)
	return err == nil && u.Query().Get("dryRun") != ""
}

// writtenUID is the pod UID a write names: a binding's, a full pod's, or a
// delete's precondition.
func writtenUID(ev *auditv1.Event) types.UID {
	var ops []struct {
		Op, Path string
		Value    json.RawMessage
	}
	if ev.RequestObject != nil && decode(ev.RequestObject, &ops) == nil {
		// A JSON patch: kubetask's test of /metadata/uid names the pod.
		for _, op := range ops {
			var uid types.UID
			if op.Op == "test" && op.Path == "/metadata/uid" && json.Unmarshal(op.Value, &uid) == nil {
				return uid
			}
		}
		return ""
	}
	var v struct {
		Metadata struct {
			UID types.UID `json:"uid"`
		} `json:"metadata"`
		Preconditions *struct {
			UID *types.UID `json:"uid"`
		} `json:"preconditions"`
	}
	if decode(ev.RequestObject, &v) != nil {
		return ""
	}
	if v.Preconditions != nil && v.Preconditions.UID != nil {
		return *v.Preconditions.UID
	}
	return v.Metadata.UID
}

// gateRemoved reports whether a pod write leaves the pod without FenceGate:
// it sets spec.schedulingGates to a list (or null) without it.
func gateRemoved(ev *auditv1.Event) bool {
	var v struct {
		Spec map[string]json.RawMessage `json:"spec"`
	}
	if decode(ev.RequestObject, &v) != nil {
		return false
	}
	raw, ok := v.Spec["schedulingGates"]
	if !ok {
		return false
	}
	var gates []corev1.PodSchedulingGate
	if json.Unmarshal(raw, &gates) != nil {
		return false
	}
	for _, g := range gates {
		if g.Name == FenceGate {
			return false
		}
	}
	return true
}

// gracePeriod is a delete's grace period in seconds, from its body or its
// query; -1 when it names none (the pod's own applies).
func gracePeriod(ev *auditv1.Event) int64 {
	var opts struct {
		GracePeriodSeconds *int64 `json:"gracePeriodSeconds"`
	}
	if decode(ev.RequestObject, &opts) == nil && opts.GracePeriodSeconds != nil {
		return *opts.GracePeriodSeconds
	}
	if u, err := url.Parse(ev.RequestURI); err == nil {
		if s := u.Query().Get("gracePeriodSeconds"); s != "" {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}

// decode unmarshals a logged object (JSON, as the log backend writes it).
func decode(u *runtime.Unknown, v any) error {
	if u == nil || len(u.Raw) == 0 {
		return errors.New("no object")
	}
	return json.Unmarshal(u.Raw, v)
}
