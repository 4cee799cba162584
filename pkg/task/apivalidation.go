package task

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	podutil "k8s.io/kubernetes/pkg/api/pod"
	api "k8s.io/kubernetes/pkg/apis/core"
	k8sv1 "k8s.io/kubernetes/pkg/apis/core/v1"
	apivalidation "k8s.io/kubernetes/pkg/apis/core/validation"
)

// placeholder is the identity the pod built for validation carries.
var placeholder = Identity{Namespace: "default", Name: "validate", RunID: "validate", Executor: "validate"}

// validatePod builds the pod of the task's first attempt and runs the API server's
// create validation on it, reporting errors at the task's field paths.
func (t *Task) validatePod() field.ErrorList {
	id := placeholder
	if t.Namespace != "" {
		id.Namespace = t.Namespace
	}
	if t.Name != "" {
		id.Name = t.Name
	}
	pod, err := BuildPod(t, id, 0)
	if err != nil {
		return field.ErrorList{field.Invalid(field.NewPath("spec"), nil, err.Error())}
	}
	errs := validatePodCreate(pod)
	holder := fmt.Sprintf("spec.containers[%d]", len(t.Spec.Template.Spec.Containers))
	for _, e := range errs {
		switch {
		case strings.HasPrefix(e.Field, holder):
			e.Field = "spec.result" + strings.TrimPrefix(e.Field, holder)
		case strings.HasPrefix(e.Field, "spec"):
			e.Field = "spec.template.spec" + strings.TrimPrefix(e.Field, "spec")
		case strings.HasPrefix(e.Field, "metadata.labels"), strings.HasPrefix(e.Field, "metadata.annotations"):
			e.Field = "spec.template." + e.Field
		}
	}
	return errs
}

// validatePodCreate applies the API server's defaulting and create validation
// (k8s.io/kubernetes/pkg/apis/core/validation.ValidatePodCreate) to a v1 pod, with the
// validation options the API server derives from the default feature gates. Admission
// plugins (LimitRange, ResourceQuota, Pod Security) are not run: they depend on the
// cluster.
func validatePodCreate(pod *corev1.Pod) field.ErrorList {
	p := pod.DeepCopy()
	k8sv1.SetObjectDefaults_Pod(p)
	var internal api.Pod
	if err := k8sv1.Convert_v1_Pod_To_core_Pod(p, &internal, nil); err != nil {
		return field.ErrorList{field.InternalError(field.NewPath("spec"), fmt.Errorf("converting pod: %w", err))}
	}
	opts := podutil.GetValidationOptionsFromPodSpecAndMeta(&internal.Spec, nil, &internal.ObjectMeta, nil)
	return apivalidation.ValidatePodCreate(&internal, opts)
}
