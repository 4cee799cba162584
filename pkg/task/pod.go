package task

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Keys of the labels, annotations and finalizer kubetask puts on its pods. They are
// defined here and nowhere else.
const (
	// Prefix starts every kubetask key; template labels and annotations may not use it.
	Prefix = "kubetask.dev/"

	// LabelManagedBy (value ManagedByValue) marks every pod kubetask creates.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is LabelManagedBy's value.
	ManagedByValue = "kubetask"
	// LabelTask holds the task's name (or, when longer than a label value may be, a
	// prefix of it and a hash).
	LabelTask = Prefix + "task"
	// LabelRun holds the run's ID, or a value derived from it when it is not a
	// valid label value (RunLabelValue); AnnotationRun holds the exact ID.
	LabelRun = Prefix + "run"
	// LabelAttempt holds the attempt number, "0" for the first.
	LabelAttempt = Prefix + "attempt"
	// LabelExecutor holds the owning executor instance.
	LabelExecutor = Prefix + "executor"
	// LabelReleased (value "true") marks a kept pod whose outcome is recorded and
	// whose finalizer is removed: executors' informers select pods without it,
	// so kept pods leave their caches and relists.
	LabelReleased = Prefix + "released"

	// AnnotationTaskNamespace, AnnotationTaskName, AnnotationRun, AnnotationAttempt and
	// AnnotationExecutor carry the full Identity (labels may be truncated).
	AnnotationTaskNamespace = Prefix + "task-namespace"
	AnnotationTaskName      = Prefix + "task-name"
	AnnotationRun           = Prefix + "run"
	AnnotationAttempt       = Prefix + "attempt"
	AnnotationExecutor      = Prefix + "executor"
	// AnnotationMainContainer names the main container. On a pod manifest given to Load
	// it sets spec.mainContainer.
	AnnotationMainContainer = Prefix + "main-container"
	// AnnotationResultPath holds the result file's path for File results.
	AnnotationResultPath = Prefix + "result-path"
	// AnnotationNonce carries Identity.Nonce (when set): the nonce of the task
	// record the pod belongs to.
	AnnotationNonce = Prefix + "nonce"
	// AnnotationEpoch carries the fencing epoch of the executor term that
	// created the pod (decimal); see FenceGate.
	AnnotationEpoch = Prefix + "epoch"
	// FenceGate is the scheduling gate an executor creates its pods with and
	// removes only once its store has recorded the pod as its attempt's: a
	// pod created by a stale term (an executor process paused past its Lease)
	// is never scheduled, so its containers never run.
	FenceGate = Prefix + "fence"

	// Finalizer keeps a pod object until kubetask has recorded its outcome, so that a pod
	// deleted by someone else (or garbage-collected) cannot take its exit code with it.
	// kubetask removes it after recording the outcome, also for pods whose task is gone.
	Finalizer = Prefix + "outcome"

	// ResultContainer is the regular container that holds File results: it mounts the
	// result volume and waits, so that the runner can exec ReadResultCommand in it after
	// the main container exited and then stop it. It exits 0 on SIGTERM.
	ResultContainer = "kubetask-result"
	// ResultVolume is the emptyDir shared by the main and the result container when no
	// volume of the main container already covers the result path.
	ResultVolume = "kubetask-result"
)

// resultHolderScript waits until stopped; the trap makes SIGTERM end it at once with 0.
const resultHolderScript = `trap 'exit 0' TERM INT; while :; do sleep 1; done`

// MaxPodNameLength bounds generated pod names: a pod's hostname is its name, and
// hostnames are DNS-1123 labels.
const MaxPodNameLength = validation.DNS1123LabelMaxLength

