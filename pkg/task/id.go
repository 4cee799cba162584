package task

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxIDLength bounds a task ID, in bytes of UTF-8: room for the keys that
// schedulers make (an Airflow task-instance key joins a DAG ID, a task ID and
// a run ID), far beyond a label value's 63.
const MaxIDLength = 512

// ValidateID checks a task ID (a run ID). IDs are taken as schedulers make
// them: any printable text of 1 to MaxIDLength bytes, such as
// "etl_dag.Extract_Users.scheduled__2026-12-01T00:00:00+00:00.1". Refused is
// only what cannot come back unchanged through a URL path segment, an HTTP
// header, a shell argument and a database: invalid UTF-8, control
// characters (and the Unicode line and paragraph separators), '/', leading or
// trailing white space, and the path segments "." and "..". The error says
// what is wrong and how to fix it.
//
// An ID is kept exact in the store, the API and the pod's annotation
// (AnnotationRun); where Kubernetes needs a name or a label value (the pod's
// name, LabelRun) a value derived from it is used (PodName, RunLabelValue).
func ValidateID(id string) error {
	switch {
	case id == "":
		return errors.New("the task ID is empty")
	case len(id) > MaxIDLength:
		return fmt.Errorf("the task ID is %d bytes long, longer than %d: shorten it (a hash of a longer key will do)", len(id), MaxIDLength)
	case !utf8.ValidString(id):
		return errors.New("the task ID is not valid UTF-8")
	case id == "." || id == "..":
		return fmt.Errorf("the task ID %q is a relative path segment: choose another", id)
	}
	for i, r := range id {
		switch {
		case r == '/':
			return fmt.Errorf("the task ID has a '/' at byte %d: use another separator, such as '.' or ':'", i)
		case unicode.IsControl(r) || r == '\u2028' || r == '\u2029':
			return fmt.Errorf("the task ID has the control character %U at byte %d: IDs are printable text", r, i)
		}
	}
	if strings.TrimSpace(id) != id {
		return errors.New("the task ID starts or ends with white space: trim it")
	}
	return nil
}

// RunLabelValue is the value of LabelRun for run ID id: id itself when it is
// a valid label value (as every ID was before IDs could be longer), else a
// prefix of it made label-safe and a hash of the whole ID, 63 characters at
// most. Different IDs give different values (but for a hash collision, or an
// ID chosen to equal another's derived value); the pod's AnnotationRun holds
// the exact ID, which decides.
func RunLabelValue(id string) string { return labelValue(id) }
