package serve

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// Kubernetes mode against the local cluster's RBAC (issue 21 §3): an
// account that may create pods but not get them resubmits a task's ID and
// document and learns nothing of its state; a watch and a log follow opened
// by an account whose RoleBinding is then deleted end within seconds, not at
// the 30-minute stream timeout.
func TestServeKubernetesIsolation(t *testing.T) {
	env := clustertest.New(t)
	ctx := context.Background()
	rbac := env.Client.RbacV1()
	role := func(name string, rules ...rbacv1.PolicyRule) {
		t.Helper()
		if _, err := rbac.Roles(env.Namespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	role("task-user",
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}})
	role("task-creator", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}})
	account := func(sa, roleName string) string {
		t.Helper()
		if _, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := rbac.RoleBindings(env.Namespace).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: sa},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: roleName},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: env.Namespace}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	owner, watcher, creator := account("owner", "task-user"), account("watcher", "task-user"), account("creator", "task-creator")
	s := startService(t, env, "--auth", "kubernetes")
	s.Token = owner
	submitPath := api.Prefix + "/namespaces/" + env.Namespace + "/tasks"

	t.Run("resubmission by a caller who may not get", func(t *testing.T) {
		s := s.with(t)
		doc := quickTask("report")
		resp, b := s.doAs(owner, http.MethodPost, submitPath+"?id=iso-report", "application/yaml", doc)
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("owner submits: %s %s", resp.Status, b)
		}
		s.waitTask("iso-report", 2*time.Minute, "the task to end", func(tk api.Task) bool { return tk.Terminal })
		if resp, b := s.doAs(creator, http.MethodGet, api.Prefix+"/tasks/iso-report", "", nil); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("creator gets the task: %s %s, want 404", resp.Status, b)
		}
		resp, b = s.doAs(creator, http.MethodPost, submitPath+"?id=iso-report", "application/yaml", doc)
		var tk api.Task
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &tk) != nil {
			t.Fatalf("creator resubmits: %s %s, want 200", resp.Status, b)
		}
		if tk.ID != "iso-report" || tk.Phase != "" || tk.Reason != "" || tk.Terminal || tk.ExitCode != nil || len(tk.Attempts) != 0 || !tk.CreatedAt.IsZero() {
			t.Errorf("creator's resubmission shows more than the task's identity: %s", b)
		}
		resp, b = s.doAs(owner, http.MethodPost, submitPath+"?id=iso-report", "application/yaml", doc)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"terminal":true`) {
			t.Errorf("owner resubmits: %s %s, want 200 with the finished task", resp.Status, b)
		}
	})

	t.Run("streams end when the RoleBinding goes", func(t *testing.T) {
		s := s.with(t)
		long := taskDoc("long", "", `      containers:
        - {name: main, image: busybox, command: [sh, -c, "echo started; sleep 600"]}`)
		if resp, b := s.doAs(owner, http.MethodPost, submitPath+"?id=iso-long", "application/yaml", long); resp.StatusCode != http.StatusCreated {
			t.Fatalf("owner submits: %s %s", resp.Status, b)
		}
		defer s.doAs(owner, http.MethodPost, api.Prefix+"/tasks/iso-long/cancel", "", nil)
		s.waitTask("iso-long", 2*time.Minute, "the task to run", func(tk api.Task) bool { return tk.Phase == "Running" })
		open := func(path string) (*http.Response, <-chan struct{}) {
			t.Helper()
			sctx, cancel := context.WithCancel(ctx)
			t.Cleanup(cancel)
			req, _ := http.NewRequestWithContext(sctx, http.MethodGet, s.URL+path, nil)
			req.Header.Set("Authorization", "Bearer "+watcher)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("GET %s: %s %s", path, resp.Status, b)
			}
			done := make(chan struct{})
			go func() {
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				close(done)
			}()
			return resp, done
		}
		_, watchDone := open(api.Prefix + "/watch?namespace=" + env.Namespace)
		logResp, logDone := open(api.Prefix + "/tasks/iso-long/logs?follow=true")
		// Both stay open while the binding holds (the server checks every 5 s).
		select {
		case <-watchDone:
			t.Fatal("the watch ended while allowed")
		case <-logDone:
			t.Fatal("the log follow ended while allowed")
		case <-time.After(8 * time.Second):
		}
		if err := rbac.RoleBindings(env.Namespace).Delete(ctx, "watcher", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		revoked := time.Now()
		for name, done := range map[string]<-chan struct{}{"watch": watchDone, "log follow": logDone} {
			select {
			case <-done:
				t.Logf("the %s ended %s after the RoleBinding was deleted", name, time.Since(revoked).Round(100*time.Millisecond))
			case <-time.After(2 * time.Minute):
				t.Fatalf("the %s is still open 2 minutes after the RoleBinding was deleted", name)
			}
		}
		if got := logResp.Trailer.Get(api.HeaderLogResume); got != "true" {
			t.Errorf("log follow trailer %s = %q, want true", api.HeaderLogResume, got)
		}
		if tk := s.get("iso-long"); tk.Terminal {
			t.Errorf("the task ended meanwhile (%s/%s): the follow may have ended with it", tk.Phase, tk.Reason)
		}
		if resp, _ := s.doAs(watcher, http.MethodGet, api.Prefix+"/watch?namespace="+env.Namespace, "", nil); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a new watch after the revocation: %s, want 403", resp.Status)
		}
	})
}
