package simulation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/pkg/task"
)

// historyLimit is how many changes of a resource the API server keeps for
// watches (its watch cache): a watch from an older resourceVersion gets 410
// Expired.
const historyLimit = 64

var podsGR = schema.GroupResource{Resource: "pods"}

// apiServer is the simulated kube-apiserver: pods and Leases with one
// resourceVersion counter, watches of each with a bounded history of its
// own (as the watch cache of each resource), and the admission rules
// kubetask's correctness leans on.
type apiServer struct {
	mu     sync.Mutex
	steps  *steps
	hist   *History
	now    func() time.Time
	rv     int64
	uids   int
	pods   map[string]*corev1.Pod
	leases map[string]*coordinationv1.Lease
	// scopes (by actor) and podScope (by UID) are the clusters of the
	// clusters scenario: nil outside it (keyFor, keyOf).
	scopes   map[string]string
	podScope map[types.UID]string
	// logs are the changes of each resource ("pods", "leases") kept for
	// watches.
	logs     map[string]*changeLog
	watches  []*objWatch
	watchIDs int
	// refuseCreates makes pod creations fail as a quota would.
	refuseCreates bool
	// clogs are the kubelet's logs of the main containers that started,
	// by pod UID; logWake is closed at every change of one.
	clogs   map[string]*containerLog
	logWake chan struct{}
	idMu    sync.Mutex
	ids     map[types.UID]taskAttempt // taskOf by pod UID
	// unknown lists requests the server does not model (a test fails on them).
	unknown []string
}

// object is what the server stores: a pod or a Lease.
type object interface {
	metav1.Object
	runtime.Object
}

// change is one committed change of an object.
type change struct {
	rv       int64
	old, obj object // old nil: added; obj nil: deleted
}

// changeLog is the bounded history of one resource's changes.
type changeLog struct {
	changes []change
	// compacted: changes up to this resourceVersion are gone.
	compacted int64
}

func newAPIServer(st *steps, h *History, now func() time.Time) *apiServer {
	// rv starts at 1, as etcd's revision does: a list never answers
	// resourceVersion "0", which a watch reads as "from any version" (from
	// now, here), so a watch from a fresh server's first list would miss
	// what changed between the two instead of replaying it or expiring.
	return &apiServer{steps: st, hist: h, now: now, rv: 1, pods: map[string]*corev1.Pod{}, leases: map[string]*coordinationv1.Lease{},
		logs: map[string]*changeLog{"pods": {}, "leases": {}}, clogs: map[string]*containerLog{}, logWake: make(chan struct{}), ids: map[types.UID]taskAttempt{}}
}

// compact drops every resource's history: every watch ends with 410
// Expired, and a watch from an earlier resourceVersion gets it at once
// (s.mu held).
func (s *apiServer) compact() {
	for _, l := range s.logs {
		l.compacted, l.changes = s.rv, nil
	}
	for _, w := range s.watches {
		w.expire()
	}
}

// taskAttempt is a pod's task and attempt.
type taskAttempt struct {
	task    string
	attempt int
}

// taskOf is the free taskOf, kept by UID: a pod's identity never changes,
// and reading it (label checks, the name's hash) was a third of a run's
// time when the world looked at every pod at every step.
func (s *apiServer) taskOf(p *corev1.Pod) (string, int) {
	if p.UID == "" {
		t, n := taskOf(p)
		return s.hist.name(t, p.Annotations[task.AnnotationNonce]), n
	}
	s.idMu.Lock()
	defer s.idMu.Unlock()
	if ta, ok := s.ids[p.UID]; ok {
		return ta.task, ta.attempt
	}
	t, n := taskOf(p)
	t = s.hist.name(t, p.Annotations[task.AnnotationNonce])
	s.ids[p.UID] = taskAttempt{t, n}
	return t, n
}

// taskOf names a pod by its task and attempt, as the history does.
func taskOf(p *corev1.Pod) (string, int) {
	id, n, err := task.IdentityFromPod(p)
	if err != nil {
		return "?" + p.Name, 0
	}
	return id.RunID, n
}

