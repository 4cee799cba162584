package deploy

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// deployed is the RBAC of a layout of deploy/ applied for real into test
// namespaces (an overlay): the ServiceAccount, a token of it and a
// kubeconfig that uses that token (and nothing of the admin's).
type deployed struct {
	objs       []*unstructured.Unstructured // every object the overlay builds
	sa         string
	token      string
	kubeconfig string
	suffix     string
}

// rbacKinds are the objects of deploy/ that the tests create for real.
var rbacKinds = map[string]bool{"ServiceAccount": true, "ClusterRole": true, "ClusterRoleBinding": true, "Role": true, "RoleBinding": true}

// deployOverlay applies o's ServiceAccount, roles and bindings (the service
// in env's namespace, cluster-scoped objects renamed with a suffix, deleted
// when the test ends; o's namespace and suffix are set here), waits until
// the API server's authorizer grants every rule to the ServiceAccount where
// its binding grants it, and mints it a token.
func deployOverlay(t *testing.T, env *clustertest.Env, o overlay) *deployed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := &deployed{suffix: utilrand.String(5)}
	o.Namespace, o.Suffix = env.Namespace, d.suffix
	d.objs = o.build(t)
	a := newApplier(t, env.Config)
	roles := map[string][]rbacv1.PolicyRule{} // "Kind/name" (a Role's in env's namespace)
	type grant struct{ role, ns string }      // a binding: its role, where it grants (all: "")
	var grants []grant
	for _, o := range d.objs {
		if !rbacKinds[o.GetKind()] {
			continue
		}
		if _, err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		if o.GetNamespace() == "" {
			o := o
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if ri, err := a.resource(o); err == nil {
					_ = ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{})
				}
			})
		}
		switch o.GetKind() {
		case "ServiceAccount":
			d.sa = o.GetName()
		case "ClusterRole":
			roles["ClusterRole/"+o.GetName()] = into[rbacv1.ClusterRole](t, o).Rules
		case "Role":
			roles["Role/"+o.GetName()] = into[rbacv1.Role](t, o).Rules
		case "ClusterRoleBinding", "RoleBinding":
			b := into[rbacv1.RoleBinding](t, o)
			grants = append(grants, grant{b.RoleRef.Kind + "/" + b.RoleRef.Name, o.GetNamespace()})
		}
	}
	if d.sa == "" || len(grants) == 0 {
		t.Fatalf("deploy/ has no ServiceAccount or no bindings (ServiceAccount %q, %d bindings)", d.sa, len(grants))
	}
	var checks []authorizationv1.ResourceAttributes
	for _, g := range grants {
		ns := g.ns
		if ns == "" {
			ns = metav1.NamespaceDefault // granted everywhere: checked where the service does not live
		}
		for _, r := range roles[g.role] {
			for _, verb := range r.Verbs {
				for _, res := range r.Resources {
					resource, sub, _ := strings.Cut(res, "/")
					checks = append(checks, authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: r.APIGroups[0], Resource: resource, Subresource: sub})
				}
			}
		}
	}
	user := "system:serviceaccount:" + env.Namespace + ":" + d.sa
	eventually(t, 30*time.Second, "the deployed roles to be in force", func() bool {
		for _, c := range checks {
			if !allowed(ctx, t, env.Client, user, c) {
				return false
			}
		}
		return true
	})
	d.token = token(ctx, t, env, d.sa)
	d.kubeconfig = writeKubeconfig(t, env, d.token)
	return d
}

// allowed asks the API server whether user may do ra.
func allowed(ctx context.Context, t *testing.T, cs kubernetes.Interface, user string, ra authorizationv1.ResourceAttributes) bool {
	t.Helper()
	sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"}, ResourceAttributes: &ra},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return sar.Status.Allowed
}

// token mints a token of the ServiceAccount sa of env's namespace.
func token(ctx context.Context, t *testing.T, env *clustertest.Env, sa string) string {
	t.Helper()
	exp := int64(3600)
	tr, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).CreateToken(ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s: %v", sa, err)
	}
	return tr.Status.Token
}

