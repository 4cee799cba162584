package task

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubetask/kubetask/pkg/podstate"
)

// Defaults of the task format (see docs/task-format.md).
const (
	DefaultScheduleTimeout  Duration = "10m"
	DefaultStartupTimeout   Duration = "10m"
	DefaultRunTimeout       Duration = "0s"
	DefaultImagePullGrace   Duration = "3m"
	DefaultContainerConfig  Duration = "1m"
	DefaultRetryLimit       int32    = 2
	DefaultBackoff          Duration = "10s"
	DefaultFileResultBytes           = "1Mi"
	MaxRetryLimit           int32    = 100
	maxFileResultBytes               = 64 << 20
	defaultTerminationBytes          = "4096"
)

// Default fills in every unset field with its default. It is idempotent and does not
// touch fields that are set, valid or not.
func (t *Task) Default() {
	t.APIVersion, t.Kind = APIVersion, Kind
	s := &t.Spec
	if s.MainContainer == "" {
		s.MainContainer = podstate.DefaultMainContainer(&s.Template.Spec)
	}
	if s.Cleanup == "" {
		s.Cleanup = CleanupDelete
	}
	setDefault(&s.Timeouts.Schedule, DefaultScheduleTimeout)
	setDefault(&s.Timeouts.Startup, DefaultStartupTimeout)
	setDefault(&s.Timeouts.Run, DefaultRunTimeout)
	setDefault(&s.Timeouts.ImagePull, DefaultImagePullGrace)
	setDefault(&s.Timeouts.ContainerConfig, DefaultContainerConfig)
	if s.Retries.Limit == nil {
		s.Retries.Limit = ptr(DefaultRetryLimit)
	}
	setDefault(&s.Retries.Backoff, DefaultBackoff)
	if len(s.Retries.RetryOn) == 0 {
		s.Retries.RetryOn = []string{RetryOnInfrastructure}
	}
	if r := s.Result; r != nil {
		switch r.From {
		case ResultFromFile:
			if r.MaxBytes == "" {
				r.MaxBytes = DefaultFileResultBytes
			}
			if r.Image == "" {
				r.Image = DefaultResultImage
			}
		case ResultFromTerminationMessage:
			if r.MaxBytes == "" {
				r.MaxBytes = defaultTerminationBytes
			}
			if r.Path == "" {
				r.Path = corev1.TerminationMessagePathDefault
				if c := mainContainer(&s.Template.Spec, s.MainContainer); c != nil && c.TerminationMessagePath != "" {
					r.Path = c.TerminationMessagePath
				}
			}
		}
	}
	if len(s.Logs.Containers) == 0 && s.MainContainer != "" {
		s.Logs.Containers = []string{s.MainContainer}
	}
	if s.Template.Spec.RestartPolicy == "" {
		s.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	}
}

func setDefault(d *Duration, v Duration) {
	if *d == "" {
		*d = v
	}
}

// Validate checks a defaulted task and returns an *InvalidError listing every problem
// with its field path and what to do about it, or nil. It needs no cluster: it checks
// the task's own fields and, in the pod template, what people get wrong (names,
// images, ports, environment variables, volume mounts, resources, labels and
// annotations) with the API server's rules. What only a cluster can judge (the rest
// of the pod spec, admission) is ValidateOnServer's.
func (t *Task) Validate() error {
	errs := t.validateSpec()
	errs = append(errs, validateTemplate(&t.Spec.Template, field.NewPath("spec", "template"))...)
	if len(errs) == 0 {
		return nil
	}
	return &InvalidError{Name: t.Name, Errs: errs}
}