func describe(a k8stesting.Action) string {
	name := ""
	switch a := a.(type) {
	case interface{ GetObject() runtime.Object }: // create, update
		if m, ok := a.GetObject().(metav1.Object); ok {
			name = m.GetName()
		}
	case interface{ GetName() string }: // get, patch, delete
		name = a.GetName()
	}
	r := a.GetResource().Resource
	if sub := a.GetSubresource(); sub != "" {
		r += "/" + sub
	}
	// Lists of one process's several executors (a replica's shards) differ
	// by their selectors: keys that tell them apart replay in one order.
	if l, ok := a.(k8stesting.ListAction); ok && l.GetListRestrictions().Labels != nil && !l.GetListRestrictions().Labels.Empty() {
		name += "[" + l.GetListRestrictions().Labels.String() + "]"
	}
	return a.GetVerb() + " " + r + " " + name
}

// errInjected marks the errors the world injects into a step.
var errInjected = errors.New("injected")

func (s *apiServer) request(ctx context.Context, actor string, a k8stesting.Action) (runtime.Object, error) {
	actor = actorOf(ctx, actor) // a user's request served by the process
	d := describe(a)
	if err := s.steps.wait(ctx, actor, actor+" api> "+d); err != nil {
		if errors.Is(err, errInjected) {
			return nil, apierrors.NewServiceUnavailable("simulated: " + d + " refused")
		}
		return nil, err
	}
	s.mu.Lock()
	obj, err := s.apply(actor, a)
	s.mu.Unlock()
	// The answer is a step of its own, a read's too: the caller may be
	// descheduled between the server's answer and its use of it.
	if a.GetResource().Resource != "events" {
		if werr := s.steps.wait(ctx, actor, actor+" api< "+d); werr != nil {
			return nil, apierrors.NewTimeoutError("simulated: the answer to "+d+" was lost", 0)
		}
	}
	return obj, err
}

// keyFor is the key of pod ns/name to actor's requests: in the clusters
// scenario each cluster's pods are apart (two clusters may hold a pod of
// one name), by the cluster of the actor's instance (scopes).
func (s *apiServer) keyFor(actor, ns, name string) string {
	return scopedKey(s.scopes[actor], ns, name)
}

// keyOf is p's key: in the cluster it was created in.
func (s *apiServer) keyOf(p *corev1.Pod) string {
	return scopedKey(s.podScope[p.UID], p.Namespace, p.Name)
}

// scopedKey is the key of pod ns/name in cluster sc ("": the one cluster).
func scopedKey(sc, ns, name string) string {
	if sc != "" {
		return sc + ":" + ns + "/" + name
	}
	return ns + "/" + name
}

// scope makes actor's pod requests go to cluster's pods (the clusters
// scenario).
func (s *apiServer) scope(actor, cluster string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.scopes == nil {
		s.scopes, s.podScope = map[string]string{}, map[types.UID]string{}
	}
	s.scopes[actor] = cluster
}

func (s *apiServer) apply(actor string, a k8stesting.Action) (runtime.Object, error) {
	switch a.GetResource().Resource {
	case "pods":
		if a.GetSubresource() != "" {
			break
		}
		switch a.GetVerb() {
		case "create":
			c := a.(k8stesting.CreateActionImpl)
			return s.createPod(actor, c.GetObject().(*corev1.Pod), len(c.CreateOptions.DryRun) > 0)
		case "get":
			g := a.(k8stesting.GetAction)
			p := s.pods[s.keyFor(actor, g.GetNamespace(), g.GetName())]
			if p == nil {
				return nil, apierrors.NewNotFound(podsGR, g.GetName())
			}
			return p.DeepCopy(), nil
		case "list":
			return s.listPods(a.GetNamespace(), a.(k8stesting.ListActionImpl).GetListRestrictions().Labels), nil
		case "update":
			return s.updatePod(actor, a.(k8stesting.UpdateAction).GetObject().(*corev1.Pod))
		case "patch":
			return s.patchPod(actor, a.(k8stesting.PatchAction))
		case "delete":
			d := a.(k8stesting.DeleteActionImpl)
			return nil, s.deletePod(s.keyFor(actor, d.GetNamespace(), d.GetName()), d.DeleteOptions, "client")
		}
	case "leases":
		return s.lease(a)
	case "events":
		return &corev1.Event{}, nil
	}
	s.unknown = append(s.unknown, describe(a))
	return nil, apierrors.NewMethodNotSupported(a.GetResource().GroupResource(), a.GetVerb())
}

