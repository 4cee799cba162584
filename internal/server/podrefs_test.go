package server_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
)

// secretsDoc names Secrets of its namespace in every way a pod may take
// one, and a runtimeClassName.
const secretsDoc = `apiVersion: v1
kind: Pod
metadata:
  name: reader
spec:
  runtimeClassName: gvisor
  imagePullSecrets: [{name: regcred}]
  volumes:
  - name: creds
    secret: {secretName: db-password}
  - name: bundle
    projected:
      sources:
      - configMap: {name: settings}
      - secret: {name: api-key}
  - name: csi
    csi: {driver: secrets-store.csi.k8s.io, nodePublishSecretRef: {name: vault-login}}
  initContainers:
  - name: init
    image: busybox:1.37
    command: ["true"]
    env:
    - {name: PLAIN, value: x}
    - name: TOKEN
      valueFrom: {secretKeyRef: {name: deploy-token, key: token}}
  containers:
  - name: main
    image: busybox:1.37
    command: [env]
    envFrom:
    - configMapRef: {name: settings}
    - secretRef: {name: payroll}
`

// An operator may refuse Secret references and runtimeClassName in some
// namespaces (issue 33): a task of team-a that names Secrets in any way a
// pod can (image pull, secret, projected and CSI volumes, env and envFrom of
// any container) or sets runtimeClassName is a 422 naming each field and
// the option, and nothing is stored; team-b, not listed, submits the same
// task; a task of team-a without them is accepted. Before, nothing could
// refuse them.
func TestRefuseSecretsAndRuntimeClass(t *testing.T) {
	h := newHarness(t, func(c *server.Config) {
		c.PodPolicy = server.PodPolicy{RefuseSecrets: []string{"team-a"}, RefuseRuntimeClass: []string{"team-a"}}
	})
	submits := h.exec.submits.Load()
	r, b := postYAML(h, "team-a", secretsDoc)
	if r.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("%s %s, want 422", r.Status, b)
	}
	p := problemOf(t, b)
	want := []string{
		"body.spec.template.spec.imagePullSecrets[0]",
		"body.spec.template.spec.volumes[0].secret",
		"body.spec.template.spec.volumes[1].projected.sources[1].secret",
		"body.spec.template.spec.volumes[2].csi.nodePublishSecretRef",
		"body.spec.template.spec.initContainers[0].env[1].valueFrom.secretKeyRef",
		"body.spec.template.spec.containers[0].envFrom[1].secretRef",
		"body.spec.template.spec.runtimeClassName",
	}
	if diff := cmp.Diff(want, locations(p)); diff != "" {
		t.Errorf("refused fields (-want +got):\n%s", diff)
	}
	for _, s := range []string{"--refuse-secrets", "--refuse-runtime-class", `"team-a"`} {
		if !strings.Contains(p.Detail, s) {
			t.Errorf("the refusal does not name %s: %s", s, p.Detail)
		}
	}
	for _, e := range p.Errors {
		if !strings.Contains(e.Message, "--refuse-") {
			t.Errorf("%s: %q does not name its option", e.Location, e.Message)
		}
	}
	if n := h.exec.submits.Load(); n != submits {
		t.Errorf("a refused task reached the executor")
	}
	if r, b := postYAML(h, "team-b", secretsDoc); r.StatusCode != http.StatusCreated {
		t.Errorf("team-b, not listed: %s %s", r.Status, b)
	}
	if r, b := postYAML(h, "team-a", taskDoc("plain")); r.StatusCode != http.StatusCreated {
		t.Errorf("team-a without Secrets: %s %s", r.Status, b)
	}
	onlyClass := strings.Replace(taskDoc("sandboxed"), "    spec:\n", "    spec:\n      runtimeClassName: gvisor\n", 1)
	r, b = postYAML(h, "team-a", onlyClass)
	if p := problemOf(t, b); r.StatusCode != http.StatusUnprocessableEntity || !slices.Equal(locations(p), []string{"body.spec.template.spec.runtimeClassName"}) ||
		strings.Contains(p.Detail, "--refuse-secrets") {
		t.Errorf("runtimeClassName alone: %s %s", r.Status, b)
	}
}

// "*" refuses in every namespace, and a rerun is checked again: a task
// stored before the operator refused Secrets is not run again with them.
func TestRefuseSecretsEverywhereAndOnRerun(t *testing.T) {
	st := store.NewMemory()
	before := newHarnessOn(t, st, nil)
	tk := before.mustSubmit("team-b", secretsDoc)
	before.finish(tk.ID, "Succeeded", "Completed")

	h := newHarnessOn(t, st, func(c *server.Config) { c.PodPolicy = server.PodPolicy{RefuseSecrets: []string{server.EveryNamespace}} })
	r, b := h.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/rerun", nil)
	if r.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(b), "--refuse-secrets") || strings.Contains(string(b), "runtimeClassName") {
		t.Fatalf("rerun of a task naming Secrets: %s %s, want 422 naming --refuse-secrets only", r.Status, b)
	}
	if r, b := postYAML(h, "team-c", secretsDoc); r.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("team-c under \"*\": %s %s, want 422", r.Status, b)
	}
}
