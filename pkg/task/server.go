package task

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
)

// ValidateOnServer asks the API server whether it would create the pod of t's first
// attempt in namespace (empty: t's namespace, else "default"). It builds that pod
// with BuildPod, a placeholder identity (run and executor "validate") and a generated
// name, and creates it with server-side dry run (DryRun: All): the API server
// defaults, validates and admits it (LimitRange, Pod Security, webhooks) and stores
// nothing. It checks what Validate cannot (the whole pod spec, the cluster's version
// and admission); t must be defaulted and pass Validate first.
//
// It returns nil when the API server accepts the pod, and an *InvalidError (the type
// Validate returns) only when the API server answers 422 Invalid: the pod can never be
// created as it is. Each cause is then reported at the task's path: the pod's
// spec.containers[i] of the result holder at spec.result, the rest of its spec at
// spec.template.spec, its labels and annotations at spec.template.metadata; its Detail
// is the API server's message (BadValue is field.OmitValueType). Every other error
// (Forbidden by a quota or a policy, a namespace that does not exist, a timeout, a 5xx,
// a network failure, a cancelled ctx) is returned wrapped and is NOT a verdict on the
// task: callers must not reject the task for it. Tell the two apart with errors.As.
func (t *Task) ValidateOnServer(ctx context.Context, client kubernetes.Interface, namespace string) error {
	if namespace == "" {
		namespace = t.Namespace
	}
	if namespace == "" {
		namespace = "default"
	}
	id := Identity{Namespace: namespace, Name: t.Name, RunID: "validate", Executor: "validate"}
	if id.Name == "" {
		id.Name = "validate"
	}
	pod, err := BuildPod(t, id, 0)
	if err != nil {
		return fmt.Errorf("validating task %q on the API server: %w", t.Name, err)
	}
	// A generated name cannot collide with an existing pod (AlreadyExists).
	pod.GenerateName, pod.Name = pod.Name+"-", ""
	_, err = client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil {
		return nil
	}
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return fmt.Errorf("validating task %q on the API server: %w", t.Name, err)
	}
	holder := -1
	if r := t.Spec.Result; r != nil && r.From == ResultFromFile {
		holder = len(t.Spec.Template.Spec.Containers)
	}
	var errs field.ErrorList
	if d := status.Status().Details; d != nil {
		for _, c := range d.Causes {
			errs = append(errs, causeError(c, taskPath(c.Field, holder)))
		}
	}
	if len(errs) == 0 {
		errs = append(errs, &field.Error{Type: field.ErrorTypeInvalid, Field: "spec.template",
			BadValue: field.OmitValueType{}, Detail: status.Status().Message})
	}
	return &InvalidError{Name: t.Name, Errs: errs}
}

// taskPath maps a field path of the pod BuildPod made to the task's: holder is the
// index of the result holder among the pod's containers, -1 when there is none.
func taskPath(p string, holder int) string {
	if holder >= 0 {
		h := fmt.Sprintf("spec.containers[%d]", holder)
		if rest, ok := strings.CutPrefix(p, h); ok && (rest == "" || rest[0] == '.' || rest[0] == '[') {
			return "spec.result" + rest
		}
	}
	for _, prefix := range []string{"spec", "metadata.labels", "metadata.annotations"} {
		if rest, ok := strings.CutPrefix(p, prefix); ok && (rest == "" || rest[0] == '.' || rest[0] == '[') {
			if prefix == "spec" {
				return "spec.template.spec" + rest
			}
			return "spec.template." + p
		}
	}
	return p
}

// causeError turns one cause of an Invalid answer back into the field error the API
// server made it from: its message is the error's body (type, value, detail).
func causeError(c metav1.StatusCause, path string) *field.Error {
	typ := field.ErrorType(c.Type)
	switch typ {
	case field.ErrorTypeNotFound, field.ErrorTypeRequired, field.ErrorTypeDuplicate, field.ErrorTypeInvalid,
		field.ErrorTypeNotSupported, field.ErrorTypeForbidden, field.ErrorTypeTooLong, field.ErrorTypeTooMany,
		field.ErrorTypeTooFew, field.ErrorTypeInternal, field.ErrorTypeTypeInvalid, field.ErrorTypeTooShort:
	default:
		return &field.Error{Type: field.ErrorTypeInvalid, Field: path, BadValue: field.OmitValueType{}, Detail: c.Message}
	}
	detail := c.Message
	if rest, ok := strings.CutPrefix(detail, typ.String()); ok {
		detail = strings.TrimPrefix(rest, ": ")
	}
	return &field.Error{Type: typ, Field: path, BadValue: field.OmitValueType{}, Detail: detail}
}