func (s *apiServer) nextRV() string {
	s.rv++
	return strconv.FormatInt(s.rv, 10)
}

// commit stores p (nil: removes key) as a new version and logs the change.
func (s *apiServer) commit(key string, p *corev1.Pod) {
	old := s.pods[key]
	var ch change
	if old != nil {
		ch.old = old
	}
	if p == nil {
		delete(s.pods, key)
		s.nextRV()
	} else {
		p.ResourceVersion = s.nextRV()
		s.pods[key] = p
		ch.obj = p
	}
	s.log("pods", ch)
}

// commitLease stores l (nil: removes key) as a new version and logs the
// change.
func (s *apiServer) commitLease(key string, l *coordinationv1.Lease) {
	old := s.leases[key]
	var ch change
	if old != nil {
		ch.old = old
	}
	if l == nil {
		delete(s.leases, key)
		s.nextRV()
	} else {
		l.ResourceVersion = s.nextRV()
		s.leases[key] = l
		ch.obj = l
	}
	s.log("leases", ch)
}

// log keeps ch, committed at the current resourceVersion, for resource's
// watches and offers it to them.
func (s *apiServer) log(resource string, ch change) {
	ch.rv = s.rv
	l := s.logs[resource]
	l.changes = append(l.changes, ch)
	if len(l.changes) > historyLimit {
		l.compacted = l.changes[0].rv
		l.changes = l.changes[1:]
	}
	for _, w := range s.watches {
		if w.resource == resource {
			w.offer(ch)
		}
	}
}

func invalid(name string, path *field.Path, msg string) error {
	return apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, name, field.ErrorList{field.Forbidden(path, msg)})
}

func (s *apiServer) createPod(actor string, in *corev1.Pod, dryRun bool) (runtime.Object, error) {
	p := in.DeepCopy()
	key := s.keyFor(actor, p.Namespace, p.Name)
	if p.Name == "" {
		return nil, invalid(p.Name, field.NewPath("metadata", "name"), "name is required")
	}
	// kube-apiserver's ValidatePodCreate.
	if p.Spec.NodeName != "" && len(p.Spec.SchedulingGates) > 0 {
		if !dryRun {
			t, n := s.taskOf(p)
			s.hist.add(Event{Kind: KRefused, Task: t, Attempt: n, Note: "Invalid: spec.nodeName with schedulingGates"})
		}
		return nil, invalid(p.Name, field.NewPath("spec", "nodeName"), "cannot be set until all schedulingGates have been cleared")
	}
	if dryRun {
		return p, nil
	}
	if s.pods[key] != nil {
		return nil, apierrors.NewAlreadyExists(podsGR, p.Name)
	}
	if s.refuseCreates {
		t, n := s.taskOf(p)
		s.hist.add(Event{Kind: KRefused, Task: t, Attempt: n, Note: "Forbidden: exceeded quota"})
		return nil, apierrors.NewForbidden(podsGR, p.Name, errors.New("exceeded quota: simulated, requested: pods=1, used: pods=10, limited: pods=10"))
	}
	s.uids++
	p.UID = types.UID(fmt.Sprintf("u%d", s.uids))
	if sc := s.scopes[actor]; sc != "" {
		s.podScope[p.UID] = sc
	}
	p.CreationTimestamp = metav1.NewTime(s.now())
	p.Generation = 1
	p.Status = corev1.PodStatus{Phase: corev1.PodPending}
	if len(p.Spec.SchedulingGates) > 0 {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonSchedulingGated}}
	}
	s.commit(key, p)
	t, n := s.taskOf(p)
	note := "gated"
	if len(p.Spec.SchedulingGates) == 0 {
		note = "ungated"
	}
	if e := p.Annotations[task.AnnotationEpoch]; e != "" {
		note += fmt.Sprintf(", epoch %s of %s", e, p.Labels[task.LabelExecutor])
	}
	if sc := s.podScope[p.UID]; sc != "" {
		note += ", on cluster " + sc
	}
	s.hist.add(Event{Kind: KCreate, Task: t, Attempt: n, UID: string(p.UID), Note: note})
	if p.Spec.NodeName != "" {
		s.hist.add(Event{Kind: KBind, Task: t, Attempt: n, UID: string(p.UID), Note: "created on node " + p.Spec.NodeName})
	}
	return p.DeepCopy(), nil
}

