package server_test

import (
	"net/http"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
)

// A submission to a namespace the API server does not have is refused with
// the namespace named (the server's dry-run answers NotFound for
// namespaces), and creates nothing; another NotFound (not a verdict on the
// task) is accepted.
func TestSubmitToAMissingNamespace(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.ValidateOnServer = true })
	kind := "namespaces"
	h.client.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: kind}, "nope")
	})
	resp, b := h.do(http.MethodPost, api.Prefix+"/namespaces/nope/tasks", []byte(taskDoc("hello")), "Content-Type", "application/yaml")
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(b), `namespace \"nope\" does not exist`) || !strings.Contains(string(b), `"location":"path.ns"`) {
		t.Errorf("submit to a missing namespace: %s %s", resp.Status, b)
	}
	if n := h.exec.submits.Load(); n != 0 {
		t.Errorf("%d submissions reached the executor", n)
	}
	kind = "configmaps"
	if resp, b := h.do(http.MethodPost, api.Prefix+"/namespaces/nope/tasks", []byte(taskDoc("hello")), "Content-Type", "application/yaml"); resp.StatusCode != http.StatusCreated {
		t.Errorf("submit with a dry-run NotFound of something else: %s %s", resp.Status, b)
	}
}
