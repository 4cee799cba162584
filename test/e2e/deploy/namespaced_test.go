package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/client"
)

// docBlocks returns the YAML code blocks of docs/deploy.md whose first line
// is a comment naming a file ("# overlays/prod/kustomization.yaml ..."), by
// that file's path.
func docBlocks(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "..", "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blocks := map[string]string{}
	var name string
	var b strings.Builder
	inBlock, first := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !inBlock && line == "```yaml":
			inBlock, first, name = true, true, ""
			b.Reset()
		case inBlock && line == "```":
			inBlock = false
			if name != "" {
				blocks[name] = b.String()
			}
		case inBlock:
			if first {
				first = false
				if rest, ok := strings.CutPrefix(line, "# "); ok && strings.HasPrefix(rest, "overlays/") {
					name, _, _ = strings.Cut(rest, ":")
					name, _, _ = strings.Cut(name, " ")
				}
			}
			b.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks
}

// The overlays of docs/deploy.md build and do what the text says: prod moves
// the service into platform-tasks and confines tasks to etl and ml (a
// RoleBinding of kubetask-tasks in each, --namespaces of the same list, no
// cluster-wide binding of it, nothing left in kubetask); anywhere moves the
// cluster-wide overlay into platform-tasks.
func TestDocOverlays(t *testing.T) {
	blocks := docBlocks(t)
	files := map[string]string{}
	for name, content := range blocks {
		files["/"+name] = content
	}
	for _, want := range []string{"/overlays/prod/kustomization.yaml", "/overlays/prod/service/kustomization.yaml",
		"/overlays/prod/task-namespaces.yaml", "/overlays/anywhere/kustomization.yaml"} {
		if files[want] == "" {
			t.Fatalf("docs/deploy.md has no block %s (found %v)", want, slices.Sorted(maps.Keys(files)))
		}
	}

	objs := build(t, "/overlays/prod", files)
	bound := map[string]bool{}
	for _, o := range objs {
		if k := o.GetKind(); k == "ClusterRoleBinding" || k == "RoleBinding" {
			b := into[rbacv1.RoleBinding](t, o)
			if s := b.Subjects[0]; s.Name != "kubetask" || s.Namespace != "platform-tasks" {
				t.Errorf("prod overlay: %s %s/%s binds %s/%s, want the ServiceAccount platform-tasks/kubetask", k, o.GetNamespace(), o.GetName(), s.Namespace, s.Name)
			}
			if k == "ClusterRoleBinding" && b.RoleRef.Name == "kubetask-tasks" {
				t.Errorf("prod overlay: the ClusterRoleBinding %s grants kubetask-tasks cluster-wide", o.GetName())
			}
			bound[o.GetNamespace()+":"+b.RoleRef.Name] = true
			continue
		}
		if ns := o.GetNamespace(); ns != "" && ns != "platform-tasks" {
			t.Errorf("prod overlay: %s %s in namespace %s", o.GetKind(), o.GetName(), ns)
		}
	}
	for _, want := range []string{"etl:kubetask-tasks", "ml:kubetask-tasks", "platform-tasks:kubetask-leases", ":kubetask-auth"} {
		if !bound[want] {
			t.Errorf("prod overlay: no binding %s (got %v)", want, bound)
		}
	}
	if bound["platform-tasks:kubetask-tasks"] || bound[":kubetask-tasks"] {
		t.Errorf("prod overlay: kubetask-tasks bound in the service's namespace or cluster-wide (got %v)", bound)
	}
	dep := into[appsv1.Deployment](t, find(t, objs, "Deployment", "kubetask"))
	if got := expand(flagValues(dep.Spec.Template.Spec.Containers[0].Args)["namespaces"], containerVars(dep, "platform-tasks")); got != "etl,ml" {
		t.Errorf("prod overlay: --namespaces %q, want etl,ml", got)
	}

	for _, o := range build(t, "/overlays/anywhere", files) {
		if ns := o.GetNamespace(); ns != "" && ns != "platform-tasks" {
			t.Errorf("anywhere overlay: %s %s in namespace %s", o.GetKind(), o.GetName(), ns)
		}
		if k := o.GetKind(); k == "ClusterRoleBinding" || k == "RoleBinding" {
			if s := into[rbacv1.RoleBinding](t, o).Subjects[0]; s.Namespace != "platform-tasks" {
				t.Errorf("anywhere overlay: %s %s binds %s/%s", k, o.GetName(), s.Namespace, s.Name)
			}
		}
		if o.GetKind() == "Deployment" {
			if _, ok := flagValues(into[appsv1.Deployment](t, o).Spec.Template.Spec.Containers[0].Args)["namespaces"]; ok {
				t.Error("anywhere overlay: the Deployment passes --namespaces")
			}
		}
	}
}