func (s *apiServer) listPods(ns string, sel labels.Selector) *corev1.PodList {
	out := &corev1.PodList{}
	keys := make([]string, 0, len(s.pods))
	for k := range s.pods {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := s.pods[k]
		if (ns == "" || p.Namespace == ns) && (sel == nil || sel.Matches(labels.Set(p.Labels))) {
			out.Items = append(out.Items, *p.DeepCopy())
		}
	}
	out.ResourceVersion = strconv.FormatInt(s.rv, 10)
	return out
}

// accept turns a client's new version of a stored pod into the next stored
// version: status, identity and the node stay the server's; scheduling gates
// may only be removed.
func (s *apiServer) accept(old, p *corev1.Pod) (*corev1.Pod, error) {
	if p.UID != "" && p.UID != old.UID {
		return nil, apierrors.NewConflict(podsGR, old.Name, errors.New("the UID in the object does not match"))
	}
	if p.ResourceVersion != "" && p.ResourceVersion != old.ResourceVersion {
		return nil, apierrors.NewConflict(podsGR, old.Name, errors.New("the object has been modified"))
	}
	for _, g := range p.Spec.SchedulingGates {
		if !slices.Contains(old.Spec.SchedulingGates, g) {
			return nil, invalid(old.Name, field.NewPath("spec", "schedulingGates"), "only deletion is allowed")
		}
	}
	if old.DeletionTimestamp != nil && len(p.Finalizers) > len(old.Finalizers) {
		return nil, invalid(old.Name, field.NewPath("metadata", "finalizers"), "no new finalizers can be added if the object is being deleted")
	}
	n := p.DeepCopy()
	n.UID, n.Name, n.Namespace = old.UID, old.Name, old.Namespace
	n.CreationTimestamp, n.DeletionTimestamp, n.DeletionGracePeriodSeconds = old.CreationTimestamp, old.DeletionTimestamp, old.DeletionGracePeriodSeconds
	n.Status = *old.Status.DeepCopy()
	n.Spec.NodeName = old.Spec.NodeName
	if old.Spec.ActiveDeadlineSeconds != nil && (n.Spec.ActiveDeadlineSeconds == nil || *n.Spec.ActiveDeadlineSeconds > *old.Spec.ActiveDeadlineSeconds) {
		return nil, invalid(old.Name, field.NewPath("spec", "activeDeadlineSeconds"), "may only be lowered")
	}
	return n, nil
}

// store writes the accepted version n of old and what follows from it.
func (s *apiServer) store(old, n *corev1.Pod) {
	key := s.keyOf(old)
	t, a := s.taskOf(old)
	if len(old.Spec.SchedulingGates) > 0 && len(n.Spec.SchedulingGates) == 0 {
		n.Status.Conditions = nil
		s.hist.add(Event{Kind: KUngate, Task: t, Attempt: a, UID: string(old.UID)})
	}
	if n.DeletionTimestamp != nil && len(n.Finalizers) == 0 && (n.Spec.NodeName == "" || *n.DeletionGracePeriodSeconds == 0) {
		s.commit(key, nil)
		s.hist.add(Event{Kind: KGone, Task: t, Attempt: a, UID: string(old.UID)})
		return
	}
	s.commit(key, n)
}

