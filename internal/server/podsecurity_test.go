package server_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
)

// escapeDoc is a pod that is root on its node: privileged, the host's
// network and PID namespaces, the node's file system mounted.
const escapeDoc = `apiVersion: v1
kind: Pod
metadata:
  name: escape
spec:
  nodeName: control-plane-1
  hostPID: true
  hostNetwork: true
  serviceAccountName: default
  tolerations: [{operator: Exists}]
  volumes:
  - name: root
    hostPath: {path: /}
  containers:
  - name: main
    image: busybox:1.37
    command: [chroot, /host, sh]
    securityContext: {privileged: true}
    volumeMounts: [{name: root, mountPath: /host}]
`

// restrictedDoc meets the restricted level.
const restrictedDoc = `apiVersion: v1
kind: Pod
metadata:
  name: tidy
spec:
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: main
    image: busybox:1.37
    command: [echo, hi]
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
`

func postYAML(h *harness, ns, doc string, hdr ...string) (*http.Response, []byte) {
	h.t.Helper()
	return h.do(http.MethodPost, api.Prefix+"/namespaces/"+ns+"/tasks", []byte(doc), append(hdr, "Content-Type", "application/yaml")...)
}

func locations(p api.Problem) []string {
	var out []string
	for _, e := range p.Errors {
		out = append(out, e.Location)
	}
	return out
}

// A submitter limited to team-a does not get kubetask to create a pod that
// escapes to its node: the default level (baseline) refuses it with a 422
// naming each field, the level and how to change it, and nothing is stored.
func TestPodSpecAbuseRefused(t *testing.T) {
	auth, err := server.NewTokenAuth([]server.Token{{Token: "a", Subject: "alice", Namespaces: server.Namespaces{"team-a"}}})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *server.Config) { c.Auth = auth })
	alice := []string{"Authorization", "Bearer a"}
	r, b := postYAML(h, "team-a", escapeDoc, alice...)
	if r.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("privileged host pod: %s %s, want 422", r.Status, b)
	}
	p := problemOf(t, b)
	locs := locations(p)
	for _, want := range []string{
		"body.spec.template.spec.hostNetwork", "body.spec.template.spec.hostPID",
		"body.spec.template.spec.containers[0].securityContext.privileged", "body.spec.template.spec.volumes[0].hostPath",
	} {
		if !slices.Contains(locs, want) {
			t.Errorf("no error at %s; got %v", want, locs)
		}
	}
	for _, want := range []string{`level "baseline"`, `namespace "team-a"`, "--namespace-pod-security team-a="} {
		if !strings.Contains(p.Detail, want) {
			t.Errorf("detail %q does not say %q", p.Detail, want)
		}
	}
	if n := h.exec.submits.Load(); n != 0 {
		t.Errorf("%d submissions reached the executor", n)
	}
	// A plain task still passes.
	h.mustSubmit("team-a", taskDoc("plain"), alice...)
}

// The level of each namespace: the configured one (default baseline, or the
// namespace's own), and the namespace's enforce label where it is stricter.
func TestPodSecurityLevels(t *testing.T) {
	for _, tc := range []struct {
		name      string
		policy    server.PodPolicy
		label     string // the namespace's pod-security.kubernetes.io/enforce
		doc       string
		wantCode  int
		wantInMsg string
	}{
		{name: "baseline default refuses host pod", doc: escapeDoc, wantCode: 422, wantInMsg: `level "baseline"`},
		{name: "baseline default accepts plain pod", doc: taskDoc("plain"), wantCode: 201},
		{name: "privileged namespace accepts host pod", policy: server.PodPolicy{NamespaceLevels: map[string]string{"team-a": "privileged"}}, doc: escapeDoc, wantCode: 201},
		{name: "privileged elsewhere does not apply", policy: server.PodPolicy{NamespaceLevels: map[string]string{"team-b": "privileged"}}, doc: escapeDoc, wantCode: 422},
		{name: "privileged default", policy: server.PodPolicy{Level: "privileged"}, doc: escapeDoc, wantCode: 201},
		{name: "restricted namespace refuses plain pod", policy: server.PodPolicy{NamespaceLevels: map[string]string{"team-a": "restricted"}}, doc: taskDoc("plain"), wantCode: 422, wantInMsg: "runAsNonRoot"},
		{name: "restricted namespace accepts restricted pod", policy: server.PodPolicy{Level: "restricted"}, doc: restrictedDoc, wantCode: 201},
		{name: "stricter label wins", label: "restricted", doc: taskDoc("plain"), wantCode: 422, wantInMsg: "pod-security.kubernetes.io/enforce=restricted"},
		{name: "laxer label does not", label: "privileged", doc: escapeDoc, wantCode: 422, wantInMsg: `level "baseline"`},
		{name: "label over privileged namespace", label: "baseline", policy: server.PodPolicy{NamespaceLevels: map[string]string{"team-a": "privileged"}}, doc: escapeDoc, wantCode: 422, wantInMsg: "kubectl label namespace team-a"},
		{name: "malformed label is restricted", label: "nonsense", doc: taskDoc("plain"), wantCode: 422, wantInMsg: `level "restricted" of namespace "team-a": allowPrivilegeEscalation != false, unrestricted capabilities, runAsNonRoot != true, seccompProfile; the level is the namespace's own label pod-security.kubernetes.io/enforce=nonsense`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *server.Config) { c.PodPolicy = tc.policy })
			if tc.label != "" {
				ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"pod-security.kubernetes.io/enforce": tc.label}}}
				if _, err := h.client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			r, b := postYAML(h, "team-a", tc.doc)
			if r.StatusCode != tc.wantCode {
				t.Fatalf("%s %s, want %d", r.Status, b, tc.wantCode)
			}
			if tc.wantInMsg != "" && !strings.Contains(problemOf(t, b).Detail, tc.wantInMsg) {
				t.Errorf("answer does not say %q: %s", tc.wantInMsg, b)
			}
		})
	}
}

