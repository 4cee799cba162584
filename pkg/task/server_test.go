package task_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/pkg/task"
)

// TestValidateOnServer checks what ValidateOnServer makes of the API server's answers
// (the real API server's verdicts are in test/integration/cluster).
func TestValidateOnServer(t *testing.T) {
	podsGR := schema.GroupResource{Resource: "pods"}
	invalid := func(errs ...*field.Error) error {
		return apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "x", errs)
	}
	cases := map[string]struct {
		answer  error
		want    []string // the InvalidError's lines; nil: not an InvalidError
		wantErr string   // for other errors, a fragment of the message
	}{
		"accepted": {},
		"causes at the task's paths": {
			answer: invalid(
				field.Required(field.NewPath("spec", "containers").Index(0).Child("image"), ""),
				field.Invalid(field.NewPath("spec", "containers").Index(1).Child("securityContext", "runAsUser"), int64(-1), "must be between 0 and 2147483647, inclusive"),
				field.Invalid(field.NewPath("spec", "initContainers").Index(1).Child("name"), "X", "bad"),
				field.NotSupported(field.NewPath("spec", "dnsPolicy"), "Sometimes", []string{"ClusterFirst", "Default"}),
				field.Invalid(field.NewPath("metadata", "labels"), "a b", "name part must consist of ..."),
				field.Invalid(field.NewPath("metadata", "annotations").Key("k"), "v", "too long"),
				field.Forbidden(field.NewPath("metadata", "name"), "reserved"),
				field.TooLong(field.NewPath("spec"), "", 10),
			),
			want: []string{
				"spec.template.spec.containers[0].image: Required value",
				"spec.result.securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive",
				`spec.template.spec.initContainers[1].name: Invalid value: "X": bad`,
				`spec.template.spec.dnsPolicy: Unsupported value: "Sometimes": supported values: "ClusterFirst", "Default"`,
				`spec.template.metadata.labels: Invalid value: "a b": name part must consist of ...`,
				`spec.template.metadata.annotations[k]: Invalid value: "v": too long`,
				"metadata.name: Forbidden: reserved",
				"spec.template.spec: Too long: may not be more than 10 bytes",
			},
		},
		"a cause of an unknown type keeps its message": {
			answer: &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 422, Reason: metav1.StatusReasonInvalid,
				Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "SomethingNew", Field: "spec.containers[0].x", Message: "no"}}}}},
			want: []string{"spec.template.spec.containers[0].x: Invalid value: no"},
		},
		"invalid without causes": {
			answer: &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 422, Reason: metav1.StatusReasonInvalid, Message: "denied by a webhook"}},
			want:   []string{"spec.template: Invalid value: denied by a webhook"},
		},
		"forbidden by quota is not a verdict": {
			answer:  apierrors.NewForbidden(podsGR, "x", errors.New("exceeded quota: q")),
			wantErr: "exceeded quota",
		},
		"server error is not a verdict": {
			answer:  apierrors.NewInternalError(errors.New("etcd down")),
			wantErr: "etcd down",
		},
		"missing namespace is not a verdict": {
			answer:  apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "jobs"),
			wantErr: `namespaces "jobs" not found`,
		},
		"network error is not a verdict": {
			answer:  fmt.Errorf("dial tcp 127.0.0.1:6443: connect: connection refused"),
			wantErr: "connection refused",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tk, err := task.Parse([]byte(withSpec("  result: {from: File, path: /out/r.json}\n  template: {spec: {containers: [{name: base, image: a}]}}\n")))
			if err != nil {
				t.Fatal(err)
			}
			client := fake.NewClientset()
			var created *corev1.Pod
			var opts metav1.CreateOptions
			client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				ca := a.(k8stesting.CreateActionImpl)
				created, opts = ca.GetObject().(*corev1.Pod), ca.CreateOptions
				if tc.answer != nil {
					return true, nil, tc.answer
				}
				return true, created, nil
			})
			err = tk.ValidateOnServer(context.Background(), client, "jobs")
			if created == nil {
				t.Fatal("no pod was created")
			}
			if diff := cmp.Diff([]string{metav1.DryRunAll}, opts.DryRun); diff != "" {
				t.Errorf("DryRun (-want +got):\n%s", diff)
			}
			if created.Namespace != "jobs" || created.Name != "" || !strings.HasPrefix(created.GenerateName, "t1-") {
				t.Errorf("pod %s/%s (generateName %q); want a generated name in jobs", created.Namespace, created.Name, created.GenerateName)
			}
			var inv *task.InvalidError
			switch {
			case tc.want != nil:
				if !errors.As(err, &inv) {
					t.Fatalf("ValidateOnServer() = %v; want an *InvalidError", err)
				}
				var got []string
				for _, e := range inv.Errs {
					got = append(got, e.Error())
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("errors (-want +got):\n%s", diff)
				}
				if inv.Name != "t1" {
					t.Errorf("Name = %q, want t1", inv.Name)
				}
			case tc.wantErr != "":
				if err == nil || errors.As(err, &inv) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("ValidateOnServer() = %v; want a plain error containing %q", err, tc.wantErr)
				}
			default:
				if err != nil {
					t.Errorf("ValidateOnServer() = %v; want nil", err)
				}
			}
		})
	}
}
