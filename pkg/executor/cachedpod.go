package executor

import (
	"strings"
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/pkg/task"
)

// A tracked pod costs the executor what its pod cache holds of it. A
// realistic running task pod as the API server returns it is 25 KB on the
// heap (env, volumes, managedFields ...), and even an empty corev1.Pod
// struct is 1.2 KB (a fresh one with only the fields read, 3.9 KB), so the
// caches hold a cachedPod instead: the few fields the executor reads, with
// repeated strings interned: 0.66 KB for that pod, 0.8 KB with the cache's
// key and run index (BenchmarkPodCacheMemory). Readers get a *corev1.Pod
// built from it (pod), so every decision is taken on the same view, whether
// the pod came from the cache, a creation or a fresh read.

// metaKey is a label or annotation a cachedPod keeps.
type metaKey struct {
	key        string
	annotation bool
}

// sharedKeys and ownKeys are the labels and annotations a cachedPod keeps:
// kubetask's own (task.PodLabels, task.BuildPod, LabelReleased), the only
// ones the executor reads (task.IdentityFromPod, releases). The values of
// sharedKeys are the same for many pods and interned; those of ownKeys (the
// run ID, the task's name) differ from pod to pod.
var (
	sharedKeys = [...]metaKey{
		{task.LabelManagedBy, false}, {task.LabelAttempt, false}, {task.LabelExecutor, false}, {task.LabelReleased, false},
		{task.AnnotationTaskNamespace, true}, {task.AnnotationAttempt, true}, {task.AnnotationExecutor, true},
		{task.AnnotationMainContainer, true}, {task.AnnotationResultPath, true}, {task.AnnotationEpoch, true},
	}
	ownKeys = [...]metaKey{{task.LabelRun, false}, {task.LabelTask, false}, {task.AnnotationRun, true}, {task.AnnotationTaskName, true},
		{task.AnnotationNonce, true}}
)

// ownRun and ownRunAnnotation are the indices of task.LabelRun and
// task.AnnotationRun in ownKeys.
const (
	ownRun           = 0
	ownRunAnnotation = 2
)

// sharedMeta.present and cachedPod.present have a bit per key: these fail
// to compile with more keys.
var (
	_ [16 - len(sharedKeys)]struct{}
	_ [16 - len(ownKeys)]struct{}
)

// cachedPod is what the executor keeps of a pod. pod() returns it as a
// *corev1.Pod with exactly these fields (everything else zero):
//
//   - metadata: namespace, name, uid, resourceVersion, creationTimestamp,
//     deletionTimestamp, deletionGracePeriodSeconds, finalizers (all, in
//     order: a release patch names the finalizer's index), and the labels and
//     annotations among sharedKeys and ownKeys (not the template's own nor
//     anyone else's; so a pod with labels but none of kubetask's has none
//     here, and must not be released from this view: the executor handles
//     only pods with task.LabelManagedBy); ownerReferences and
//     managedFields are dropped;
//   - spec: nodeName, restartPolicy, activeDeadlineSeconds, the names of the
//     schedulingGates, and of each container and init container its name,
//     image, restartPolicy and restartPolicyRules;
//   - status: phase, reason, message, startTime, the PodScheduled and
//     DisruptionTarget conditions (type, status, reason, message,
//     lastTransitionTime), and of each container and init container status
//     its name, restartCount, state and lastState (waiting: reason, message;
//     running: startedAt; terminated: exitCode, reason, message, startedAt,
//     finishedAt).
//
// These are all that podstate (Derive, Stopped, StopDeadlineSeconds),
// task.IdentityFromPod, podlog.ProgressOf, pkg/attempt (ReadResult,
// ResultRetryable, Stop, ReleaseSeen) and the executor itself read of a
// pod; TestCachedPodKeepsWhatIsRead and FuzzCachedPod check that each gives
// the same answer on pod() as on the whole pod. A cachedPod is never
// modified once built.
type cachedPod struct {
	// nsName is the pod's cache key, namespace/name (name alone when the
	// namespace is empty), whose tail is the pod's name: one string for both
	// (the decoder's copy of the name is not kept).
	nsName, resourceVersion string
	uid                     types.UID // the fence matches a pod to its record by UID
	namespace               interned
	shared                  unique.Handle[sharedMeta] // zero: none of sharedKeys is set
	own                     [len(ownKeys)]string
	present                 uint16   // bit j: ownKeys[j] is set
	finalizers              interned // each after a finalizerSep, in order
	created                 metav1.Time
	nodeName                interned
	phase                   interned
	startTime               *metav1.Time
	containers              []cachedContainer // regular ones, then init containers
	statuses                []cachedStatus    // of regular containers, then of init containers
	conditions              []cachedCondition
	rare                    *rarePodFields // nil when none of them is set
}

