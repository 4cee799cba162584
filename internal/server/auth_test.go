package server_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
)

func TestTokenFile(t *testing.T) {
	toks, err := server.ParseTokenFile([]byte(`
tokens:
- token: s3cret
  subject: ci
  namespaces: [team-a, team-b]
- token: r00t
  subject: admin
  namespaces: "*"
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) != 2 || !toks[1].Namespaces.All() || toks[0].Namespaces.All() || toks[0].Subject != "ci" {
		t.Fatalf("%+v", toks)
	}
	for name, bad := range map[string]string{
		"unknown field":     "tokens:\n- token: a\n  subject: b\n  namespaces: [x]\n  namespace: y\n",
		"no namespaces":     "tokens:\n- token: a\n  subject: b\n",
		"bad namespace":     "tokens:\n- token: a\n  subject: b\n  namespaces: [Team_A]\n",
		"namespaces string": "tokens:\n- token: a\n  subject: b\n  namespaces: team-a\n",
		"duplicate token":   "tokens:\n- {token: a, subject: b, namespaces: [x]}\n- {token: a, subject: c, namespaces: [x]}\n",
		"no token":          "tokens:\n- {subject: b, namespaces: [x]}\n",
		"no tokens":         "tokens: []\n",
	} {
		if _, err := server.ParseTokenFile([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// TestTokenModeScopesListsAndWatches: a token limited to namespaces sees
// only their tasks, in lists (with or without a namespace filter) and
// watches, and cannot touch the others.
func TestTokenModeScopesListsAndWatches(t *testing.T) {
	auth, err := server.NewTokenAuth([]server.Token{
		{Token: "root", Subject: "admin", Namespaces: server.Namespaces{"*"}},
		{Token: "ab", Subject: "ci", Namespaces: server.Namespaces{"team-a", "team-b"}},
		{Token: "a", Subject: "alice", Namespaces: server.Namespaces{"team-a"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *server.Config) { c.Auth = auth })
	as := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	ids := map[string]string{}
	for _, ns := range []string{"team-a", "team-b", "team-c"} {
		_, tk := h.submit(ns, taskDoc("job"), as("root")...)
		ids[ns] = tk.ID
	}
	count := func(tok, query string) int {
		t.Helper()
		resp, b := h.do(http.MethodGet, api.Prefix+"/tasks?"+query, nil, as(tok)...)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("list %s as %s: %s %s", query, tok, resp.Status, b)
		}
		return strings.Count(string(b), `"id":`)
	}
	for _, tc := range []struct {
		tok, query string
		want       int
	}{{"root", "", 3}, {"ab", "", 2}, {"ab", "namespace=team-b", 1}, {"a", "", 1}, {"a", "namespace=team-a", 1}} {
		if got := count(tc.tok, tc.query); got != tc.want {
			t.Errorf("list %q as %s: %d tasks, want %d", tc.query, tc.tok, got, tc.want)
		}
	}
	if resp, _ := h.do(http.MethodPost, api.Prefix+"/tasks/"+ids["team-c"]+"/cancel", nil, as("ab")...); resp.StatusCode != http.StatusNotFound {
		t.Errorf("cancel in a namespace the token cannot see: %s", resp.Status)
	}
	if resp, _ := h.do(http.MethodPost, api.Prefix+"/tasks/"+ids["team-a"]+"/cancel", nil, as("a")...); resp.StatusCode != http.StatusOK {
		t.Errorf("cancel in the token's namespace: %s", resp.Status)
	}

	w := h.watch(api.Prefix+"/watch", as("ab")...)
	w.next()
	for _, ns := range []string{"team-c", "team-a", "team-b"} {
		h.publish(ids[ns], ns)
	}
	for _, want := range []string{"team-a", "team-b"} {
		if ev := w.next(); ev.Namespace != want {
			t.Fatalf("watch as ci: %+v, want an event of %s", ev, want)
		}
	}
	if resp, _ := h.do(http.MethodGet, api.Prefix+"/watch?namespace=team-c", nil, as("ab")...); resp.StatusCode != http.StatusForbidden {
		t.Errorf("watch of a forbidden namespace: %s", resp.Status)
	}
	// Probes and the API description need no token; metrics do.
	for path, want := range map[string]int{"/readyz": 200, api.Prefix + "/openapi.json": 200, "/metrics": 401} {
		if resp, _ := h.do(http.MethodGet, path, nil); resp.StatusCode != want {
			t.Errorf("%s without a token: %s, want %d", path, resp.Status, want)
		}
	}
	if resp, _ := h.do(http.MethodGet, "/metrics", nil, as("a")...); resp.StatusCode != http.StatusOK {
		t.Errorf("/metrics with a token: %s", resp.Status)
	}
}

// fakeKube answers TokenReviews and SubjectAccessReviews like an API server
// with two ServiceAccount tokens: "alice-token" may do everything in
// namespace "team-a" (and read its logs), "bob-token" only get and list
// there; any other token is unknown.
type fakeKube struct {
	reviews, accessReviews atomic.Int32
}

func (f *fakeKube) install(c *fake.Clientset) {
	users := map[string]string{"alice-token": "system:serviceaccount:team-a:alice", "bob-token": "system:serviceaccount:team-a:bob"}
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.reviews.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		if u, ok := users[tr.Spec.Token]; ok {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: u, Groups: []string{"system:serviceaccounts"}}}
		}
		return true, tr, nil
	})
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.accessReviews.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		ra := sar.Spec.ResourceAttributes
		switch {
		case ra == nil || ra.Namespace != "team-a" || ra.Resource != "pods":
		case strings.HasSuffix(sar.Spec.User, ":alice"):
			sar.Status.Allowed = true
		case strings.HasSuffix(sar.Spec.User, ":bob"):
			sar.Status.Allowed = ra.Subresource == "" && (ra.Verb == "get" || ra.Verb == "list")
		}
		return true, sar, nil
	})
}

func TestKubernetesMode(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	var kube fakeKube
	var auth *server.KubernetesAuth
	h := newHarness(t, func(c *server.Config) {
		kube.install(c.Client.(*fake.Clientset))
		var err error
		auth, err = server.NewKubernetesAuth(server.KubernetesAuthConfig{Client: c.Client, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	as := func(tok string) []string {
		return []string{"Authorization", "Bearer " + tok, "Content-Type", "application/yaml"}
	}
	submit := func(tok, ns string) int {
		resp, _ := h.do(http.MethodPost, api.Prefix+"/namespaces/"+ns+"/tasks", []byte(taskDoc("job")), as(tok)...)
		return resp.StatusCode
	}
	// The three outcomes.
	if got := submit("alice-token", "team-a"); got != http.StatusCreated {
		t.Fatalf("allowed: %d", got)
	}
	if got := submit("alice-token", "team-b"); got != http.StatusForbidden {
		t.Errorf("forbidden namespace: %d", got)
	}
	if got := submit("bob-token", "team-a"); got != http.StatusForbidden {
		t.Errorf("forbidden verb: %d", got)
	}
	if got := submit("mallory-token", "team-a"); got != http.StatusUnauthorized {
		t.Errorf("unknown token: %d", got)
	}
	// Bob may read, not cancel or read logs; lists need a namespace.
	resp, b := h.do(http.MethodGet, api.Prefix+"/tasks?namespace=team-a", nil, as("bob-token")...)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"id":`) {
		t.Fatalf("bob lists team-a: %s %s", resp.Status, b)
	}
	id := strings.SplitN(strings.SplitN(string(b), `"id":"`, 2)[1], `"`, 2)[0]
	if resp, b := h.do(http.MethodGet, api.Prefix+"/tasks", nil, as("bob-token")...); resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "give the namespace parameter") {
		t.Errorf("bob lists all namespaces: %s %s", resp.Status, b)
	}
	if resp, _ := h.do(http.MethodGet, api.Prefix+"/tasks/"+id, nil, as("bob-token")...); resp.StatusCode != http.StatusOK {
		t.Errorf("bob gets: %s", resp.Status)
	}
	if resp, _ := h.do(http.MethodPost, api.Prefix+"/tasks/"+id+"/cancel", nil, as("bob-token")...); resp.StatusCode != http.StatusForbidden {
		t.Errorf("bob cancels: %s", resp.Status)
	}
	if resp, _ := h.do(http.MethodGet, api.Prefix+"/tasks/"+id+"/logs", nil, as("bob-token")...); resp.StatusCode != http.StatusForbidden {
		t.Errorf("bob reads logs: %s", resp.Status)
	}
	if resp, _ := h.do(http.MethodGet, api.Prefix+"/tasks/"+id+"/logs", nil, as("alice-token")...); resp.StatusCode != http.StatusOK {
		t.Errorf("alice reads logs: %s", resp.Status)
	}
	if resp, _ := h.do(http.MethodGet, "/metrics", nil, as("alice-token")...); resp.StatusCode != http.StatusForbidden {
		t.Errorf("alice reads metrics: %s", resp.Status)
	}

	// Answers are cached for CacheTTL, by token and attributes.
	reviews, access := kube.reviews.Load(), kube.accessReviews.Load()
	for range 3 {
		h.do(http.MethodGet, api.Prefix+"/tasks/"+id, nil, as("bob-token")...)
		submit("mallory-token", "team-a")
	}
	if kube.reviews.Load() != reviews || kube.accessReviews.Load() != access {
		t.Errorf("cached answers asked again: %d token reviews, %d access reviews", kube.reviews.Load()-reviews, kube.accessReviews.Load()-access)
	}
	clk.SetTime(clk.Now().Add(11 * time.Second))
	h.do(http.MethodGet, api.Prefix+"/tasks/"+id, nil, as("bob-token")...)
	if kube.reviews.Load() != reviews+1 || kube.accessReviews.Load() != access+1 {
		t.Errorf("expired answers not asked again: %d token reviews, %d access reviews", kube.reviews.Load()-reviews, kube.accessReviews.Load()-access)
	}
}

func TestKubernetesAuthFailureIsNotAVerdict(t *testing.T) {
	c := fake.NewClientset()
	c.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, context.DeadlineExceeded
	})
	auth, err := server.NewKubernetesAuth(server.KubernetesAuthConfig{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(cfg *server.Config) { cfg.Auth = auth })
	if resp, b := h.do(http.MethodGet, api.Prefix+"/tasks", nil, "Authorization", "Bearer x"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("%s %s", resp.Status, b)
	}
}
