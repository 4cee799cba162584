package serve

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// tokenReviews is the API server's count of TokenReviews created.
func tokenReviews(t *testing.T, env *clustertest.Env) int {
	t.Helper()
	b, err := env.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "apiserver_request_total{") && strings.Contains(line, `resource="tokenreviews"`) && strings.Contains(line, `verb="POST"`) {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			n += int(v)
		}
	}
	return n
}

// Kubernetes mode with --auth-audience kubetask: a ServiceAccount token made
// for kubetask is accepted, the account's ordinary token (the API server's
// audience) is refused; a flood of unknown tokens costs a few TokenReviews
// (the burst, then one a second)
// (the API server's own count), and the known caller is still answered.
func TestServeKubernetesAudienceAndTokenFlood(t *testing.T) {
	env := clustertest.New(t)
	ctx := context.Background()
	rbac := env.Client.RbacV1()
	if _, err := rbac.Roles(env.Namespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "lister"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "user"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(env.Namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "lister"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "lister"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "user", Namespace: env.Namespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(audiences ...string) string {
		t.Helper()
		tr, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).CreateToken(ctx, "user",
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	forKubetask, forAPIServer := token("kubetask"), token()
	s := startService(t, env, "--auth", "kubernetes", "--auth-audience", "kubetask")
	list := api.Prefix + "/tasks?namespace=" + env.Namespace
	if resp, b := s.doAs(forKubetask, http.MethodGet, list, "", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("a token for kubetask: %s %s", resp.Status, b)
	}
	if resp, b := s.doAs(forAPIServer, http.MethodGet, list, "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a token for the API server: %s %s, want 401", resp.Status, b)
	}

	before := tokenReviews(t, env)
	var mu sync.Mutex
	codes := map[int]int{}
	start := time.Now()
	var wg sync.WaitGroup
	// 30 connections send made-up tokens for 5 s (a request in the
	// address's turn waits up to 10 s more).
	for w := range 30 {
		wg.Go(func() {
			for i := 0; time.Since(start) < 5*time.Second; i++ {
				resp, _ := s.doAs(fmt.Sprintf("bogus-%d-%d", w, i), http.MethodGet, list, "", nil)
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	reviews := tokenReviews(t, env) - before
	if resp, b := s.doAs(forKubetask, http.MethodGet, list, "", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("the known caller after the flood: %s %s", resp.Status, b)
	}
	t.Logf("unknown tokens from 30 connections for %v: answers %v, %d TokenReviews on the API server", elapsed.Round(time.Millisecond), codes, reviews)
	// The burst (20), then one a second; measured 44 in 15 s here against
	// 34 in internal/server's harness (TestBogusTokenFlood), a gap not yet
	// explained: the bound is issue 21's.
	if limit := 100; reviews > limit || codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("%d TokenReviews for unknown tokens in %v (answers %v): want the refusals rate-limited, at most %d", reviews, elapsed, codes, limit)
	}
	// The same address, a token never seen before (issue 33: users behind
	// an Ingress, a NAT or kubectl port-forward share an address): it is
	// checked in the address's turn and served, not refused.
	fresh := token("kubetask")
	if resp, b := s.doAs(fresh, http.MethodGet, list, "", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("a new valid token from the flooded address: %s %s, want 200", resp.Status, b)
	}
}