func (t *Task) validateSpec() field.ErrorList {
	var errs field.ErrorList
	if t.APIVersion != APIVersion || t.Kind != Kind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), t.Kind,
			fmt.Sprintf("must be %s with apiVersion %s (call Default first)", Kind, APIVersion)))
	}
	meta := field.NewPath("metadata")
	if t.Name == "" {
		errs = append(errs, field.Required(meta.Child("name"), "name the task (a DNS subdomain such as etl-daily)"))
	}
	for _, msg := range validation.IsDNS1123Subdomain(t.Name) {
		if t.Name != "" {
			errs = append(errs, field.Invalid(meta.Child("name"), t.Name, msg))
		}
	}
	if t.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(t.Namespace) {
			errs = append(errs, field.Invalid(meta.Child("namespace"), t.Namespace, msg))
		}
	}
	errs = append(errs, validateLabels(t.Labels, meta.Child("labels"))...)

	spec := field.NewPath("spec")
	s := &t.Spec
	tmpl := spec.Child("template")
	podSpec := tmpl.Child("spec")
	errs = append(errs, validateMainContainer(s, spec)...)

	switch s.Cleanup {
	case CleanupDelete, CleanupDeleteSucceeded, CleanupKeep:
	default:
		errs = append(errs, field.NotSupported(spec.Child("cleanup"), s.Cleanup,
			[]Cleanup{CleanupDelete, CleanupDeleteSucceeded, CleanupKeep}))
	}

	to := spec.Child("timeouts")
	for _, d := range []struct {
		name string
		v    Duration
	}{{"schedule", s.Timeouts.Schedule}, {"startup", s.Timeouts.Startup}, {"run", s.Timeouts.Run},
		{"imagePull", s.Timeouts.ImagePull}, {"containerConfig", s.Timeouts.ContainerConfig}} {
		errs = append(errs, validateDuration(d.v, to.Child(d.name))...)
	}

	re := spec.Child("retries")
	if l := s.Retries.Limit; l != nil && (*l < 0 || *l > MaxRetryLimit) {
		errs = append(errs, field.Invalid(re.Child("limit"), *l,
			fmt.Sprintf("must be between 0 (no retries) and %d", MaxRetryLimit)))
	}
	errs = append(errs, validateDuration(s.Retries.Backoff, re.Child("backoff"))...)
	for i, on := range s.Retries.RetryOn {
		if on == RetryOnInfrastructure {
			continue
		}
		r := podstate.Reason(on)
		if !slices.Contains(retryOnValues(), string(r)) {
			errs = append(errs, field.NotSupported(re.Child("retryOn").Index(i), on, retryOnValues()))
		}
	}

	if s.Result != nil {
		errs = append(errs, validateResult(s, spec.Child("result"))...)
	}
	if s.Placement != nil {
		errs = append(errs, validatePlacement(s.Placement, spec.Child("placement"))...)
	}

	for i, name := range s.Logs.Containers {
		p := spec.Child("logs", "containers").Index(i)
		if slices.Contains(s.Logs.Containers[:i], name) {
			errs = append(errs, field.Duplicate(p, name))
		} else if mainContainer(&s.Template.Spec, name) == nil && !hasInit(&s.Template.Spec, name) {
			errs = append(errs, field.NotFound(p, name))
		}
	}

	switch s.Template.Spec.RestartPolicy {
	case corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure:
	default:
		errs = append(errs, field.NotSupported(podSpec.Child("restartPolicy"), s.Template.Spec.RestartPolicy,
			[]string{string(corev1.RestartPolicyNever) + " (default)", string(corev1.RestartPolicyOnFailure)}))
	}
	tmeta := tmpl.Child("metadata")
	for k := range s.Template.Labels {
		if reservedKey(k) {
			errs = append(errs, field.Invalid(tmeta.Child("labels").Key(k), k,
				"label keys under "+Prefix+" and "+LabelManagedBy+" are set by kubetask; remove it"))
		}
	}
	for k := range s.Template.Annotations {
		if reservedKey(k) {
			errs = append(errs, field.Invalid(tmeta.Child("annotations").Key(k), k,
				"annotation keys under "+Prefix+" are set by kubetask; remove it"))
		}
	}
	for i, c := range s.Template.Spec.Containers {
		if c.Name == ResultContainer {
			errs = append(errs, field.Invalid(podSpec.Child("containers").Index(i).Child("name"), c.Name,
				"this container name is reserved for kubetask's result holder; rename the container"))
		}
	}
	for i, v := range s.Template.Spec.Volumes {
		if v.Name == ResultVolume && s.Result != nil && s.Result.From == ResultFromFile {
			errs = append(errs, field.Invalid(podSpec.Child("volumes").Index(i).Child("name"), v.Name,
				"this volume name is reserved for kubetask's result volume; rename the volume"))
		}
	}
	return errs
}

