package task

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// MaxDocumentBytes bounds the size of a task document.
const MaxDocumentBytes = 4 << 20

// InvalidError lists everything wrong with a task, each error naming its field path:
// the task is rejected for what it is, and resubmitting it unchanged cannot succeed.
// Load, Validate and ValidateOnServer return it (wrapped or not: use errors.As); no
// other error of theirs is a verdict on the task.
type InvalidError struct {
	// Name is the task's name, if known.
	Name string
	// Errs is never empty.
	Errs field.ErrorList
}

// Error renders one error per line.
func (e *InvalidError) Error() string {
	var b strings.Builder
	if e.Name != "" {
		fmt.Fprintf(&b, "invalid task %q:", e.Name)
	} else {
		b.WriteString("invalid task:")
	}
	for _, err := range e.Errs {
		b.WriteString("\n  ")
		b.WriteString(err.Error())
	}
	return b.String()
}

// Load reads one task document (YAML or JSON; kind Task, or kind Pod) from r, applies
// defaults and validates it. Unknown and duplicate fields and mistyped values are
// errors. The errors that concern the document's content are one *InvalidError that
// lists every problem at once, decoding problems first, with the field paths of the
// document as written (for a Pod, spec.containers[0] rather than
// spec.template.spec.containers[0]).
func Load(r io.Reader) (*Task, error) { return LoadWith(r, nil) }

// LoadWith is Load with edit, if not nil, applied to the decoded task before defaults
// and validation (for overrides such as the CLI's --main-container, which must be able
// to make an otherwise invalid document valid).
func LoadWith(r io.Reader, edit func(*Task)) (*Task, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxDocumentBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading task: %w", err)
	}
	if len(data) > MaxDocumentBytes {
		return nil, fmt.Errorf("reading task: document larger than %d bytes", MaxDocumentBytes)
	}
	return ParseWith(data, edit)
}

// Parse is Load for a document in memory.
func Parse(data []byte) (*Task, error) { return ParseWith(data, nil) }

// ParseWith is LoadWith for a document in memory.
func ParseWith(data []byte, edit func(*Task)) (*Task, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("decoding task: the document is empty")
	}
	if multiDocument.Match(data) {
		return nil, errors.New("decoding task: the document holds several YAML documents; put one task per file")
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("decoding task: %w", err)
	}
	if string(bytes.TrimSpace(js)) == "null" {
		return nil, errors.New("decoding task: the document is empty")
	}
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(js, &tm); err != nil {
		return nil, fmt.Errorf("decoding task: the document must be an object with apiVersion and kind: %w", err)
	}
	var t *Task
	var decodeErrs field.ErrorList
	fromPod := false
	switch {
	case tm.APIVersion == APIVersion && tm.Kind == Kind:
		t = &Task{}
		if decodeErrs, err = decodeStrict(js, t); err != nil {
			return nil, err
		}
	case tm.APIVersion == "v1" && tm.Kind == "Pod":
		var pod corev1.Pod
		if decodeErrs, err = decodeStrict(js, &pod); err != nil {
			return nil, err
		}
		t, fromPod = FromPod(&pod), true
	default:
		return nil, &InvalidError{Errs: field.ErrorList{field.Invalid(field.NewPath("kind"), tm.Kind,
			fmt.Sprintf("must be kind %s with apiVersion %s, or kind Pod with apiVersion v1 (got apiVersion %q)",
				Kind, APIVersion, tm.APIVersion))}}
	}
	if edit != nil {
		edit(t)
	}
	t.Default()
	// Decoding problems come first, then validation problems, except those about a
	// value decoding dropped (it would be reported twice: as mistyped and as missing).
	errs := decodeErrs
	if err := t.Validate(); err != nil {
		var inv *InvalidError
		if !errors.As(err, &inv) {
			return nil, err
		}
		for _, e := range inv.Errs {
			if fromPod {
				e.Field = podPath(e.Field)
			}
			if !underAny(e.Field, decodeErrs) {
				errs = append(errs, e)
			}
		}
	}
	if len(errs) > 0 {
		return nil, &InvalidError{Name: t.Name, Errs: errs}
	}
	return t, nil
}

// underAny reports whether path p is one of errs' fields or inside one.
func underAny(p string, errs field.ErrorList) bool {
	for _, e := range errs {
		if p == e.Field || strings.HasPrefix(p, e.Field+".") || strings.HasPrefix(p, e.Field+"[") {
			return true
		}
	}
	return false
}

var multiDocument = regexp.MustCompile(`(?m)^---\s*\n\s*[^\s#]`)

// FromPod turns a pod manifest into a task: its name, namespace and labels become the
// task's, the rest of its metadata and its spec the template. The annotation
// AnnotationMainContainer, if present, names the main container. Server-populated
// fields and the status are ignored.
func FromPod(pod *corev1.Pod) *Task {
	t := &Task{
		TypeMeta: metav1.TypeMeta{APIVersion: APIVersion, Kind: Kind},
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, Labels: copyMap(pod.Labels),
		},
	}
	t.Spec.Template.Labels = copyMap(pod.Labels)
	t.Spec.Template.Annotations = copyMap(pod.Annotations)
	if main, ok := t.Spec.Template.Annotations[AnnotationMainContainer]; ok {
		t.Spec.MainContainer = main
		delete(t.Spec.Template.Annotations, AnnotationMainContainer)
		if len(t.Spec.Template.Annotations) == 0 {
			t.Spec.Template.Annotations = nil
		}
	}
	pod.Spec.DeepCopyInto(&t.Spec.Template.Spec)
	return t
}

// podPath rewrites a task field path into the path of the pod manifest it came from.
func podPath(p string) string {
	switch {
	case strings.HasPrefix(p, "spec.template.spec"):
		return "spec" + strings.TrimPrefix(p, "spec.template.spec")
	case strings.HasPrefix(p, "spec.template.metadata"):
		return "metadata" + strings.TrimPrefix(p, "spec.template.metadata")
	case p == "spec.mainContainer":
		return "metadata.annotations[" + AnnotationMainContainer + "]"
	}
	return p
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
