package server

import (
	"errors"
	"net/http"
	"testing"

	"github.com/danielgtaylor/huma/v2"
)

// FuzzDecodeSubmit: whatever the body and content type, the submission
// decoder returns a valid task in the path's namespace, or a 400, 415 or 422
// problem; it never panics.
func FuzzDecodeSubmit(f *testing.F) {
	task := "apiVersion: kubetask.dev/v1alpha1\nkind: Task\nmetadata: {name: t}\nspec:\n  template:\n    spec:\n      containers: [{name: main, image: busybox}]\n"
	for _, seed := range []struct{ ct, body string }{
		{"application/yaml", task},
		{"application/json", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"m","image":"x"}]}}`},
		{"text/yaml; charset=utf-8", "apiVersion: v1\nkind: Pod\n"},
		{"application/json", `{"apiVersion":`},
		{"application/yaml", "---\na: 1\n---\nb: 2\n"},
		{"text/plain", "x"},
		{"", ""},
		{"application/yaml", "apiVersion: kubetask.dev/v1alpha1\nkind: Task\nmetadata: {name: t, namespace: other}\nspec: {template: {spec: {containers: [{name: m, image: x, ports: [{containerPort: 99999}]}]}}}\n"},
	} {
		f.Add(seed.ct, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		tk, err := decodeSubmit(contentType, body, "ns")
		if err == nil {
			if tk == nil || tk.Namespace != "ns" || tk.Validate() != nil {
				t.Fatalf("accepted %+v", tk)
			}
			return
		}
		var se huma.StatusError
		if !errors.As(err, &se) {
			t.Fatalf("error without a status: %v", err)
		}
		switch se.GetStatus() {
		case http.StatusBadRequest, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		default:
			t.Fatalf("status %d: %v", se.GetStatus(), err)
		}
		if err.Error() == "" {
			t.Fatal("a problem without a detail")
		}
	})
}