func (s *apiServer) updatePod(actor string, in *corev1.Pod) (runtime.Object, error) {
	old := s.pods[s.keyFor(actor, in.Namespace, in.Name)]
	if old == nil {
		return nil, apierrors.NewNotFound(podsGR, in.Name)
	}
	n, err := s.accept(old, in)
	if err != nil {
		return nil, err
	}
	s.store(old, n)
	return n.DeepCopy(), nil
}

func (s *apiServer) patchPod(actor string, a k8stesting.PatchAction) (runtime.Object, error) {
	old := s.pods[s.keyFor(actor, a.GetNamespace(), a.GetName())]
	if old == nil {
		return nil, apierrors.NewNotFound(podsGR, a.GetName())
	}
	doc, err := json.Marshal(old)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	var out []byte
	switch a.GetPatchType() {
	case types.JSONPatchType:
		p, err := jsonpatch.DecodePatch(a.GetPatch())
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		out, err = p.Apply(doc)
		if err != nil {
			// kube-apiserver answers a failed test (or a path that is not
			// there) with 422 Invalid.
			return nil, invalid(old.Name, field.NewPath("patch"), err.Error())
		}
	case types.MergePatchType:
		out, err = jsonpatch.MergePatch(doc, a.GetPatch())
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
	case types.StrategicMergePatchType:
		out, err = strategicpatch.StrategicMergePatch(doc, a.GetPatch(), &corev1.Pod{})
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
	default:
		return nil, apierrors.NewBadRequest("unsupported patch type " + string(a.GetPatchType()))
	}
	var p corev1.Pod
	if err := json.Unmarshal(out, &p); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	p.ResourceVersion = "" // a patch carries no precondition unless it says so
	var meta struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if a.GetPatchType() != types.JSONPatchType && json.Unmarshal(a.GetPatch(), &meta) == nil {
		p.ResourceVersion = meta.Metadata.ResourceVersion
	}
	n, err := s.accept(old, &p)
	if err != nil {
		return nil, err
	}
	s.store(old, n)
	return n.DeepCopy(), nil
}

// deletePod deletes a pod as kube-apiserver does: preconditions, the grace
// period (0 for a pod on no node), and the object stays while finalizers do.
func (s *apiServer) deletePod(key string, opts metav1.DeleteOptions, who string) error {
	old := s.pods[key]
	if old == nil {
		return apierrors.NewNotFound(podsGR, key[strings.LastIndex(key, "/")+1:])
	}
	name := old.Name
	if pre := opts.Preconditions; pre != nil {
		if pre.UID != nil && *pre.UID != old.UID {
			return apierrors.NewConflict(podsGR, name, fmt.Errorf("precondition failed: UID in precondition: %s, UID in object meta: %s", *pre.UID, old.UID))
		}
		if pre.ResourceVersion != nil && *pre.ResourceVersion != old.ResourceVersion {
			return apierrors.NewConflict(podsGR, name, errors.New("precondition failed: resourceVersion"))
		}
	}
	grace := int64(30)
	if old.Spec.TerminationGracePeriodSeconds != nil {
		grace = *old.Spec.TerminationGracePeriodSeconds
	}
	if opts.GracePeriodSeconds != nil {
		grace = *opts.GracePeriodSeconds
	}
	if old.Spec.NodeName == "" || stoppedPod(old) {
		grace = 0
	}
	n := old.DeepCopy()
	if old.DeletionTimestamp != nil {
		if grace >= *old.DeletionGracePeriodSeconds {
			return nil
		}
	}
	ts := metav1.NewTime(s.now().Add(time.Duration(grace) * time.Second))
	n.DeletionTimestamp, n.DeletionGracePeriodSeconds = &ts, &grace
	t, a := s.taskOf(old)
	s.hist.add(Event{Kind: KDelete, Task: t, Attempt: a, UID: string(old.UID), Grace: grace, Note: who})
	if grace == 0 && old.Spec.NodeName != "" && !stoppedPod(old) {
		s.hist.add(Event{Kind: KStopped, Task: t, Attempt: a, UID: string(old.UID), Note: "deleted with grace 0"})
		s.stopLog(string(old.UID), 137) // the kubelet kills it
	}
	s.store(old, n)
	return nil
}

