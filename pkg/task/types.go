package task

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/pkg/podstate"
)

// APIVersion and Kind identify a task document.
const (
	APIVersion = "kubetask.dev/v1alpha1"
	Kind       = "Task"
)

// Task is one unit of work run as a Kubernetes pod. Load returns tasks with defaults
// applied and validated; code that builds a Task itself calls Default and Validate.
type Task struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec `json:"spec"`
}

// Spec describes how to run a task.
type Spec struct {
	// MainContainer names the regular container whose exit decides the task. Default:
	// the only regular container, else the one named "base" or "main".
	MainContainer string `json:"mainContainer,omitempty"`
	// Cleanup says what happens to the pod once the outcome is recorded. Default Delete.
	Cleanup Cleanup `json:"cleanup,omitempty"`
	// Timeouts bound each stage of an attempt.
	Timeouts Timeouts `json:"timeouts,omitempty"`
	// Retries say when a failed attempt is followed by another.
	Retries Retries `json:"retries,omitempty"`
	// Result, when set, is where the task leaves its result.
	Result *Result `json:"result,omitempty"`
	// Logs says which containers' logs kubetask collects.
	Logs Logs `json:"logs,omitempty"`
	// Priority orders the task among the waiting tasks of its namespace: a
	// higher priority takes its namespace's next slot first, equal ones
	// start in submission order. Default 0; negative values wait behind it.
	// It never stops a running task, nor gives the namespace more than its
	// share of the executor's slots.
	Priority int32 `json:"priority,omitempty"`
	// Placement, for a service that runs tasks on several clusters, is
	// where the task may run: one cluster by name, or the clusters whose
	// labels a selector matches. Default: any cluster. A service refuses at
	// submission a placement that none of its clusters could ever meet.
	Placement *Placement `json:"placement,omitempty"`
	// Template is the pod to run. kubetask never modifies it: BuildPod works on a copy.
	Template corev1.PodTemplateSpec `json:"template"`
}

// Placement says which clusters a task may run on (docs/multicluster.md,
// "Placement"). Cluster and ClusterSelector are exclusive.
type Placement struct {
	// Cluster names the one cluster the task runs on.
	Cluster string `json:"cluster,omitempty"`
	// ClusterSelector selects the clusters the task may run on by their
	// labels (region, gpu, ...).
	ClusterSelector *metav1.LabelSelector `json:"clusterSelector,omitempty"`
	// LostAfter, when set (at least MinLostAfter), gives up on an attempt
	// whose cluster has been Unreachable that long: the attempt ends
	// Failed/ClusterLost and the next one runs on another cluster the
	// placement allows, as if an operator had declared the cluster lost for
	// this task alone. At least once for that attempt: its pod may still
	// run where nobody sees it (stopped, and what it did recorded as
	// discarded, if the cluster answers again). Unset (the default): the
	// attempt waits for its cluster however long it is quiet.
	LostAfter Duration `json:"lostAfter,omitempty"`
}

// MinLostAfter is the shortest spec.placement.lostAfter: a cluster that is
// quiet for less is too often only a slow one.
const MinLostAfter = time.Minute

// Cleanup is what kubetask does with a pod after recording its outcome.
type Cleanup string

const (
	// CleanupDelete deletes every pod.
	CleanupDelete Cleanup = "Delete"
	// CleanupDeleteSucceeded deletes pods of succeeded attempts and keeps failed ones
	// for debugging.
	CleanupDeleteSucceeded Cleanup = "DeleteSucceeded"
	// CleanupKeep keeps every pod. Sidecars are still stopped so that no kept pod runs
	// forever.
	CleanupKeep Cleanup = "Keep"
)

// Duration is a length of time written as a Go duration ("90s", "5m", "1h30m"). It is
// kept as written so that validation can name the field of a malformed value; empty
// means "not set" (the default applies).
type Duration string

// Get returns the duration, 0 for an empty or malformed value (Validate rejects those).
func (d Duration) Get() time.Duration {
	v, err := time.ParseDuration(string(d))
	if err != nil {
		return 0
	}
	return v
}

// Timeouts bound the stages of an attempt. A zero duration ("0s") disables a timeout;
// for imagePull and containerConfig it means no grace at all (fail at once).
type Timeouts struct {
	// Schedule bounds the time from pod creation until it is bound to a node. Default 10m.
	Schedule Duration `json:"schedule,omitempty"`
	// Startup bounds the time from scheduling until the main container starts (init
	// containers and image pulls included). Default 10m.
	Startup Duration `json:"startup,omitempty"`
	// Run bounds the time from the main container's first start until it exits.
	// Default 0s (no limit).
	Run Duration `json:"run,omitempty"`
	// ImagePull is how long image pull errors may last before the attempt fails.
	// Default 3m.
	ImagePull Duration `json:"imagePull,omitempty"`
	// ContainerConfig is how long container creation errors (a missing Secret or
	// ConfigMap) may last before the attempt fails. Default 1m.
	ContainerConfig Duration `json:"containerConfig,omitempty"`
}

// RetryOnInfrastructure stands for every failure reason that podstate marks retryable.
const RetryOnInfrastructure = "Infrastructure"