// Identity names one run of a task. The executor assigns it when it accepts a task;
// together with the attempt number it determines the pod's name, so that creating the
// same attempt twice fails with AlreadyExists instead of running it twice.
type Identity struct {
	// Namespace is where the pod is created. Required.
	Namespace string
	// Name is the task's name. Required.
	Name string
	// RunID distinguishes runs of tasks with the same name: the task ID, any
	// text ValidateID accepts. Required.
	RunID string
	// Executor names the executor instance that owns the pod; a valid label value.
	// Required.
	Executor string
	// Nonce, when set, is the nonce of the task record (store.Record.Nonce):
	// it is part of the pod's name and annotations, so that the pods of an
	// earlier record with the same RunID are never taken for this one's.
	// Optional: a record written before it existed has none.
	Nonce string
}

func (id Identity) validate() error {
	var errs []error
	for _, f := range []struct{ name, v string }{{"Namespace", id.Namespace}, {"Name", id.Name}, {"RunID", id.RunID}, {"Executor", id.Executor}} {
		if f.v == "" {
			errs = append(errs, fmt.Errorf("%s is empty", f.name))
		}
	}
	for _, msg := range validation.IsDNS1123Label(id.Namespace) {
		errs = append(errs, fmt.Errorf("namespace %q: %s", id.Namespace, msg))
	}
	if id.RunID != "" {
		if err := ValidateID(id.RunID); err != nil {
			errs = append(errs, fmt.Errorf("run ID %q: %w", id.RunID, err))
		}
	}
	for _, msg := range validation.IsValidLabelValue(id.Executor) {
		errs = append(errs, fmt.Errorf("executor %q: %s", id.Executor, msg))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid identity: %w", err)
	}
	return nil
}

// PodName returns the name of the pod of attempt (0 for the first) of run id: the task
// name made DNS-1123 safe and shortened, a hash of the namespace, name, run ID and nonce (when set), and
// the attempt, at most MaxPodNameLength characters: "etl-daily-k3j5x7q2ab-0". Equal
// inputs give equal names; different runs differ in the hash.
func PodName(id Identity, attempt int) string {
	key := id.Namespace + "\x00" + id.Name + "\x00" + id.RunID
	if id.Nonce != "" {
		key += "\x00" + id.Nonce
	}
	sum := sha256.Sum256([]byte(key))
	hash := strings.ToLower(base32.StdEncoding.EncodeToString(sum[:]))[:10]
	suffix := "-" + hash + "-" + strconv.Itoa(attempt)
	return dnsPrefix(id.Name, MaxPodNameLength-len(suffix), "task") + suffix
}

// dnsPrefix turns s into a DNS-1123 label of at most limit characters (fallback when
// nothing usable is left).
func dnsPrefix(s string, limit int, fallback string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	out := b.String()
	if len(out) > limit {
		out = out[:limit]
	}
	out = strings.Trim(out, "-")
	if out == "" {
		out = fallback
	}
	return out
}

// labelValue returns v if it is a valid label value, else a valid prefix of it and a hash.
func labelValue(v string) string {
	if len(validation.IsValidLabelValue(v)) == 0 {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	hash := strings.ToLower(base32.StdEncoding.EncodeToString(sum[:]))[:10]
	return dnsPrefix(v, validation.LabelValueMaxLength-len(hash)-1, "x") + "-" + hash
}

// PodLabels returns the labels kubetask puts on the pod of attempt of run id.
func PodLabels(id Identity, attempt int) map[string]string {
	return map[string]string{
		LabelManagedBy: ManagedByValue,
		LabelTask:      labelValue(id.Name),
		LabelRun:       labelValue(id.RunID),
		LabelAttempt:   strconv.Itoa(attempt),
		LabelExecutor:  id.Executor,
	}
}

// ManagedSelector selects every pod kubetask created.
func ManagedSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByValue})
}

// ExecutorSelector selects the pods owned by one executor instance.
func ExecutorSelector(executor string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByValue, LabelExecutor: executor})
}

// RunSelector selects the pods of every attempt of one run.
func RunSelector(id Identity) labels.Selector {
	return labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByValue, LabelTask: labelValue(id.Name), LabelRun: labelValue(id.RunID)})
}

