package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// deployDir is the directory of the manifests, from this package's directory.
const deployDir = "../../../deploy"

// build runs kustomize, as `kubectl apply -k` does, in a file system that
// holds deploy/ (with its layouts base/, namespaced/, cluster-wide/) as
// /deploy and the files of extra (path: content): on /deploy itself (the
// default layout), on a layout of it, or on an overlay (root "/overlay"
// with an extra["/overlay/kustomization.yaml"] that names ../deploy/base,
// say). It returns the objects built.
func build(t *testing.T, root string, extra map[string]string) []*unstructured.Unstructured {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	err := filepath.WalkDir(deployDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(deployDir, path)
		if err != nil {
			return err
		}
		return fs.WriteFile("/deploy/"+filepath.ToSlash(rel), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	for path, content := range extra {
		if err := fs.WriteFile(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, root)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", root, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// overlay is deploy/ moved into test namespaces, as docs/deploy.md tells an
// operator to do it: the service (deploy/base) in namespace Namespace and,
// with a Suffix, every object renamed (cluster-scoped ones included, so that
// tests do not share ClusterRoles).
//
// With TaskNamespaces it is the default layout (namespaced/): the service's
// layer, a task-namespaces.yaml of its own (the list and a RoleBinding of
// kubetask-tasks in each) and the component namespaces-flag that hands the
// list to serve, as the doc's prod overlay. Without, it is the cluster-wide
// overlay moved into Namespace.
type overlay struct {
	Namespace, Suffix string
	TaskNamespaces    []string
	// Image, when set, replaces the Deployment's image (NAME:TAG), as the
	// doc's `kustomize edit set image` does.
	Image string
}

// build builds the overlay.
func (o overlay) build(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	suffix := ""
	if o.Suffix != "" {
		suffix = fmt.Sprintf("nameSuffix: %q\n", "-"+o.Suffix) // quoted: "-24567" unquoted is a YAML number
	}
	if name, tag, ok := strings.Cut(o.Image, ":"); ok {
		suffix += "images: [{name: ghcr.io/kubetask/kubetask, newName: " + name + ", newTag: " + tag + "}]\n"
	}
	const head = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
	if len(o.TaskNamespaces) == 0 {
		return build(t, "/overlay", map[string]string{"/overlay/kustomization.yaml": head +
			"resources: [../deploy/cluster-wide]\nnamespace: " + o.Namespace + "\n" + suffix})
	}
	return build(t, "/overlay", map[string]string{
		"/service/kustomization.yaml":   head + "resources: [../deploy/base]\nnamespace: " + o.Namespace + "\n" + suffix,
		"/overlay/kustomization.yaml":   head + "resources: [../service, task-namespaces.yaml]\ncomponents: [../deploy/namespaced/namespaces-flag]\n",
		"/overlay/task-namespaces.yaml": taskNamespaces(o.TaskNamespaces, o.Namespace),
	})
}

// TestOverlayTakesADigitSuffix: a suffix of digits alone (rand.String
// draws one now and then: CI on 64e0189 failed "cannot unmarshal number into
// Go struct field Kustomization.nameSuffix") renames the objects as any.
func TestOverlayTakesADigitSuffix(t *testing.T) {
	for _, o := range []overlay{{Namespace: "svc", Suffix: "24567"}, {Namespace: "svc", Suffix: "24567", TaskNamespaces: []string{"a"}}} {
		for _, obj := range o.build(t) {
			if obj.GetKind() == "Deployment" && !strings.HasSuffix(obj.GetName(), "-24567") {
				t.Errorf("the Deployment is %s, want a name ending in -24567", obj.GetName())
			}
		}
	}
}

// taskNamespaces is a task-namespaces.yaml (deploy/namespaced/) for the task
// namespaces nss of a service in namespace svc: the list, and a RoleBinding
// of kubetask-tasks in each.
func taskNamespaces(nss []string, svc string) string {
	s := fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: kubetask-task-namespaces
  annotations: {config.kubernetes.io/local-config: "true"}
data: {namespaces: %q}
`, strings.Join(nss, ","))
	for _, ns := range nss {
		s += fmt.Sprintf(`---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: kubetask-tasks, namespace: %s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kubetask-tasks}
subjects: [{kind: ServiceAccount, name: kubetask, namespace: %s}]
`, ns, svc)
	}
	return s
}

// find returns the object of kind whose name starts with prefix, failing
// when there is none or more than one.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, prefix string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && strings.HasPrefix(o.GetName(), prefix) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s named %s*, want 1", len(found), kind, prefix)
	}
	return found[0]
}

// into converts an object to its typed form.
func into[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &v); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return &v
}

// applier applies objects with server-side apply through the dynamic client.
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newApplier(t *testing.T, cfg *rest.Config) *applier {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

// resource returns the client of o's resource (in o's namespace when it is
// namespaced).
func (a *applier) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return a.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), nil
	}
	return a.dyn.Resource(m.Resource), nil
}

// apply applies o (server-side apply; with dryRun the API server defaults,
// validates and admits it and stores nothing) and returns the object the
// API server answered.
func (a *applier) apply(ctx context.Context, o *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
	ri, err := a.resource(o)
	if err != nil {
		return nil, err
	}
	opts := metav1.ApplyOptions{FieldManager: "kubetask-deploy-test", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return ri.Apply(ctx, o.GetName(), o, opts)
}

// The kustomization builds as `kubectl apply -k deploy/` builds it, holds
// what a platform team needs, and the API server accepts every object
// (server-side apply, dry run) of both layouts, the default (namespaced) and
// the cluster-wide overlay, moved into namespaces of the test cluster.
func TestManifestsApplyServerSideDryRun(t *testing.T) {
	for root, layout := range map[string]string{"/deploy": "default", "/deploy/namespaced": "default", "/deploy/cluster-wide": "cluster-wide"} {
		objs := build(t, root, nil)
		var kinds []string
		for _, o := range objs {
			kinds = append(kinds, o.GetKind())
		}
		for _, want := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
			"Secret", "Deployment", "Service", "PodDisruptionBudget"} {
			if !slices.Contains(kinds, want) {
				t.Errorf("kustomize build %s: no %s (got %v)", root, want, kinds)
			}
		}
		for _, o := range objs {
			if o.GetKind() == "ClusterRoleBinding" || o.GetKind() == "RoleBinding" {
				b := into[rbacv1.ClusterRoleBinding](t, o) // a RoleBinding has the same fields
				if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != "kubetask" || b.Subjects[0].Namespace != "kubetask" {
					t.Errorf("%s: %s %s: subjects %+v, want the ServiceAccount kubetask/kubetask", root, o.GetKind(), o.GetName(), b.Subjects)
				}
			}
		}
		dep := into[appsv1.Deployment](t, find(t, objs, "Deployment", "kubetask"))
		checkDeployment(t, dep, "kubetask", "kubetask-store")
		_, confined := flagValues(dep.Spec.Template.Spec.Containers[0].Args)["namespaces"]
		if want := layout == "default"; confined != want {
			t.Errorf("%s: the Deployment passes --namespaces: %v, want %v", root, confined, want)
		}
	}

	env := clustertest.New(t)
	tasks := clustertest.New(t)
	a := newApplier(t, env.Config)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, o := range []overlay{{Namespace: env.Namespace, TaskNamespaces: []string{tasks.Namespace}}, {Namespace: env.Namespace}} {
		objs := o.build(t)
		for _, o := range objs {
			switch {
			case o.GetKind() == "Namespace":
				if o.GetName() != env.Namespace {
					t.Errorf("overlay: Namespace %s, want %s", o.GetName(), env.Namespace)
				}
			case o.GetKind() == "ClusterRoleBinding" || o.GetKind() == "RoleBinding":
				if b := into[rbacv1.ClusterRoleBinding](t, o); b.Subjects[0].Namespace != env.Namespace {
					t.Errorf("overlay: %s %s binds %s/%s, want the ServiceAccount in %s", o.GetKind(), o.GetName(),
						b.Subjects[0].Namespace, b.Subjects[0].Name, env.Namespace)
				}
			}
		}
		for _, o := range objs {
			got, err := a.apply(ctx, o, true)
			if err != nil {
				t.Errorf("server-side apply (dry run) of %s %s: %v", o.GetKind(), o.GetName(), err)
				continue
			}
			if got.GetKind() != o.GetKind() || got.GetName() != o.GetName() {
				t.Errorf("server-side apply (dry run) of %s %s answered %s %s", o.GetKind(), o.GetName(), got.GetKind(), got.GetName())
			}
		}
		// Dry run stored nothing.
		for _, o := range objs {
			if o.GetKind() == "Namespace" {
				continue
			}
			ri, err := a.resource(o)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{}); err == nil {
				t.Errorf("%s %s exists after a dry run", o.GetKind(), o.GetName())
			}
		}
	}
}

// checkDeployment checks what the Deployment must hold for serve to run as
// docs/deploy.md says: two replicas of `kubetask serve` under the
// ServiceAccount sa, the PostgreSQL URL read from a file of the Secret
// secret, probes on the served port, and its namespace as POD_NAMESPACE.
func checkDeployment(t *testing.T, d *appsv1.Deployment, sa, secret string) {
	t.Helper()
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("Deployment: replicas %v, want 2", d.Spec.Replicas)
	}
	spec := d.Spec.Template.Spec
	if spec.ServiceAccountName != sa {
		t.Errorf("Deployment: serviceAccountName %q, want %q", spec.ServiceAccountName, sa)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("Deployment: %d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	args := flagValues(c.Args)
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Errorf("Deployment: args %q, want serve first", c.Args)
	}
	if args["store"] != "postgres" {
		t.Errorf("Deployment: --store %q, want postgres", args["store"])
	}
	urlFile := args["store-url-file"]
	if !mountedFromSecret(spec, c, urlFile, secret) {
		t.Errorf("Deployment: --store-url-file %q is not a file of the Secret %s mounted into the container", urlFile, secret)
	}
	for _, f := range []string{"tls-cert-file", "tls-key-file"} {
		if !mountedFromSecret(spec, c, args[f], "kubetask-tls") {
			t.Errorf("Deployment: --%s %q is not a file of the Secret kubetask-tls mounted into the container", f, args[f])
		}
	}
	if args["auth"] != "kubernetes" {
		t.Errorf("Deployment: --auth %q, want kubernetes (rbac-auth.yaml grants the reviews it needs)", args["auth"])
	}
	_, port, _ := strings.Cut(args["listen"], ":")
	var portName string
	for _, p := range c.Ports {
		if fmt.Sprint(p.ContainerPort) == port {
			portName = p.Name
		}
	}
	if portName == "" {
		t.Errorf("Deployment: no container port for --listen %q", args["listen"])
	}
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := map[string]string{"liveness": "/healthz", "readiness": "/readyz"}[name]
		switch {
		case probe == nil || probe.HTTPGet == nil:
			t.Errorf("Deployment: no HTTP %s probe", name)
		case probe.HTTPGet.Path != want || probe.HTTPGet.Port.String() != portName || probe.HTTPGet.Scheme != corev1.URISchemeHTTPS:
			t.Errorf("Deployment: %s probe %s %s port %s, want HTTPS %s on port %q", name, probe.HTTPGet.Scheme, probe.HTTPGet.Path, probe.HTTPGet.Port.String(), want, portName)
		}
	}
	podNS := false
	for _, e := range c.Env {
		if e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace" {
			podNS = true
		}
	}
	if !podNS {
		t.Error("Deployment: POD_NAMESPACE is not the pod's namespace (downward API): serve's Leases would not be in its own namespace")
	}
	if ln, ok := args["lease-namespace"]; ok && ln != "$(POD_NAMESPACE)" {
		t.Errorf("Deployment: --lease-namespace %q, want $(POD_NAMESPACE): rbac-leases.yaml grants Leases in the pod's namespace only", ln)
	}
}

// containerVars returns what the kubelet expands $(VAR) with in the
// arguments of the Deployment's container: the literal values of its
// environment, and POD_NAMESPACE (the downward API) as podNamespace.
func containerVars(d *appsv1.Deployment, podNamespace string) map[string]string {
	vars := map[string]string{"POD_NAMESPACE": podNamespace}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			vars[e.Name] = e.Value
		}
	}
	return vars
}

// expand replaces each $(VAR) of s as the kubelet does.
func expand(s string, vars map[string]string) string {
	for k, v := range vars {
		s = strings.ReplaceAll(s, "$("+k+")", v)
	}
	return s
}

// flagValues maps the --name=value arguments of args to their values.
func flagValues(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "--"); ok {
			k, v, _ := strings.Cut(name, "=")
			m[k] = v
		}
	}
	return m
}

// mountedFromSecret reports whether path, in container c of spec, is a file
// of the Secret secret (a secret volume or a projected one).
func mountedFromSecret(spec corev1.PodSpec, c corev1.Container, path, secret string) bool {
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			switch {
			case v.Secret != nil:
				return v.Secret.SecretName == secret && hasItem(v.Secret.Items, rel)
			case v.Projected != nil:
				for _, s := range v.Projected.Sources {
					if s.Secret != nil && s.Secret.Name == secret && hasItem(s.Secret.Items, rel) {
						return true
					}
				}
			}
		}
	}
	return false
}

// hasItem reports whether a secret volume with items shows the file path
// (any key's file when there are no items).
func hasItem(items []corev1.KeyToPath, path string) bool {
	if len(items) == 0 {
		return !strings.Contains(path, "/")
	}
	for _, it := range items {
		if it.Path == path {
			return true
		}
	}
	return false
}