// rarePodFields are the fields of a cachedPod that most pods do not set.
type rarePodFields struct {
	deletionTimestamp          *metav1.Time
	deletionGracePeriodSeconds *int64
	activeDeadlineSeconds      *int64
	schedulingGates            []interned
	reason                     interned
	message                    string
}

// sharedMeta are the values of sharedKeys on a pod, the same for many pods
// (all those of one attempt number, executor, epoch and main container): a
// cachedPod keeps one Handle to them, 8 bytes for the ten values.
type sharedMeta struct {
	vals          [len(sharedKeys)]string
	present       uint16 // bit i: sharedKeys[i] is set
	restartPolicy corev1.RestartPolicy
}

// finalizerSep joins a cachedPod's finalizers: a finalizer is a qualified
// name, which has no NUL.
const finalizerSep = "\x00"

type cachedContainer struct {
	name, image interned
	restart     *containerRestart // nil: neither is set
	init        bool
}

// containerRestart is a container's own restart policy and rules, which
// most containers do not set.
type containerRestart struct {
	policy *corev1.ContainerRestartPolicy
	rules  []corev1.ContainerRestartRule
}

type cachedStatus struct {
	name         interned
	restartCount int32
	init         bool
	state        corev1.ContainerState  // trimmed: see compactState
	last         *corev1.ContainerState // trimmed; nil when empty (no restart yet)
}

// cachedCondition is a pod condition: its type, status, reason and
// message are the same for many pods (PodScheduled True, with neither) and
// kept once, its time is its own.
type cachedCondition struct {
	meta               unique.Handle[conditionMeta]
	lastTransitionTime metav1.Time
}

type conditionMeta struct {
	typ     corev1.PodConditionType
	status  corev1.ConditionStatus
	reason  string
	message string
}

// compactPod returns what the executor keeps of pod. It copies what it keeps
// into new memory (strings aside: a decoder allocates each string on its
// own, and repeated ones are interned), so nothing else of pod stays
// reachable from it.
func compactPod(pod *corev1.Pod) *cachedPod {
	nsName := pod.Name
	if pod.Namespace != "" {
		nsName = pod.Namespace + "/" + pod.Name
	}
	c := &cachedPod{
		nsName:          nsName,
		uid:             pod.UID,
		resourceVersion: pod.ResourceVersion,
		namespace:       intern(pod.Namespace),
		created:         pod.CreationTimestamp,
		nodeName:        intern(pod.Spec.NodeName),
		phase:           intern(string(pod.Status.Phase)),
		startTime:       copyPtr(pod.Status.StartTime),
	}
	meta := sharedMeta{restartPolicy: pod.Spec.RestartPolicy}
	for i, k := range sharedKeys {
		if v, ok := k.of(pod); ok {
			meta.vals[i], meta.present = v, meta.present|1<<i
		}
	}
	if meta != (sharedMeta{}) {
		c.shared = unique.Make(meta)
	}
	for j, k := range ownKeys {
		if v, ok := k.of(pod); ok {
			for _, have := range c.own[:j] {
				if have == v {
					v = have // the run ID is a label and an annotation: one copy
				}
			}
			c.own[j], c.present = v, c.present|1<<j
		}
	}
	if len(pod.Finalizers) > 0 {
		c.finalizers = intern(finalizerSep + strings.Join(pod.Finalizers, finalizerSep))
	}
	if n := len(pod.Spec.Containers) + len(pod.Spec.InitContainers); n > 0 {
		c.containers = make([]cachedContainer, 0, n)
		c.containers = appendContainers(c.containers, pod.Spec.Containers, false)
		c.containers = appendContainers(c.containers, pod.Spec.InitContainers, true)
	}
	if n := len(pod.Status.ContainerStatuses) + len(pod.Status.InitContainerStatuses); n > 0 {
		c.statuses = make([]cachedStatus, 0, n)
		c.statuses = appendStatuses(c.statuses, pod.Status.ContainerStatuses, false)
		c.statuses = appendStatuses(c.statuses, pod.Status.InitContainerStatuses, true)
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodScheduled || cond.Type == corev1.DisruptionTarget {
			c.conditions = append(c.conditions, cachedCondition{
				meta:               unique.Make(conditionMeta{typ: cond.Type, status: cond.Status, reason: cond.Reason, message: cond.Message}),
				lastTransitionTime: cond.LastTransitionTime,
			})
		}
	}
	r := rarePodFields{
		deletionTimestamp:          copyPtr(pod.DeletionTimestamp),
		deletionGracePeriodSeconds: copyPtr(pod.DeletionGracePeriodSeconds),
		activeDeadlineSeconds:      copyPtr(pod.Spec.ActiveDeadlineSeconds),
		reason:                     intern(pod.Status.Reason),
		message:                    pod.Status.Message,
	}
	for _, g := range pod.Spec.SchedulingGates {
		r.schedulingGates = append(r.schedulingGates, intern(g.Name))
	}
	if r.deletionTimestamp != nil || r.deletionGracePeriodSeconds != nil || r.activeDeadlineSeconds != nil ||
		r.schedulingGates != nil || r.reason != (interned{}) || r.message != "" {
		c.rare = &r
	}
	return c
}