// IdentityFromPod reads the identity and attempt kubetask recorded on pod. It fails for
// pods kubetask did not create and for pods whose labels and annotations disagree, so
// that an unrelated pod is never mistaken for a task's.
func IdentityFromPod(pod *corev1.Pod) (Identity, int, error) {
	a := pod.Annotations
	if pod.Labels[LabelManagedBy] != ManagedByValue {
		return Identity{}, 0, fmt.Errorf("pod %s/%s: not managed by kubetask", pod.Namespace, pod.Name)
	}
	id := Identity{Namespace: a[AnnotationTaskNamespace], Name: a[AnnotationTaskName], RunID: a[AnnotationRun], Executor: a[AnnotationExecutor], Nonce: a[AnnotationNonce]}
	attempt, err := strconv.Atoi(a[AnnotationAttempt])
	if err != nil || attempt < 0 {
		return Identity{}, 0, fmt.Errorf("pod %s/%s: bad %s annotation %q", pod.Namespace, pod.Name, AnnotationAttempt, a[AnnotationAttempt])
	}
	if err := id.validate(); err != nil {
		return Identity{}, 0, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if id.Namespace != pod.Namespace || PodName(id, attempt) != pod.Name {
		return Identity{}, 0, fmt.Errorf("pod %s/%s: name does not match its recorded identity (want %s/%s)",
			pod.Namespace, pod.Name, id.Namespace, PodName(id, attempt))
	}
	for k, v := range PodLabels(id, attempt) {
		if pod.Labels[k] != v {
			return Identity{}, 0, fmt.Errorf("pod %s/%s: label %s=%q disagrees with its annotations (want %q)", pod.Namespace, pod.Name, k, pod.Labels[k], v)
		}
	}
	return id, attempt, nil
}

// BuildPod returns the pod of attempt (0 for the first) of run id of task t, which
// must be defaulted and valid (Load returns such tasks). The pod is a deep copy of the
// template with: the name PodName(id, attempt), the namespace id.Namespace, kubetask's
// labels (PodLabels) and annotations added, the Finalizer, restartPolicy Never when
// unset, and the result plumbing. t is not modified. Equal inputs give equal pods.
func BuildPod(t *Task, id Identity, attempt int) (*corev1.Pod, error) {
	if attempt < 0 {
		return nil, fmt.Errorf("building pod: negative attempt %d", attempt)
	}
	if err := id.validate(); err != nil {
		return nil, fmt.Errorf("building pod: %w", err)
	}
	tmpl := t.Spec.Template.DeepCopy()
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(id, attempt),
			Namespace:   id.Namespace,
			Labels:      tmpl.Labels,
			Annotations: tmpl.Annotations,
			Finalizers:  []string{Finalizer},
		},
		Spec: tmpl.Spec,
	}
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	for k, v := range PodLabels(id, attempt) {
		pod.Labels[k] = v
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	for k, v := range map[string]string{
		AnnotationTaskNamespace: id.Namespace,
		AnnotationTaskName:      id.Name,
		AnnotationRun:           id.RunID,
		AnnotationAttempt:       strconv.Itoa(attempt),
		AnnotationExecutor:      id.Executor,
		AnnotationMainContainer: t.Spec.MainContainer,
	} {
		pod.Annotations[k] = v
	}
	if id.Nonce != "" {
		pod.Annotations[AnnotationNonce] = id.Nonce
	}
	if pod.Spec.RestartPolicy == "" {
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	}
	main := mainContainer(&pod.Spec, t.Spec.MainContainer)
	if main == nil {
		return nil, fmt.Errorf("building pod: no container named %q (validate the task first)", t.Spec.MainContainer)
	}
	if r := t.Spec.Result; r != nil {
		switch r.From {
		case ResultFromTerminationMessage:
			if r.Path != "" {
				main.TerminationMessagePath = r.Path
			}
		case ResultFromFile:
			if err := addResultHolder(pod, main, r); err != nil {
				return nil, fmt.Errorf("building pod: %w", err)
			}
		}
	}
	return pod, nil
}

