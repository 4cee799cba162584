package task

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateTemplate checks the pod template for the mistakes people make, with the
// API server's rules and messages but at the task's paths: label and annotation keys
// and values, volume names and types, container names (DNS-1123 labels, unique
// across containers and init containers), images, pull and termination-message
// policies, ports, environment variables, volume mounts and resource quantities.
// Everything else (security contexts, probes, affinity, admission) is the API
// server's to judge: see ValidateOnServer. restartPolicy is checked by validateSpec.
func validateTemplate(tmpl *corev1.PodTemplateSpec, p *field.Path) field.ErrorList {
	meta := p.Child("metadata")
	errs := validateLabels(tmpl.Labels, meta.Child("labels"))
	errs = append(errs, validateAnnotations(tmpl.Annotations, meta.Child("annotations"))...)

	spec := &tmpl.Spec
	sp := p.Child("spec")
	volumes := sets.New[string]()
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		vp := sp.Child("volumes").Index(i)
		switch {
		case v.Name == "":
			errs = append(errs, field.Required(vp.Child("name"), "name the volume (a DNS-1123 label such as data)"))
		case volumes.Has(v.Name):
			errs = append(errs, field.Duplicate(vp.Child("name"), v.Name))
		default:
			errs = append(errs, dnsLabel(v.Name, vp.Child("name"))...)
		}
		volumes.Insert(v.Name)
		errs = append(errs, validateVolumeSource(&v.VolumeSource, vp)...)
	}

	// Regular containers first: a name used twice is reported at the init container,
	// as the API server does.
	names := sets.New[string]()
	for _, list := range []struct {
		name       string
		containers []corev1.Container
	}{{"containers", spec.Containers}, {"initContainers", spec.InitContainers}} {
		for i := range list.containers {
			errs = append(errs, validateContainer(&list.containers[i], sp.Child(list.name).Index(i), names, volumes)...)
		}
	}
	if len(spec.EphemeralContainers) > 0 {
		errs = append(errs, field.Forbidden(sp.Child("ephemeralContainers"), "cannot be set on create; remove them"))
	}
	return errs
}

func validateContainer(c *corev1.Container, p *field.Path, names, volumes sets.Set[string]) field.ErrorList {
	var errs field.ErrorList
	switch {
	case c.Name == "":
		errs = append(errs, field.Required(p.Child("name"), "name the container (a DNS-1123 label such as main)"))
	case names.Has(c.Name):
		errs = append(errs, field.Duplicate(p.Child("name"), c.Name))
	default:
		errs = append(errs, dnsLabel(c.Name, p.Child("name"))...)
	}
	names.Insert(c.Name)

	errs = append(errs, validateImage(c.Image, p.Child("image"))...)
	switch c.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, field.NotSupported(p.Child("imagePullPolicy"), c.ImagePullPolicy,
			[]corev1.PullPolicy{corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever}))
	}
	switch c.TerminationMessagePolicy {
	case "", corev1.TerminationMessageReadFile, corev1.TerminationMessageFallbackToLogsOnError:
	default:
		errs = append(errs, field.NotSupported(p.Child("terminationMessagePolicy"), c.TerminationMessagePolicy,
			[]corev1.TerminationMessagePolicy{corev1.TerminationMessageReadFile, corev1.TerminationMessageFallbackToLogsOnError}))
	}

	portNames := sets.New[string]()
	for i, port := range c.Ports {
		pp := p.Child("ports").Index(i)
		if port.Name != "" {
			if portNames.Has(port.Name) {
				errs = append(errs, field.Duplicate(pp.Child("name"), port.Name))
			}
			portNames.Insert(port.Name)
			for _, msg := range validation.IsValidPortName(port.Name) {
				errs = append(errs, field.Invalid(pp.Child("name"), port.Name, msg))
			}
		}
		for _, msg := range validation.IsValidPortNum(int(port.ContainerPort)) {
			errs = append(errs, field.Invalid(pp.Child("containerPort"), port.ContainerPort, msg))
		}
		if port.HostPort != 0 {
			for _, msg := range validation.IsValidPortNum(int(port.HostPort)) {
				errs = append(errs, field.Invalid(pp.Child("hostPort"), port.HostPort, msg))
			}
		}
		switch port.Protocol {
		case "", corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		default:
			errs = append(errs, field.NotSupported(pp.Child("protocol"), port.Protocol,
				[]corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}))
		}
	}

	for i := range c.Env {
		errs = append(errs, validateEnvVar(&c.Env[i], p.Child("env").Index(i))...)
	}

	mountPaths := sets.New[string]()
	for i, m := range c.VolumeMounts {
		mp := p.Child("volumeMounts").Index(i)
		switch {
		case m.Name == "":
			errs = append(errs, field.Required(mp.Child("name"), "name one of spec.volumes"))
		case !volumes.Has(m.Name):
			errs = append(errs, field.NotFound(mp.Child("name"), m.Name))
		}
		switch {
		case m.MountPath == "":
			errs = append(errs, field.Required(mp.Child("mountPath"), "give the absolute path where the volume appears in the container"))
		case mountPaths.Has(m.MountPath):
			errs = append(errs, field.Invalid(mp.Child("mountPath"), m.MountPath, "must be unique"))
		}
		mountPaths.Insert(m.MountPath)
	}

	errs = append(errs, validateResources(&c.Resources, p.Child("resources"))...)
	return errs
}

