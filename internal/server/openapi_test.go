package server_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubetask/kubetask/pkg/api"
)

var update = flag.Bool("update", false, "rewrite testdata/openapi.json from the handlers")

// TestOpenAPIDocumentIsCheckedIn fails when the OpenAPI document the handlers
// generate differs from testdata/openapi.json: an API change must come with
// the update of that copy (go test ./internal/server -update), so that it is
// reviewed as part of the change.
func TestOpenAPIDocumentIsCheckedIn(t *testing.T) {
	h := newHarness(t, nil)
	resp, body := h.do(http.MethodGet, api.Prefix+"/openapi.json", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET openapi.json: %s", resp.Status)
	}
	var doc any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "openapi.json")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (create it with go test ./internal/server -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the OpenAPI document changed: review the change and run go test ./internal/server -update (diff %s against GET %s/openapi.json)", path, api.Prefix)
	}
	if resp, _ := h.do(http.MethodGet, api.Prefix+"/openapi.yaml", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("GET openapi.yaml: %s", resp.Status)
	}
}
