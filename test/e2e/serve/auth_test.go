package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// quickTask is a task that prints one line and succeeds.
func quickTask(name string) []byte {
	return taskDoc(name, "", `      containers:
        - {name: main, image: busybox, command: [sh, -c, "echo hello"]}`)
}

// authCase is one caller of an auth test and what it must get.
type authCase struct {
	who, token string
	submit     int // the status of a submission in the test's namespace
	read       int // the status of reading the task submitted by the allowed caller
}

// check submits as each caller and reads the allowed caller's task; nothing
// refused creates a record (the namespace's list stays at one task).
func (s *service) checkAuth(t *testing.T, cases []authCase) {
	t.Helper()
	var id string
	for _, c := range cases {
		resp, b := s.doAs(c.token, http.MethodPost, api.Prefix+"/namespaces/"+s.env.Namespace+"/tasks", "application/yaml", quickTask("auth"))
		if resp.StatusCode != c.submit {
			t.Errorf("%s: submit %s, want %d: %s", c.who, resp.Status, c.submit, b)
		}
		if resp.StatusCode == http.StatusCreated && id == "" {
			id = s.submitted(b)
		}
	}
	if id == "" {
		t.Fatal("no caller could submit")
	}
	for _, c := range cases {
		if resp, b := s.doAs(c.token, http.MethodGet, api.Prefix+"/tasks/"+id, "", nil); resp.StatusCode != c.read {
			t.Errorf("%s: get %s, want %d: %s", c.who, resp.Status, c.read, b)
		}
	}
	s.Token = cases[0].token
	if l := s.list("namespace=" + s.env.Namespace); len(l) != 1 {
		t.Errorf("%d tasks in the namespace, want the one submission allowed", len(l))
	}
	s.waitTask(id, 2*time.Minute, "the task to end", func(tk api.Task) bool { return tk.Terminal })
}

// submitted returns the ID of the task in a submission's response.
func (s *service) submitted(b []byte) string {
	s.t.Helper()
	var tk api.Task
	if err := json.Unmarshal(b, &tk); err != nil || tk.ID == "" {
		s.t.Fatalf("submission response %s: %v", b, err)
	}
	return tk.ID
}

// Token mode: a token for the namespace, a token for another namespace, an
// unknown token and none.
func TestServeTokenAuth(t *testing.T) {
	env := clustertest.New(t)
	file := filepath.Join(t.TempDir(), "tokens.yaml")
	doc := fmt.Sprintf("tokens:\n- {token: team-token, subject: team, namespaces: [%s]}\n- {token: other-token, subject: other, namespaces: [elsewhere]}\n", env.Namespace)
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startService(t, env, "--token-file", file)
	s.checkAuth(t, []authCase{
		{"the namespace's token", "team-token", http.StatusCreated, http.StatusOK},
		{"another namespace's token", "other-token", http.StatusForbidden, http.StatusNotFound},
		{"an unknown token", "not-a-token", http.StatusUnauthorized, http.StatusUnauthorized},
		{"no token", "", http.StatusUnauthorized, http.StatusUnauthorized},
	})
}

// Kubernetes mode: ServiceAccount tokens checked by TokenReview, each request
// by SubjectAccessReview: one account with a Role on pods in the
// namespace, one without, an unknown token.
func TestServeKubernetesAuth(t *testing.T) {
	env := clustertest.New(t)
	ctx := context.Background()
	rbac := env.Client.RbacV1()
	if _, err := rbac.Roles(env.Namespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "task-user"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		t.Helper()
		if _, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	user, nobody := token("user"), token("nobody")
	if _, err := rbac.RoleBindings(env.Namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "task-user"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "task-user"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "user", Namespace: env.Namespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := startService(t, env, "--auth", "kubernetes")
	s.checkAuth(t, []authCase{
		{"an account with the Role", user, http.StatusCreated, http.StatusOK},
		{"an account without it", nobody, http.StatusForbidden, http.StatusNotFound},
		{"an unknown token", "not-a-token", http.StatusUnauthorized, http.StatusUnauthorized},
	})
}