// The default layout applied for real, the service in one namespace and
// tasks in another: the ServiceAccount may touch pods in the task namespace
// only, and `kubetask serve` run with the Deployment's own --namespaces
// (from the list) runs a task there without a Forbidden. A submission to a
// namespace not listed (kube-system, the service's own, any other) is a 422
// at once that names the namespace, the namespaces served and how to add
// one, before anything is asked of the API server there.
func TestServeConfinedToNamespace(t *testing.T) {
	env := clustertest.New(t)
	tasks := clustertest.New(t)
	d := deployOverlay(t, env, overlay{TaskNamespaces: []string{tasks.Namespace}})
	// The task namespace gets the labels of the default install's own
	// (kubetask-tasks: its Pod Security level), so that the task runs as it
	// would there.
	var labels map[string]string
	for _, o := range build(t, "/deploy", nil) {
		if o.GetKind() == "Namespace" && o.GetName() == "kubetask-tasks" {
			labels = o.GetLabels()
		}
	}
	if labels["pod-security.kubernetes.io/enforce"] == "" {
		t.Fatalf("the default layout's task namespace kubetask-tasks has no Pod Security level (labels %v)", labels)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), time.Minute)
	defer pcancel()
	if _, err := env.Client.CoreV1().Namespaces().Patch(pctx, tasks.Namespace, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, o := range d.objs {
		if o.GetKind() == "ClusterRoleBinding" && into[rbacv1.ClusterRoleBinding](t, o).RoleRef.Name == "kubetask-tasks-"+d.suffix {
			t.Fatalf("the default layout binds kubetask-tasks cluster-wide (%s)", o.GetName())
		}
	}
	dep := into[appsv1.Deployment](t, find(t, d.objs, "Deployment", "kubetask"))
	namespaces := expand(flagValues(dep.Spec.Template.Spec.Containers[0].Args)["namespaces"], containerVars(dep, env.Namespace))
	if namespaces != tasks.Namespace {
		t.Fatalf("the Deployment's --namespaces is %q, want the task namespace %s", namespaces, tasks.Namespace)
	}
	cs := clientFor(t, d.kubeconfig)
	lctx, lcancel := context.WithTimeout(context.Background(), time.Minute)
	defer lcancel()
	for _, ns := range []string{metav1.NamespaceDefault, metav1.NamespaceAll, metav1.NamespaceSystem, env.Namespace} {
		if _, err := cs.CoreV1().Pods(ns).List(lctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("listing pods in namespace %q: %v, want 403 Forbidden", ns, err)
		}
	}

	callerToken := caller(t, env, d.suffix)
	dir := t.TempDir()
	certFile, keyFile, certPEM := selfSignedCert(t, dir)
	s := startServe(t, certPEM, nil, "serve", "--kubeconfig", d.kubeconfig, "--namespaces", namespaces,
		"--listen", "127.0.0.1:0", "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--auth", "kubernetes", "--store", "sqlite", "--state-dir", filepath.Join(dir, "state"),
		"--instance-id", "deploy-"+d.suffix)
	c, err := client.New(s.url, client.WithToken(callerToken), client.WithCA(certPEM))
	if err != nil {
		t.Fatal(err)
	}
	// The task's own deadline, from its submission: a minute shared with the
	// set-up above ran out on a busy machine before the task was submitted
	// (the first startServe of the test binary builds kubetask: 79 s there).
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	runSidecarTask(s.failFast(ctx, t), t, c, tasks.Namespace)
	for _, line := range s.forbidden() {
		t.Errorf("the service met a permission it does not have: %s", line)
	}
	// A submission elsewhere is refused at once with a 422 that names the
	// namespace, where tasks run and how to add a namespace, before anything
	// is asked of the API server there (where the role forbids everything).
	for _, ns := range []string{"not-listed-" + d.suffix, metav1.NamespaceSystem, env.Namespace} {
		_, _, err = c.Submit(ctx, ns, []byte(sidecarTask), client.SubmitOptions{})
		if !client.IsInvalid(err) {
			t.Errorf("submit to namespace %s, not listed: %v, want 422", ns, err)
			continue
		}
		for _, want := range []string{`"` + ns + `"`, tasks.Namespace, "task-namespaces.yaml", "--namespaces", "RoleBinding"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("submit to namespace %s, not listed: %q does not say %q", ns, err, want)
			}
		}
	}
	for _, line := range s.forbidden() {
		t.Errorf("the refused submission met a permission the service does not have: %s", line)
	}
}

// The list and the RoleBindings must agree (deploy/namespaced/
// task-namespaces.yaml): a namespace listed without its RoleBinding is not
// served in silence. `kubetask serve` with the Deployment's --namespaces
// plus a namespace where kubetask-tasks is not bound logs the Forbidden of
// its pod informer there, naming the namespace, and does not become ready
// (so the Deployment's readiness probe keeps it out of the Service).
func TestListedNamespaceWithoutRoleBindingIsNotReady(t *testing.T) {
	env := clustertest.New(t)
	tasks := clustertest.New(t)
	unbound := clustertest.New(t)
	d := deployOverlay(t, env, overlay{TaskNamespaces: []string{tasks.Namespace}})
	dir := t.TempDir()
	certFile, keyFile, certPEM := selfSignedCert(t, dir)
	s := startServeUnready(t, certPEM, nil, "serve", "--kubeconfig", d.kubeconfig, "--namespaces", tasks.Namespace+","+unbound.Namespace,
		"--listen", "127.0.0.1:0", "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--auth", "kubernetes", "--store", "sqlite", "--state-dir", filepath.Join(dir, "state"),
		"--instance-id", "deploy-"+d.suffix)
	eventually(t, time.Minute, "the service to log the Forbidden of namespace "+unbound.Namespace, func() bool {
		return slices.ContainsFunc(s.forbidden(), func(line string) bool { return strings.Contains(line, unbound.Namespace) })
	})
	if got := s.status(t, "/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz with a namespace listed but not bound: %d, want 503", got)
	}
	for _, line := range s.forbidden() {
		if !strings.Contains(line, unbound.Namespace) {
			t.Errorf("a Forbidden outside the namespace without a RoleBinding: %s", line)
		}
	}
}