// of returns the value of k on pod and whether pod has it.
func (k metaKey) of(pod *corev1.Pod) (string, bool) {
	if k.annotation {
		v, ok := pod.Annotations[k.key]
		return v, ok
	}
	v, ok := pod.Labels[k.key]
	return v, ok
}

func appendContainers(out []cachedContainer, cs []corev1.Container, init bool) []cachedContainer {
	for i := range cs {
		c := &cs[i]
		cc := cachedContainer{name: intern(c.Name), image: intern(c.Image), init: init}
		if c.RestartPolicy != nil || c.RestartPolicyRules != nil {
			cc.restart = &containerRestart{}
		}
		if c.RestartPolicy != nil {
			p := corev1.ContainerRestartPolicy(share(string(*c.RestartPolicy)))
			cc.restart.policy = &p
		}
		if c.RestartPolicyRules != nil {
			cc.restart.rules = make([]corev1.ContainerRestartRule, len(c.RestartPolicyRules))
			for j, r := range c.RestartPolicyRules {
				cc.restart.rules[j] = corev1.ContainerRestartRule{Action: r.Action}
				if e := r.ExitCodes; e != nil {
					cc.restart.rules[j].ExitCodes = &corev1.ContainerRestartRuleOnExitCodes{Operator: e.Operator, Values: append([]int32(nil), e.Values...)}
				}
			}
		}
		out = append(out, cc)
	}
	return out
}

func appendStatuses(out []cachedStatus, ss []corev1.ContainerStatus, init bool) []cachedStatus {
	for i := range ss {
		s := &ss[i]
		cs := cachedStatus{name: intern(s.Name), restartCount: s.RestartCount, init: init, state: compactState(s.State)}
		if last := compactState(s.LastTerminationState); last != (corev1.ContainerState{}) {
			cs.last = &last
		}
		out = append(out, cs)
	}
	return out
}

// compactState keeps of s what is read: a waiting state's reason and
// message, a running state's start, a terminated state's exit code, reason,
// message, start and end (not its container ID nor signal).
func compactState(s corev1.ContainerState) corev1.ContainerState {
	var out corev1.ContainerState
	if w := s.Waiting; w != nil {
		out.Waiting = &corev1.ContainerStateWaiting{Reason: share(w.Reason), Message: w.Message}
	}
	if r := s.Running; r != nil {
		out.Running = &corev1.ContainerStateRunning{StartedAt: r.StartedAt}
	}
	if t := s.Terminated; t != nil {
		out.Terminated = &corev1.ContainerStateTerminated{ExitCode: t.ExitCode, Reason: share(t.Reason),
			Message: t.Message, StartedAt: t.StartedAt, FinishedAt: t.FinishedAt}
	}
	return out
}