// Retries say when a failed attempt is followed by another.
type Retries struct {
	// Limit is the number of retries after the first attempt. Default 2.
	Limit *int32 `json:"limit,omitempty"`
	// Backoff is the delay before the first retry; it doubles for each further retry, up
	// to MaxBackoff. Default 10s.
	Backoff Duration `json:"backoff,omitempty"`
	// RetryOn lists what is retried: "Infrastructure" (every retryable reason of
	// docs/states.md) and/or individual Failed reasons such as "ExitCode" (not
	// Cancelled: a cancelled task is never retried).
	// Default [Infrastructure].
	RetryOn []string `json:"retryOn,omitempty"`
}

// MaxBackoff caps the delay between two attempts.
const MaxBackoff = 10 * time.Minute

// ResultSource says where a task leaves its result.
type ResultSource string

const (
	// ResultFromFile means the main container writes a file at Result.Path; kubetask reads it
	// through the result-holder container.
	ResultFromFile ResultSource = "File"
	// ResultFromTerminationMessage means the main container writes its termination message
	// (at most 4096 bytes).
	ResultFromTerminationMessage ResultSource = "TerminationMessage"
)

// Result says where the task leaves its result and how large it may be.
type Result struct {
	// From is File or TerminationMessage. Required.
	From ResultSource `json:"from"`
	// Path is an absolute file path in the main container. For File it is required and
	// its directory must be a directory of its own (kubetask mounts a volume there unless
	// a volume of the main container already covers it); for TerminationMessage it
	// defaults to the container's terminationMessagePath (/dev/termination-log).
	Path string `json:"path,omitempty"`
	// MaxBytes limits the result's size ("1Mi", "4096"). Default 1Mi for File, 4096
	// (the kubelet's limit) for TerminationMessage.
	MaxBytes string `json:"maxBytes,omitempty"`
	// Image is the result holder's image for File results; it needs sh, sleep and cat.
	// Default DefaultResultImage.
	Image string `json:"image,omitempty"`
}

// DefaultResultImage runs the result-holder container.
const DefaultResultImage = "busybox:1.37"

// MaxTerminationMessageBytes is the kubelet's limit on one container's termination
// message.
const MaxTerminationMessageBytes = 4096

// Bytes returns MaxBytes as a number, 0 when unset or malformed (Validate rejects those).
func (r *Result) Bytes() int64 {
	q, err := resource.ParseQuantity(r.MaxBytes)
	if err != nil {
		return 0
	}
	return q.Value()
}

// Logs says which containers' logs kubetask collects.
type Logs struct {
	// Containers lists container names (regular or init). Default: the main container.
	Containers []string `json:"containers,omitempty"`
}

// Policy returns the settings podstate.Derive needs for this task. t must be defaulted.
func (t *Task) Policy() podstate.Policy {
	return podstate.Policy{
		MainContainer:    t.Spec.MainContainer,
		ScheduleTimeout:  t.Spec.Timeouts.Schedule.Get(),
		StartupTimeout:   t.Spec.Timeouts.Startup.Get(),
		RunTimeout:       t.Spec.Timeouts.Run.Get(),
		ImagePullGrace:   t.Spec.Timeouts.ImagePull.Get(),
		ConfigErrorGrace: t.Spec.Timeouts.ContainerConfig.Get(),
	}
}

// ShouldRetry reports whether a task whose attempt (0 for the first) ended in state s
// gets another attempt: a Failed state whose reason RetryOn lists (or that is retryable,
// with Infrastructure), never Cancelled, while attempts remain. t must be defaulted.
func (t *Task) ShouldRetry(s podstate.State, attempt int) bool {
	if s.Phase != podstate.Failed || s.Reason == podstate.ReasonCancelled || t.Spec.Retries.Limit == nil || attempt >= int(*t.Spec.Retries.Limit) {
		return false
	}
	for _, on := range t.Spec.Retries.RetryOn {
		if on == string(s.Reason) || (on == RetryOnInfrastructure && s.Retryable) {
			return true
		}
	}
	return false
}

// RetryDelay is the delay before the attempt that follows attempt (0 for the first):
// Backoff doubled per earlier retry, capped at MaxBackoff.
func (t *Task) RetryDelay(attempt int) time.Duration {
	d := t.Spec.Retries.Backoff.Get()
	for i := 0; i < attempt && d < MaxBackoff; i++ {
		d *= 2
	}
	return min(d, MaxBackoff)
}

// DeepCopy returns a copy of t that shares no memory with it.
func (t *Task) DeepCopy() *Task {
	if t == nil {
		return nil
	}
	out := &Task{TypeMeta: t.TypeMeta, Spec: t.Spec}
	out.ObjectMeta = *t.ObjectMeta.DeepCopy()
	s := &out.Spec
	t.Spec.Template.DeepCopyInto(&s.Template)
	s.Retries.RetryOn = append([]string(nil), t.Spec.Retries.RetryOn...)
	if l := t.Spec.Retries.Limit; l != nil {
		v := *l
		s.Retries.Limit = &v
	}
	if r := t.Spec.Result; r != nil {
		c := *r
		s.Result = &c
	}
	s.Logs.Containers = append([]string(nil), t.Spec.Logs.Containers...)
	if p := t.Spec.Placement; p != nil {
		s.Placement = &Placement{Cluster: p.Cluster, ClusterSelector: p.ClusterSelector.DeepCopy(), LostAfter: p.LostAfter}
	}
	return out
}
