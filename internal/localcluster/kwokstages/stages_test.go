package kwokstages

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"
)

// TestStagesParse checks that the embedded file holds the expected stages,
// each a well-formed Stage document (kwok itself is exercised in test/integration/sim).
func TestStagesParse(t *testing.T) {
	want := []string{"node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-exit-container", "pod-sidecars-stop", "pod-complete", "pod-delete"}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(YAML), 4096)
	var got []string
	for {
		var doc struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec map[string]any `json:"spec"`
		}
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decoding stage %d: %v", len(got), err)
		}
		if doc.APIVersion != "kwok.x-k8s.io/v1alpha1" || doc.Kind != "Stage" || doc.Spec["resourceRef"] == nil {
			t.Errorf("document %q: apiVersion %q kind %q, resourceRef %v", doc.Metadata.Name, doc.APIVersion, doc.Kind, doc.Spec["resourceRef"])
		}
		got = append(got, doc.Metadata.Name)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("stages %v, want %v", got, want)
	}
	for _, key := range []string{ExitContainer, ExitCode, ExitAfter, SidecarsStopAfter, SidecarsExitCode, CompleteAfter, CompleteCode} {
		if !bytes.Contains(YAML, []byte(key)) {
			t.Errorf("annotation %s is not used by any stage", key)
		}
	}
}