func validateMainContainer(s *Spec, spec *field.Path) field.ErrorList {
	names := containerNames(&s.Template.Spec)
	p := spec.Child("mainContainer")
	switch {
	case len(s.Template.Spec.Containers) == 0:
		return field.ErrorList{field.Required(spec.Child("template", "spec", "containers"),
			"add at least one container: the task's main container")}
	case s.MainContainer == "" && len(s.Template.Spec.Containers) == 1:
		return nil // the only container has no name: reported at its own path
	case s.MainContainer == "":
		return field.ErrorList{field.Required(p, fmt.Sprintf(
			"the pod has several containers and none is named base or main: set spec.mainContainer (on a plain Pod, the annotation "+AnnotationMainContainer+"; with kubetask run, --main-container) to the one whose exit decides the task (one of %s)", names))}
	case mainContainer(&s.Template.Spec, s.MainContainer) == nil:
		msg := fmt.Sprintf("no container named %q in spec.template.spec.containers; set it to one of %s", s.MainContainer, names)
		if hasInit(&s.Template.Spec, s.MainContainer) {
			msg = fmt.Sprintf("%q is an init container; the main container must be a regular one (one of %s)", s.MainContainer, names)
		}
		return field.ErrorList{field.Invalid(p, s.MainContainer, msg)}
	}
	return nil
}

func validateResult(s *Spec, p *field.Path) field.ErrorList {
	r := s.Result
	var errs field.ErrorList
	maxBytes := int64(maxFileResultBytes)
	switch r.From {
	case ResultFromFile:
	case ResultFromTerminationMessage:
		maxBytes = MaxTerminationMessageBytes
		if r.Image != "" {
			errs = append(errs, field.Forbidden(p.Child("image"), "only File results use a result holder; remove it"))
		}
	case "":
		return append(errs, field.Required(p.Child("from"), "say where the result comes from: File or TerminationMessage"))
	default:
		return append(errs, field.NotSupported(p.Child("from"), r.From, []ResultSource{ResultFromFile, ResultFromTerminationMessage}))
	}

	if q, err := resource.ParseQuantity(r.MaxBytes); err != nil {
		errs = append(errs, field.Invalid(p.Child("maxBytes"), r.MaxBytes, "must be a byte count such as 4096, 64Ki or 1Mi"))
	} else if q.Value() <= 0 || q.Value() > maxBytes {
		msg := fmt.Sprintf("must be between 1 and %d bytes", maxBytes)
		if r.From == ResultFromTerminationMessage {
			msg += "; termination messages are limited to 4096 bytes by the kubelet: use from: File for larger results"
		} else {
			msg += "; store larger results elsewhere (an object store) and return a reference"
		}
		errs = append(errs, field.Invalid(p.Child("maxBytes"), r.MaxBytes, msg))
	}

	pp := p.Child("path")
	switch {
	case r.From == ResultFromFile && r.Path == "":
		errs = append(errs, field.Required(pp, "give the absolute path of the result file the main container writes, such as /kubetask/result.json"))
		return errs
	case !path.IsAbs(r.Path) || path.Clean(r.Path) != r.Path || strings.HasSuffix(r.Path, "/"):
		errs = append(errs, field.Invalid(pp, r.Path, "must be an absolute, clean file path such as /kubetask/result.json"))
		return errs
	}
	main := mainContainer(&s.Template.Spec, s.MainContainer)
	if main == nil {
		return errs
	}
	if r.From == ResultFromTerminationMessage {
		if main.TerminationMessagePath != "" && main.TerminationMessagePath != r.Path {
			errs = append(errs, field.Invalid(pp, r.Path, fmt.Sprintf(
				"the main container's terminationMessagePath is %s: use the same path in both places", main.TerminationMessagePath)))
		}
		return errs
	}
	if r.Image == "" {
		errs = append(errs, field.Required(p.Child("image"), "give an image with sh, sleep and head (default "+DefaultResultImage+")"))
	} else {
		errs = append(errs, validateImage(r.Image, p.Child("image"))...)
	}
	if m := coveringMount(main, r.Path); m != nil {
		switch {
		case m.ReadOnly:
			errs = append(errs, field.Invalid(pp, r.Path, fmt.Sprintf(
				"the main container mounts volume %q read-only at %s; mount it writable or choose a path outside it", m.Name, m.MountPath)))
		case m.SubPathExpr != "":
			errs = append(errs, field.Invalid(pp, r.Path, fmt.Sprintf(
				"volume %q is mounted with subPathExpr, which the result holder cannot reproduce; use subPath or a path outside it", m.Name)))
		}
		return errs
	}
	dir := path.Dir(r.Path)
	if dir == "/" {
		errs = append(errs, field.Invalid(pp, r.Path,
			"the result file needs a directory of its own, where kubetask mounts a volume shared with the result holder: use a path such as /kubetask/result.json"))
	}
	for _, m := range main.VolumeMounts {
		if mp := path.Clean(m.MountPath); strings.HasPrefix(mp+"/", dir+"/") {
			errs = append(errs, field.Invalid(pp, r.Path, fmt.Sprintf(
				"kubetask mounts a shared volume at %s, which would hide volume %q mounted at %s; choose another directory", dir, m.Name, m.MountPath)))
		}
	}
	return errs
}