// pod returns c as a pod with the fields cachedPod lists. The pod is new
// but shares memory with c (container states, finalizers' strings, restart
// rules, times): never modify it.
func (c *cachedPod) pod() *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: c.namespace.String(), Name: c.name(), UID: c.uid, ResourceVersion: c.resourceVersion,
			CreationTimestamp: c.created,
		},
		Spec:   corev1.PodSpec{NodeName: c.nodeName.String()},
		Status: corev1.PodStatus{Phase: corev1.PodPhase(c.phase.String()), StartTime: c.startTime},
	}
	set := func(k metaKey, v string) {
		m := &p.Labels
		if k.annotation {
			m = &p.Annotations
		}
		if *m == nil {
			*m = map[string]string{}
		}
		(*m)[k.key] = v
	}
	if c.shared != (unique.Handle[sharedMeta]{}) {
		meta := c.shared.Value()
		p.Spec.RestartPolicy = meta.restartPolicy
		for i, k := range sharedKeys {
			if meta.present&(1<<i) != 0 {
				set(k, meta.vals[i])
			}
		}
	}
	for j, k := range ownKeys {
		if c.present&(1<<j) != 0 {
			set(k, c.own[j])
		}
	}
	if c.finalizers != (interned{}) {
		p.Finalizers = strings.Split(c.finalizers.String()[len(finalizerSep):], finalizerSep)
	}
	for _, cc := range c.containers {
		ctr := corev1.Container{Name: cc.name.String(), Image: cc.image.String()}
		if r := cc.restart; r != nil {
			ctr.RestartPolicy, ctr.RestartPolicyRules = r.policy, r.rules
		}
		if cc.init {
			p.Spec.InitContainers = append(p.Spec.InitContainers, ctr)
		} else {
			p.Spec.Containers = append(p.Spec.Containers, ctr)
		}
	}
	for _, cs := range c.statuses {
		st := corev1.ContainerStatus{Name: cs.name.String(), RestartCount: cs.restartCount, State: cs.state}
		if cs.last != nil {
			st.LastTerminationState = *cs.last
		}
		if cs.init {
			p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, st)
		} else {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, st)
		}
	}
	for _, cc := range c.conditions {
		m := cc.meta.Value()
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: m.typ, Status: m.status, Reason: m.reason, Message: m.message, LastTransitionTime: cc.lastTransitionTime})
	}
	if r := c.rare; r != nil {
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = r.deletionTimestamp, r.deletionGracePeriodSeconds
		p.Spec.ActiveDeadlineSeconds = r.activeDeadlineSeconds
		for _, g := range r.schedulingGates {
			p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: g.String()})
		}
		p.Status.Reason, p.Status.Message = r.reason.String(), r.message
	}
	return p
}

// key is the pod's cache key, namespace/name.
func (c *cachedPod) key() string { return c.nsName }

// name is the pod's name.
func (c *cachedPod) name() string {
	if ns := c.namespace.String(); ns != "" {
		return c.nsName[len(ns)+1:]
	}
	return c.nsName
}

// run is the pod's task ID: its task.AnnotationRun, which holds the exact
// ID, when not empty, else its task.LabelRun label (the same for an ID that
// is a label value, a derived one for another); "" when it has neither.
func (c *cachedPod) run() string {
	if id := c.own[ownRunAnnotation]; id != "" {
		return id
	}
	return c.own[ownRun]
}

// interned is a string that equal ones share (the namespace, node,
// container names, images, reasons and the like are the same for many
// pods), in 8 bytes. Its zero value is "". The Handle keeps the shared
// copy alive; a string taken from it (String) alone would not keep it in
// the unique map, and later equal strings would get a copy of their own.
type interned struct{ h unique.Handle[string] }

func intern(s string) interned {
	if s == "" {
		return interned{}
	}
	return interned{unique.Make(s)}
}

func (s interned) String() string {
	if s == (interned{}) {
		return ""
	}
	return s.h.Value()
}

// share returns s, or an equal string that the pods compacted since about
// the last garbage collection share: for strings kept in corev1 structs,
// which cannot hold an interned. Without a Handle the unique map lets go of
// its copy at a collection (the pods keep theirs), so equal strings share
// one copy per collection cycle rather than one in all.
func share(s string) string { return intern(s).String() }

func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}