// stoppedPod: no container of p runs (podstate.Stopped without the
// deletion rule).
func stoppedPod(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return true
	}
	return false
}

func (s *apiServer) lease(a k8stesting.Action) (runtime.Object, error) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	switch a.GetVerb() {
	case "get":
		a := a.(k8stesting.GetAction)
		l := s.leases[a.GetNamespace()+"/"+a.GetName()]
		if l == nil {
			return nil, apierrors.NewNotFound(gr, a.GetName())
		}
		return l.DeepCopy(), nil
	case "create":
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		key := l.Namespace + "/" + l.Name
		if s.leases[key] != nil {
			return nil, apierrors.NewAlreadyExists(gr, l.Name)
		}
		s.commitLease(key, l)
		return l.DeepCopy(), nil
	case "update":
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		key := l.Namespace + "/" + l.Name
		old := s.leases[key]
		if old == nil {
			return nil, apierrors.NewNotFound(gr, l.Name)
		}
		if l.ResourceVersion != old.ResourceVersion {
			return nil, apierrors.NewConflict(gr, l.Name, errors.New("the object has been modified"))
		}
		s.commitLease(key, l)
		return l.DeepCopy(), nil
	case "delete":
		a := a.(k8stesting.DeleteActionImpl)
		key := a.GetNamespace() + "/" + a.GetName()
		old := s.leases[key]
		if old == nil {
			return nil, apierrors.NewNotFound(gr, a.GetName())
		}
		if pre := a.DeleteOptions.Preconditions; pre != nil && pre.ResourceVersion != nil && *pre.ResourceVersion != old.ResourceVersion {
			return nil, apierrors.NewConflict(gr, a.GetName(), errors.New("precondition failed"))
		}
		s.commitLease(key, nil)
		return nil, nil
	case "list":
		return s.listLeases(a.GetNamespace()), nil
	}
	s.unknown = append(s.unknown, describe(a))
	return nil, apierrors.NewMethodNotSupported(gr, a.GetVerb())
}

// listLeases lists the Leases of ns in key order.
func (s *apiServer) listLeases(ns string) *coordinationv1.LeaseList {
	out := &coordinationv1.LeaseList{}
	keys := make([]string, 0, len(s.leases))
	for k := range s.leases {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if l := s.leases[k]; ns == "" || l.Namespace == ns {
			out.Items = append(out.Items, *l.DeepCopy())
		}
	}
	out.ResourceVersion = strconv.FormatInt(s.rv, 10)
	return out
}

// objWatch is one WATCH of a resource (pods or Leases): the changes after
// its resourceVersion that its selector selects, each delivered as a step of
// its process.
type objWatch struct {
	srv      *apiServer
	actor    string
	resource string
	id       int
	ns       string
	sel      labels.Selector
	ch       chan watch.Event
	queue    []watch.Event // under srv.mu
	ended    bool          // under srv.mu: close once the queue is delivered
	wake     chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc
}

