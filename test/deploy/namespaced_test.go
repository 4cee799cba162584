package deploy

import (
	"bufio"
	"context"
	"maps"
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

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/client"
)

// docBlocks returns the YAML code blocks of docs/deploy.md whose first line
// is a comment naming a file ("# overlays/prod/kustomization.yaml ..."), by
// that file's path.
func docBlocks(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "deploy.md"))
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
// everything into its namespace; namespaced drops the cluster-wide binding
// of the task-pod role, binds it in etl and ml, and passes --namespaces.
func TestDocOverlays(t *testing.T) {
	blocks := docBlocks(t)
	files := map[string]string{}
	for name, content := range blocks {
		files["/"+name] = content
	}
	for _, want := range []string{"/overlays/prod/kustomization.yaml", "/overlays/namespaced/kustomization.yaml", "/overlays/namespaced/rolebindings.yaml"} {
		if files[want] == "" {
			t.Fatalf("docs/deploy.md has no block %s (found %v)", want, slices.Sorted(maps.Keys(files)))
		}
	}

	for _, o := range build(t, "/overlays/prod", files) {
		if ns := o.GetNamespace(); ns != "" && ns != "platform-tasks" {
			t.Errorf("prod overlay: %s %s in namespace %s", o.GetKind(), o.GetName(), ns)
		}
		if k := o.GetKind(); k == "ClusterRoleBinding" || k == "RoleBinding" {
			if s := into[rbacv1.RoleBinding](t, o).Subjects[0]; s.Namespace != "platform-tasks" {
				t.Errorf("prod overlay: %s %s binds %s/%s", k, o.GetName(), s.Namespace, s.Name)
			}
		}
	}

	objs := build(t, "/overlays/namespaced", files)
	bound := map[string]bool{}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRoleBinding":
			b := into[rbacv1.ClusterRoleBinding](t, o)
			if b.RoleRef.Name == "kubetask-tasks" {
				t.Errorf("namespaced overlay: the ClusterRoleBinding %s still grants kubetask-tasks cluster-wide", o.GetName())
			}
			bound["cluster:"+b.RoleRef.Name] = true
		case "RoleBinding":
			b := into[rbacv1.RoleBinding](t, o)
			if s := b.Subjects[0]; s.Name != "kubetask" || s.Namespace != "kubetask" {
				t.Errorf("namespaced overlay: RoleBinding %s/%s binds %s/%s, want the ServiceAccount kubetask/kubetask", o.GetNamespace(), o.GetName(), s.Namespace, s.Name)
			}
			bound[o.GetNamespace()+":"+b.RoleRef.Name] = true
		}
	}
	for _, want := range []string{"etl:kubetask-tasks", "ml:kubetask-tasks", "kubetask:kubetask-leases", "cluster:kubetask-auth"} {
		if !bound[want] {
			t.Errorf("namespaced overlay: no binding %s (got %v)", want, bound)
		}
	}
	dep := into[appsv1.Deployment](t, find(t, objs, "Deployment", "kubetask"))
	if got := flagValues(dep.Spec.Template.Spec.Containers[0].Args)["namespaces"]; got != "etl,ml" {
		t.Errorf("namespaced overlay: --namespaces %q, want etl,ml", got)
	}
}

// The namespaced overlay's shape, applied for real: the task-pod role bound
// in one namespace only, serve started with --namespaces of it. A task runs
// to the end there, and the ServiceAccount may not touch pods elsewhere.
func TestServeConfinedToNamespace(t *testing.T) {
	env := clustertest.New(t)
	d := deployOverlay(t, env, overlay{
		Files: map[string]string{"rolebinding.yaml": `apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: kubetask-tasks}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kubetask-tasks}
subjects: [{kind: ServiceAccount, name: kubetask}]
`},
		More: `patches:
  - target: {kind: ClusterRoleBinding, name: kubetask-tasks}
    patch: |
      $patch: delete
      apiVersion: rbac.authorization.k8s.io/v1
      kind: ClusterRoleBinding
      metadata: {name: kubetask-tasks}
`,
	})
	for _, o := range d.objs {
		if o.GetKind() == "ClusterRoleBinding" && strings.HasPrefix(o.GetName(), "kubetask-tasks") {
			t.Fatalf("the overlay kept the ClusterRoleBinding %s", o.GetName())
		}
	}
	cs := clientFor(t, d.kubeconfig)
	lctx, lcancel := context.WithTimeout(context.Background(), time.Minute)
	defer lcancel()
	for _, ns := range []string{metav1.NamespaceDefault, metav1.NamespaceAll} {
		if _, err := cs.CoreV1().Pods(ns).List(lctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("listing pods in namespace %q: %v, want 403 Forbidden", ns, err)
		}
	}

	callerToken := caller(t, env, d.suffix)
	dir := t.TempDir()
	certFile, keyFile, certPEM := selfSignedCert(t, dir)
	s := startServe(t, certPEM, nil, "serve", "--kubeconfig", d.kubeconfig, "--namespaces", env.Namespace,
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
	runSidecarTask(s.failFast(ctx, t), t, c, env.Namespace)
	for _, line := range s.forbidden() {
		t.Errorf("the service met a permission it does not have: %s", line)
	}
	// A submission elsewhere is refused. (The server first checks the task
	// with a server-side dry run there, which this role forbids: a warning
	// in the log, not a verdict.)
	if _, _, err := c.Submit(ctx, metav1.NamespaceDefault, []byte(sidecarTask), client.SubmitOptions{}); !client.IsInvalid(err) && !client.IsForbidden(err) {
		t.Errorf("submit to a namespace outside --namespaces: %v, want it refused", err)
	}
}
