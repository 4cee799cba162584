package deploy

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// never are the namespaces no layout may list as task namespaces, beside the
// service's own (which holds the store Secret).
var never = []string{metav1.NamespaceSystem, metav1.NamespacePublic, "kube-node-lease"}

// dangerous are the task-pod permissions that must not reach a namespace
// that is not a task namespace: running a pod (which may mount the
// namespace's Secrets or run as its ServiceAccounts), exec into and the logs
// of its pods, deleting them.
var dangerous = []authorizationv1.ResourceAttributes{
	{Verb: "create", Resource: "pods"},
	{Verb: "delete", Resource: "pods"},
	{Verb: "patch", Resource: "pods"},
	{Verb: "list", Resource: "pods"},
	{Verb: "create", Resource: "pods", Subresource: "exec"},
	{Verb: "get", Resource: "pods", Subresource: "exec"},
	{Verb: "get", Resource: "pods", Subresource: "log"},
}

// what says ra's verb and resource ("create pods/exec").
func what(ra authorizationv1.ResourceAttributes) string {
	if ra.Subresource != "" {
		return ra.Verb + " " + ra.Resource + "/" + ra.Subresource
	}
	return ra.Verb + " " + ra.Resource
}

// `kubectl apply -k deploy/` installs the namespaced layout: the task-pod
// role is bound with a RoleBinding in each listed task namespace (none of
// them kube-system or the service's own), serve gets the same list as
// --namespaces, and the real API server's RBAC (SubjectAccessReview)
// grants the ServiceAccount pods in the task namespaces and not in
// kube-system, kubetask's own namespace, default or any namespace not
// listed. The cluster-wide overlay, applied on top, grants them everywhere
// and passes no --namespaces.
func TestDefaultLayoutGrantsTaskNamespacesOnly(t *testing.T) {
	objs := build(t, "/deploy", nil)
	sa := find(t, objs, "ServiceAccount", "kubetask")
	svcNS := sa.GetNamespace()
	dep := into[appsv1.Deployment](t, find(t, objs, "Deployment", "kubetask"))
	flag, ok := flagValues(dep.Spec.Template.Spec.Containers[0].Args)["namespaces"]
	if !ok {
		t.Fatal("the default layout (deploy/) passes no --namespaces: serve would run tasks in every namespace")
	}
	listed := strings.Split(expand(flag, containerVars(dep, svcNS)), ",")
	slices.Sort(listed)
	var bound []string
	for _, o := range objs {
		switch o.GetKind() {
		case "RoleBinding":
			if b := into[rbacv1.RoleBinding](t, o); b.RoleRef.Kind == "ClusterRole" && b.RoleRef.Name == "kubetask-tasks" {
				bound = append(bound, o.GetNamespace())
			}
		case "ClusterRoleBinding":
			if b := into[rbacv1.ClusterRoleBinding](t, o); b.RoleRef.Name == "kubetask-tasks" {
				t.Errorf("the default layout binds kubetask-tasks in every namespace (ClusterRoleBinding %s)", o.GetName())
			}
		}
	}
	slices.Sort(bound)
	if !slices.Equal(listed, bound) {
		t.Errorf("the default layout lists the task namespaces %v (--namespaces) but binds kubetask-tasks in %v: deploy/namespaced/task-namespaces.yaml must name the same", listed, bound)
	}
	for _, ns := range listed {
		if ns == svcNS || slices.Contains(never, ns) {
			t.Errorf("the default layout lists %s as a task namespace", ns)
		}
		if !slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "Namespace" && o.GetName() == ns }) {
			t.Errorf("the default layout lists the task namespace %s but does not create it: applying it to a new cluster fails", ns)
		}
	}

	// Applied for real, as `kubectl apply -k deploy/` does (the namespaces
	// first), with the objects' own names.
	env := clustertest.New(t) // an existing namespace that is not listed
	a := newApplier(t, env.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	applyForReal := func(o *unstructured.Unstructured) {
		t.Helper()
		if _, err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		if o.GetNamespace() == "" {
			// Deleted when the test ends; a namespace is waited for until it
			// is gone, so that the test can run again in the same cluster.
			t.Cleanup(func() {
				ri, err := a.resource(o)
				if err != nil {
					t.Error(err)
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("deleting %s %s: %v", o.GetKind(), o.GetName(), err)
					return
				}
				if o.GetKind() == "Namespace" {
					eventually(t, time.Minute, "namespace "+o.GetName()+" to be deleted", func() bool {
						_, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
						return apierrors.IsNotFound(err)
					})
				}
			})
		}
	}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			applyForReal(o)
		}
	}
	for _, o := range objs {
		if rbacKinds[o.GetKind()] {
			applyForReal(o)
		}
	}

	user := "system:serviceaccount:" + svcNS + ":" + sa.GetName()
	var granted []authorizationv1.ResourceAttributes
	for _, r := range into[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "kubetask-tasks")).Rules {
		for _, verb := range r.Verbs {
			for _, res := range r.Resources {
				resource, sub, _ := strings.Cut(res, "/")
				granted = append(granted, authorizationv1.ResourceAttributes{Verb: verb, Group: r.APIGroups[0], Resource: resource, Subresource: sub})
			}
		}
	}
	eventually(t, 30*time.Second, "the task-pod role to be in force in the task namespaces", func() bool {
		for _, ns := range listed {
			for _, ra := range granted {
				ra.Namespace = ns
				if !allowed(ctx, t, env.Client, user, ra) {
					return false
				}
			}
		}
		return true
	})
	notListed := append([]string{svcNS, metav1.NamespaceDefault, env.Namespace, "not-listed-anywhere"}, never...)
	for _, ns := range notListed {
		for _, ra := range dangerous {
			ra.Namespace = ns
			if allowed(ctx, t, env.Client, user, ra) {
				t.Errorf("the default layout lets %s %s in namespace %s, which is not a task namespace", user, what(ra), ns)
			}
		}
	}
	for _, verb := range []string{"list", "watch"} {
		if allowed(ctx, t, env.Client, user, authorizationv1.ResourceAttributes{Verb: verb, Resource: "pods"}) {
			t.Errorf("the default layout lets %s %s pods in every namespace", user, verb)
		}
	}

	// The cluster-wide overlay: the same service, the role bound everywhere.
	cw := build(t, "/deploy/cluster-wide", nil)
	cwDep := into[appsv1.Deployment](t, find(t, cw, "Deployment", "kubetask"))
	if _, ok := flagValues(cwDep.Spec.Template.Spec.Containers[0].Args)["namespaces"]; ok {
		t.Error("the cluster-wide overlay passes --namespaces")
	}
	crb := find(t, cw, "ClusterRoleBinding", "kubetask-tasks")
	if b := into[rbacv1.ClusterRoleBinding](t, crb); b.RoleRef.Name != "kubetask-tasks" || b.Subjects[0].Namespace != svcNS || b.Subjects[0].Name != sa.GetName() {
		t.Fatalf("the cluster-wide overlay's ClusterRoleBinding %s: role %s, subjects %+v", crb.GetName(), b.RoleRef.Name, b.Subjects)
	}
	applyForReal(crb)
	eventually(t, 30*time.Second, "the cluster-wide binding to be in force", func() bool {
		for _, ns := range notListed {
			for _, ra := range dangerous {
				ra.Namespace = ns
				if !allowed(ctx, t, env.Client, user, ra) {
					return false
				}
			}
		}
		return allowed(ctx, t, env.Client, user, authorizationv1.ResourceAttributes{Verb: "watch", Resource: "pods"})
	})
}