func TestPodPolicyConfigErrors(t *testing.T) {
	h := newHarness(t, nil)
	for _, p := range []server.PodPolicy{{Level: "root"}, {NamespaceLevels: map[string]string{"a": "lax"}}} {
		_, err := server.New(server.Config{Executor: h.exec, Pager: pagerOf(h.store), PodPolicy: p})
		if err == nil || !strings.Contains(err.Error(), "must be privileged, baseline or restricted") {
			t.Errorf("%+v: %v", p, err)
		}
	}
}

// Which ServiceAccounts tasks may run as, per namespace.
func TestServiceAccountsRestricted(t *testing.T) {
	h := newHarness(t, func(c *server.Config) {
		c.PodPolicy = server.PodPolicy{ServiceAccounts: map[string][]string{"team-a": {"runner"}}}
	})
	withSA := func(sa string) string {
		return strings.Replace(taskDoc("job"), "    spec:\n", "    spec:\n      serviceAccountName: "+sa+"\n", 1)
	}
	r, b := postYAML(h, "team-a", withSA("deployer"))
	if r.StatusCode != 422 {
		t.Fatalf("%s %s", r.Status, b)
	}
	p := problemOf(t, b)
	if !slices.Contains(locations(p), "body.spec.template.spec.serviceAccountName") || !strings.Contains(p.Detail, `"runner"`) ||
		!strings.Contains(p.Detail, "--service-accounts team-a/deployer") {
		t.Errorf("refusal: %s", b)
	}
	if r, b := postYAML(h, "team-a", taskDoc("job")); r.StatusCode != 422 || !strings.Contains(string(b), `ServiceAccount \"default\"`) {
		t.Errorf("unset is default: %s %s", r.Status, b)
	}
	if r, b := postYAML(h, "team-a", withSA("runner")); r.StatusCode != 201 {
		t.Errorf("allowed: %s %s", r.Status, b)
	}
	if r, b := postYAML(h, "team-b", withSA("deployer")); r.StatusCode != 201 {
		t.Errorf("namespace not listed: %s %s", r.Status, b)
	}
}

// A rerun is checked again: the level may have been raised since.
func TestRerunCheckedAgain(t *testing.T) {
	h := newHarness(t, func(c *server.Config) {
		c.PodPolicy = server.PodPolicy{NamespaceLevels: map[string]string{"team-a": "privileged"}, LabelTTL: -1}
	})
	tk := h.mustSubmit("team-a", escapeDoc)
	h.finish(tk.ID, "Succeeded", "Completed")
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}}}
	if _, err := h.client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, b := h.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/rerun", nil)
	if r.StatusCode != 422 || !strings.Contains(string(b), "privileged") {
		t.Fatalf("rerun of a host pod under baseline: %s %s", r.Status, b)
	}
}

// A submission to a namespace the service does not run tasks in is refused
// up front with a 422 that names the namespaces and the fix, and nothing is
// asked of the API server (no dry run, no namespace read: the service may
// not be allowed there).
func TestSubmitOutsideNamespacesRefused(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Namespaces = []string{"etl", "ml"}; c.ValidateOnServer = true })
	r, b := postYAML(h, "kube-system", taskDoc("job"))
	if r.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("%s %s, want 422", r.Status, b)
	}
	p := problemOf(t, b)
	if !slices.Contains(locations(p), "path.ns") {
		t.Errorf("refusal without the location path.ns: %s", b)
	}
	// The namespace, those served, and how to add one (the list of deploy/'s
	// default layout, serve's flag, the RoleBinding).
	for _, want := range []string{`namespace "kube-system"`, "(etl, ml)", "deploy/namespaced/task-namespaces.yaml", "--namespaces", "RoleBinding of the ClusterRole kubetask-tasks"} {
		if !strings.Contains(p.Detail, want) {
			t.Errorf("refusal does not say %q: %s", want, p.Detail)
		}
	}
	if n := len(h.client.Actions()); n != 0 {
		t.Errorf("%d requests to the API server: %v", n, h.client.Actions())
	}
	if n := h.exec.submits.Load(); n != 0 {
		t.Errorf("%d submissions reached the executor", n)
	}
	h.mustSubmit("etl", taskDoc("job"))
}