// ReadResultCommand is the command the runner execs in ResultContainer to read a File
// result: it prints at most MaxBytes+1 bytes of the file, so that the runner can tell a
// result that is too large, and fails when the file does not exist.
func ReadResultCommand(t *Task) []string {
	r := t.Spec.Result
	if r == nil || r.From != ResultFromFile {
		return nil
	}
	return []string{"head", "-c", strconv.FormatInt(r.Bytes()+1, 10), r.Path}
}

func mainContainer(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

// coveringMount returns the main container's mount whose path contains p (the deepest
// one), or nil.
func coveringMount(c *corev1.Container, p string) *corev1.VolumeMount {
	var best *corev1.VolumeMount
	for i := range c.VolumeMounts {
		m := &c.VolumeMounts[i]
		mp := path.Clean(m.MountPath)
		if (mp == "/" || strings.HasPrefix(p, mp+"/")) && (best == nil || len(mp) > len(path.Clean(best.MountPath))) {
			best = m
		}
	}
	return best
}

// addResultHolder shares the result file's directory between the main container and
// the result holder: through the main container's own volume when one covers the path,
// else through a new emptyDir mounted at the file's directory.
func addResultHolder(pod *corev1.Pod, main *corev1.Container, r *Result) error {
	holderMount := corev1.VolumeMount{Name: ResultVolume, MountPath: path.Dir(r.Path), ReadOnly: true}
	if m := coveringMount(main, r.Path); m != nil {
		if m.ReadOnly {
			return fmt.Errorf("result path %s is on volume %q, which the main container mounts read-only", r.Path, m.Name)
		}
		holderMount = corev1.VolumeMount{Name: m.Name, MountPath: m.MountPath, SubPath: m.SubPath, ReadOnly: true}
	} else {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: ResultVolume,
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		main.VolumeMounts = append(main.VolumeMounts, corev1.VolumeMount{Name: ResultVolume, MountPath: path.Dir(r.Path)})
	}
	pod.Annotations[AnnotationResultPath] = r.Path
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
		Name:            ResultContainer,
		Image:           r.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{"sh", "-c", resultHolderScript},
		VolumeMounts:    []corev1.VolumeMount{holderMount},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		SecurityContext:          holderSecurityContext(&pod.Spec, main),
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
		TerminationMessagePath:   corev1.TerminationMessagePathDefault,
	})
	return nil
}

// holderSecurityContext is restricted (Pod Security Standards) and runs as the main
// container's user when it sets one, so that the holder can read what the main
// container wrote. With runAsNonRoot and no user anywhere it runs as nobody (65534).
func holderSecurityContext(spec *corev1.PodSpec, main *corev1.Container) *corev1.SecurityContext {
	f := false
	sc := &corev1.SecurityContext{
		AllowPrivilegeEscalation: &f,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		ReadOnlyRootFilesystem:   ptr(true),
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	var podUser *int64
	var nonRoot bool
	if psc := spec.SecurityContext; psc != nil {
		podUser = psc.RunAsUser
		nonRoot = psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
	}
	if msc := main.SecurityContext; msc != nil {
		if msc.RunAsUser != nil {
			sc.RunAsUser = ptr(*msc.RunAsUser)
		}
		if msc.RunAsGroup != nil {
			sc.RunAsGroup = ptr(*msc.RunAsGroup)
		}
		if msc.RunAsNonRoot != nil {
			nonRoot = *msc.RunAsNonRoot
		}
	}
	if nonRoot || (sc.RunAsUser != nil && *sc.RunAsUser != 0) || (sc.RunAsUser == nil && podUser != nil && *podUser != 0) {
		sc.RunAsNonRoot = ptr(true)
		if sc.RunAsUser == nil && podUser == nil {
			sc.RunAsUser = ptr(int64(65534))
		}
	}
	return sc
}

func ptr[T any](v T) *T { return &v }