// writeKubeconfig writes a kubeconfig for env's cluster that authenticates
// with token only, its namespace env's (as POD_NAMESPACE makes it in a pod).
func writeKubeconfig(t *testing.T, env *clustertest.Env, token string) string {
	t.Helper()
	ca := env.Cluster.CAData()
	if len(ca) == 0 {
		t.Fatal("the test cluster has no CA certificate")
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: ca}
	cfg.AuthInfos["kubetask"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubetask"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "kubetask", Namespace: env.Namespace}
	cfg.CurrentContext = "kubetask"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// clientFor returns a clientset that uses kubeconfig.
func clientFor(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// caller makes a ServiceAccount of env's namespace that may use kubetask
// serve's API for tasks in every namespace (in --auth kubernetes, the pod
// permissions of docs/serve.md) and returns its token.
func caller(t *testing.T, env *clustertest.Env, suffix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "task-user-" + suffix
	rbac := env.Client.RbacV1()
	if _, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: env.Namespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
	user := "system:serviceaccount:" + env.Namespace + ":" + name
	eventually(t, 30*time.Second, "the caller's role to be in force", func() bool {
		return allowed(ctx, t, env.Client, user, authorizationv1.ResourceAttributes{Namespace: metav1.NamespaceDefault, Verb: "create", Resource: "pods"})
	})
	return token(ctx, t, env, name)
}

// Outside the deployed roles of the default layout the ServiceAccount's
// token is refused with 403, while what the roles grant is allowed: pods in
// the task namespace, never in kube-system, in its own namespace (where the
// store Secret is) or cluster-wide.
func TestActionOutsideRoleIsRefused(t *testing.T) {
	env := clustertest.New(t)
	tasks := clustertest.New(t)
	d := deployOverlay(t, env, overlay{TaskNamespaces: []string{tasks.Namespace}})
	cs := clientFor(t, d.kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := env.Client.CoreV1().Secrets(env.Namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "precious"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1.37"}}}}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	// What the roles grant (a control: the token and the bindings work).
	for what, do := range map[string]func() error{
		"list pods in the task namespace": func() error {
			_, err := cs.CoreV1().Pods(tasks.Namespace).List(ctx, metav1.ListOptions{})
			return err
		},
		"create a pod (dry run) in the task namespace": func() error {
			_, err := cs.CoreV1().Pods(tasks.Namespace).Create(ctx, pod, dryRun)
			return err
		},
		"list Leases in its namespace": func() error {
			_, err := cs.CoordinationV1().Leases(env.Namespace).List(ctx, metav1.ListOptions{})
			return err
		},
		"get the task namespace (its Pod Security labels)": func() error {
			_, err := cs.CoreV1().Namespaces().Get(ctx, tasks.Namespace, metav1.GetOptions{})
			return err
		},
		"create a TokenReview": func() error {
			_, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "x"}}, metav1.CreateOptions{})
			return err
		},
	} {
		if err := do(); err != nil {
			t.Errorf("%s: %v, want it allowed", what, err)
		}
	}

	// What they do not.
	for what, do := range map[string]func() error{
		"list pods in every namespace": func() error {
			_, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			return err
		},
		"create a pod (dry run) in kube-system": func() error {
			_, err := cs.CoreV1().Pods(metav1.NamespaceSystem).Create(ctx, pod, dryRun)
			return err
		},
		"create a pod (dry run) in its own namespace": func() error {
			_, err := cs.CoreV1().Pods(env.Namespace).Create(ctx, pod, dryRun)
			return err
		},
		"read a pod's log in its own namespace": func() error {
			return cs.CoreV1().Pods(env.Namespace).GetLogs("p", &corev1.PodLogOptions{}).Do(ctx).Error()
		},
		"get its own namespace": func() error {
			_, err := cs.CoreV1().Namespaces().Get(ctx, env.Namespace, metav1.GetOptions{})
			return err
		},
		"delete a Secret in its own namespace": func() error {
			return cs.CoreV1().Secrets(env.Namespace).Delete(ctx, "precious", metav1.DeleteOptions{})
		},
		"read a Secret in its own namespace": func() error {
			_, err := cs.CoreV1().Secrets(env.Namespace).Get(ctx, "precious", metav1.GetOptions{})
			return err
		},
		"create a Deployment": func() error {
			_, err := cs.AppsV1().Deployments(env.Namespace).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d"}}, dryRun)
			return err
		},
		"list nodes": func() error {
			_, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			return err
		},
		"list namespaces": func() error {
			_, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
			return err
		},
		"list Leases outside its namespace": func() error {
			_, err := cs.CoordinationV1().Leases(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
			return err
		},
		"update a pod's status": func() error {
			_, err := cs.CoreV1().Pods(env.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
			return err
		},
		"evict a pod": func() error {
			return cs.CoreV1().Pods(env.Namespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: env.Namespace}})
		},
		"mint a ServiceAccount token": func() error {
			_, err := cs.CoreV1().ServiceAccounts(env.Namespace).CreateToken(ctx, d.sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
			return err
		},
		"bind itself a role": func() error {
			_, err := cs.RbacV1().RoleBindings(env.Namespace).Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "escalate"},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: d.sa, Namespace: env.Namespace}},
			}, metav1.CreateOptions{})
			return err
		},
		"watch events": func() error {
			_, err := cs.CoreV1().Events("").Watch(ctx, metav1.ListOptions{})
			return err
		},
	} {
		if err := do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want 403 Forbidden", what, err)
		}
	}
	if _, err := env.Client.CoreV1().Secrets(env.Namespace).Get(ctx, "precious", metav1.GetOptions{}); err != nil {
		t.Errorf("the Secret is gone: %v", err)
	}
}