func validateDuration(d Duration, p *field.Path) field.ErrorList {
	v, err := time.ParseDuration(string(d))
	switch {
	case d == "":
		return nil
	case err != nil:
		return field.ErrorList{field.Invalid(p, string(d), "must be a duration such as 90s, 5m or 1h30m")}
	case v < 0:
		return field.ErrorList{field.Invalid(p, string(d), "must not be negative; use 0s for no limit")}
	}
	return nil
}

func nonTerminalReason(r podstate.Reason) bool {
	switch r {
	case podstate.ReasonScheduling, podstate.ReasonUnschedulable, podstate.ReasonInitializing,
		podstate.ReasonStarting, podstate.ReasonRunning, podstate.ReasonRestarting:
		return true
	}
	return false
}

func retryOnValues() []string {
	out := []string{RetryOnInfrastructure}
	for _, r := range podstate.Reasons {
		if r != podstate.ReasonCompleted && r != podstate.ReasonCancelled && !nonTerminalReason(r) {
			out = append(out, string(r))
		}
	}
	return out
}

func reservedKey(k string) bool {
	return strings.HasPrefix(k, Prefix) || k == LabelManagedBy
}

func hasInit(spec *corev1.PodSpec, name string) bool {
	for _, c := range spec.InitContainers {
		if c.Name == name {
			return true
		}
	}
	return false
}

func containerNames(spec *corev1.PodSpec) string {
	var names []string
	for _, c := range spec.Containers {
		names = append(names, c.Name)
	}
	return strings.Join(names, ", ")
}

// maxClusterName is the longest cluster name (store.MaxClusterNameLength:
// a cluster's name is part of executor instance names).
const maxClusterName = 40

// validatePlacement checks the form of p; whether a cluster it names or
// selects is configured is the service's to say (placement.Check).
func validatePlacement(p *Placement, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if p.Cluster != "" && p.ClusterSelector != nil {
		errs = append(errs, field.Invalid(path.Child("clusterSelector"), "",
			"cluster and clusterSelector are exclusive: name one cluster, or select clusters by their labels"))
	}
	if p.Cluster != "" {
		msgs := validation.IsDNS1123Label(p.Cluster)
		if len(p.Cluster) > maxClusterName {
			msgs = append(msgs, fmt.Sprintf("must be no more than %d characters", maxClusterName))
		}
		for _, msg := range msgs {
			errs = append(errs, field.Invalid(path.Child("cluster"), p.Cluster, msg))
		}
	}
	if p.ClusterSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(p.ClusterSelector); err != nil {
			errs = append(errs, field.Invalid(path.Child("clusterSelector"), p.ClusterSelector.String(), err.Error()))
		}
	}
	if p.LostAfter != "" {
		if d := validateDuration(p.LostAfter, path.Child("lostAfter")); len(d) > 0 {
			errs = append(errs, d...)
		} else if p.LostAfter.Get() < MinLostAfter {
			errs = append(errs, field.Invalid(path.Child("lostAfter"), string(p.LostAfter),
				fmt.Sprintf("must be at least %s (a cluster quiet for less is often only slow), or unset to wait for the cluster however long", MinLostAfter)))
		}
	}
	return errs
}