func validateImage(image string, p *field.Path) field.ErrorList {
	switch {
	case image == "":
		return field.ErrorList{field.Required(p, "give the container's image, such as busybox:1.37")}
	case strings.TrimSpace(image) != image:
		return field.ErrorList{field.Invalid(p, image, "must not have leading or trailing whitespace")}
	}
	return nil
}

// envFieldPaths are the fieldRef paths an environment variable may use (besides
// metadata.labels['key'] and metadata.annotations['key']).
var envFieldPaths = []string{"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
	"spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"}

func validateEnvVar(ev *corev1.EnvVar, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if ev.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), "name the variable"))
	} else {
		for _, msg := range validation.IsRelaxedEnvVarName(ev.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), ev.Name, msg))
		}
	}
	vf := ev.ValueFrom
	if vf == nil {
		return errs
	}
	vp := p.Child("valueFrom")
	if ev.Value != "" {
		errs = append(errs, field.Invalid(vp, "", "may not be specified when `value` is not empty"))
	}
	sources := 0
	for _, set := range []bool{vf.FieldRef != nil, vf.ResourceFieldRef != nil, vf.ConfigMapKeyRef != nil, vf.SecretKeyRef != nil, vf.FileKeyRef != nil} {
		if set {
			sources++
		}
	}
	switch {
	case sources == 0:
		errs = append(errs, field.Invalid(vp, "", "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef`, `secretKeyRef` or `fileKeyRef`"))
	case sources > 1:
		errs = append(errs, field.Invalid(vp, "", "may not have more than one field specified at a time"))
	}
	if fr := vf.FieldRef; fr != nil {
		fp := fr.FieldPath
		path, key, subscripted := strings.Cut(strings.TrimSuffix(fp, "']"), "['")
		switch {
		case fp == "":
			errs = append(errs, field.Required(vp.Child("fieldRef", "fieldPath"), "name a pod field such as metadata.name"))
		case subscripted && strings.HasSuffix(fp, "']") && (path == "metadata.labels" || path == "metadata.annotations"):
			k := key
			if path == "metadata.annotations" {
				k = strings.ToLower(k)
			}
			for _, msg := range validation.IsQualifiedName(k) {
				errs = append(errs, field.Invalid(vp.Child("fieldRef", "fieldPath"), fp, msg))
			}
		case !slices.Contains(envFieldPaths, fp):
			errs = append(errs, field.NotSupported(vp.Child("fieldRef", "fieldPath"), fp,
				append([]string{"metadata.labels['<KEY>']", "metadata.annotations['<KEY>']"}, envFieldPaths...)))
		}
	}
	return errs
}

func validateResources(r *corev1.ResourceRequirements, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, list := range []struct {
		name string
		l    corev1.ResourceList
	}{{"limits", r.Limits}, {"requests", r.Requests}} {
		for _, name := range sortedKeys(list.l) {
			q := list.l[name]
			kp := p.Child(list.name).Key(string(name))
			for _, msg := range validation.IsQualifiedName(string(name)) {
				errs = append(errs, field.Invalid(kp, name, msg))
			}
			if q.Sign() < 0 {
				errs = append(errs, field.Invalid(kp, q.String(), "must be greater than or equal to 0"))
			}
		}
	}
	for _, name := range sortedKeys(r.Requests) {
		req := r.Requests[name]
		if limit, ok := r.Limits[name]; ok && req.Cmp(limit) > 0 {
			errs = append(errs, field.Invalid(p.Child("requests"), req.String(),
				fmt.Sprintf("must be less than or equal to %s limit of %s", name, limit.String())))
		}
	}
	return errs
}

// validateVolumeSource allows at most one volume type, as the API server does (a
// volume without one is an emptyDir).
func validateVolumeSource(src *corev1.VolumeSource, p *field.Path) field.ErrorList {
	v := reflect.ValueOf(src).Elem()
	var set []string
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			set = append(set, name)
		}
	}
	if len(set) > 1 {
		return field.ErrorList{field.Forbidden(p.Child(set[1]), "may not specify more than 1 volume type")}
	}
	return nil
}

func validateLabels(labels map[string]string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, k := range sortedKeys(labels) {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(p.Key(k), k, msg))
		}
		for _, msg := range validation.IsValidLabelValue(labels[k]) {
			errs = append(errs, field.Invalid(p.Key(k), labels[k], msg))
		}
	}
	return errs
}

func validateAnnotations(annotations map[string]string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	size := 0
	for _, k := range sortedKeys(annotations) {
		// Annotation keys are label keys in any case.
		for _, msg := range validation.IsQualifiedName(strings.ToLower(k)) {
			errs = append(errs, field.Invalid(p.Key(k), k, msg))
		}
		size += len(k) + len(annotations[k])
	}
	if size > apivalidation.TotalAnnotationSizeLimitB {
		errs = append(errs, field.TooLong(p, "", apivalidation.TotalAnnotationSizeLimitB))
	}
	return errs
}

func dnsLabel(name string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}