func (s *apiServer) watch(ctx context.Context, actor string, a k8stesting.WatchAction) (watch.Interface, error) {
	resource := a.GetResource().Resource
	s.mu.Lock()
	l := s.logs[resource]
	if l == nil {
		s.unknown = append(s.unknown, "watch "+resource)
		s.mu.Unlock()
		return nil, apierrors.NewMethodNotSupported(a.GetResource().GroupResource(), "watch")
	}
	s.mu.Unlock()
	r := a.GetWatchRestrictions()
	key := actor + " api> watch " + resource
	if r.Labels != nil && !r.Labels.Empty() {
		key += " [" + r.Labels.String() + "]"
	}
	if err := s.steps.wait(ctx, actor, key); err != nil {
		if errors.Is(err, errInjected) {
			return nil, apierrors.NewServiceUnavailable("simulated: watch refused")
		}
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchIDs++
	ctx, cancel := context.WithCancel(context.Background())
	w := &objWatch{srv: s, actor: actor, resource: resource, id: s.watchIDs, ns: a.GetNamespace(), sel: r.Labels, ch: make(chan watch.Event),
		wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
	from, _ := strconv.ParseInt(r.ResourceVersion, 10, 64)
	switch {
	case r.ResourceVersion == "" || r.ResourceVersion == "0":
	case from < l.compacted:
		w.expire()
	default:
		for _, ch := range l.changes {
			if ch.rv > from {
				w.offer(ch)
			}
		}
	}
	if !w.ended {
		s.watches = append(s.watches, w)
	}
	go w.run()
	return w, nil
}

func (w *objWatch) matches(o object) bool {
	return o != nil && (w.ns == "" || o.GetNamespace() == w.ns) && (w.sel == nil || w.sel.Matches(labels.Set(o.GetLabels())))
}

func copyOf(o object) object { return o.DeepCopyObject().(object) }

// offer queues what ch is to this watch (under srv.mu).
func (w *objWatch) offer(ch change) {
	if w.ended {
		return
	}
	was, is := w.matches(ch.old), w.matches(ch.obj)
	var ev watch.Event
	switch {
	case was && is:
		ev = watch.Event{Type: watch.Modified, Object: copyOf(ch.obj)}
	case is:
		ev = watch.Event{Type: watch.Added, Object: copyOf(ch.obj)}
	case was && ch.obj == nil:
		o := copyOf(ch.old)
		o.SetResourceVersion(strconv.FormatInt(ch.rv, 10))
		ev = watch.Event{Type: watch.Deleted, Object: o}
	case was:
		ev = watch.Event{Type: watch.Deleted, Object: copyOf(ch.obj)}
	default:
		return
	}
	w.queue = append(w.queue, ev)
	w.poke()
}

func (w *objWatch) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// expire ends the watch with 410 Expired after what is queued (srv.mu).
func (w *objWatch) expire() {
	if w.ended {
		return
	}
	w.queue = append(w.queue, watch.Event{Type: watch.Error, Object: &apierrors.NewResourceExpired("too old resource version").ErrStatus})
	w.ended = true
	w.poke()
}

// drop cuts the watch's connection at once (srv.mu).
func (w *objWatch) drop() {
	w.queue, w.ended = nil, true
	w.poke()
}

func (w *objWatch) run() {
	defer close(w.ch)
	defer w.remove()
	for {
		w.srv.mu.Lock()
		if len(w.queue) == 0 {
			ended := w.ended
			w.srv.mu.Unlock()
			if ended {
				return
			}
			select {
			case <-w.wake:
				continue
			case <-w.ctx.Done():
				return
			}
		}
		ev := w.queue[0]
		w.srv.mu.Unlock()
		what := string(ev.Type)
		switch o := ev.Object.(type) {
		case *corev1.Pod:
			t, n := w.srv.taskOf(o)
			what += fmt.Sprintf(" %s/%d rv=%s", t, n, o.ResourceVersion)
		case *coordinationv1.Lease:
			what += fmt.Sprintf(" lease %s rv=%s", o.Name, o.ResourceVersion)
		}
		if err := w.srv.steps.wait(w.ctx, w.actor, fmt.Sprintf("%s watch< %s", w.actor, what)); err != nil {
			return
		}
		w.srv.mu.Lock()
		if len(w.queue) > 0 {
			w.queue = w.queue[1:]
		}
		w.srv.mu.Unlock()
		select {
		case w.ch <- ev:
		case <-w.ctx.Done():
			return
		}
	}
}

func (w *objWatch) remove() {
	w.srv.mu.Lock()
	defer w.srv.mu.Unlock()
	w.srv.watches = slices.DeleteFunc(w.srv.watches, func(x *objWatch) bool { return x == w })
}

func (w *objWatch) Stop()                          { w.cancel() }
func (w *objWatch) ResultChan() <-chan watch.Event { return w.ch }
