package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
)

func exhaustTokens(t *testing.T) *server.TokenAuth {
	t.Helper()
	auth, err := server.NewTokenAuth([]server.Token{
		{Token: "root", Subject: "admin", Namespaces: server.Namespaces{"*"}},
		{Token: "a", Subject: "alice", Namespaces: server.Namespaces{"team-a"}},
		{Token: "b", Subject: "bob", Namespaces: server.Namespaces{"team-a"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return auth
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// rawRequest writes head (a request line and headers, without the blank
// line) and then body on a new connection to the harness, and returns the
// status line of the answer, or an error when none came within d. The
// answer is read while the body is written: a server that refuses without
// reading the body closes the connection, and the rest of the body then
// fails to be written (connection reset) after the answer came.
func (h *harness) rawRequest(head, body string, d time.Duration) (string, error) {
	h.t.Helper()
	c, err := net.Dial("tcp", h.ts.Listener.Addr().String())
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	written := make(chan struct{})
	defer func() { <-written }()
	go func() {
		defer close(written)
		_, _ = io.WriteString(c, head+"\r\n\r\n"+body)
	}()
	defer c.Close() // ends the write, before the wait for it
	_ = c.SetReadDeadline(time.Now().Add(d))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// A body where none belongs (GET of a public path, before any token) is
// refused at once, without being read: it cannot pin memory nor a
// connection. A POST without a valid token is refused before its body is
// read.
func TestBodyOnlyWhereABodyBelongs(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Auth = exhaustTokens(t) })
	for _, tc := range []struct{ name, head, want string }{
		{"GET of /readyz with a body one byte short", "GET /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576", "HTTP/1.1 400"},
		{"GET of the API with a chunked body", "GET " + api.Prefix + "/tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nAuthorization: Bearer root", "HTTP/1.1 400"},
		{"POST of /readyz without a token", "POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576", "HTTP/1.1 401"},
		{"POST of a task without a token", "POST " + api.Prefix + "/namespaces/team-a/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576", "HTTP/1.1 401"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line, err := h.rawRequest(tc.head, strings.Repeat("a", 1<<20-1), 5*time.Second)
			if err != nil || !strings.HasPrefix(line, tc.want) {
				t.Fatalf("answer %q (%v), want %s at once", line, err, tc.want)
			}
		})
	}
}

// Made-up methods do not make metric series: every label value of the
// HTTP metrics is bounded.
func TestMadeUpMethodsMakeNoSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, func(c *server.Config) { c.Auth = exhaustTokens(t); c.Registry = reg })
	series := func() int {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "kubetask_http_") {
				n += len(mf.GetMetric())
			}
		}
		return n
	}
	send := func(n int, prefix string) {
		for i := range n {
			for _, p := range []string{"/healthz", api.Prefix + "/tasks"} {
				req, _ := http.NewRequest(fmt.Sprintf("%s%07d", prefix, i), h.ts.URL+p, nil)
				resp, err := h.ts.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
		}
	}
	send(2, "X")
	before := series()
	send(300, "Y")
	if after := series(); after != before {
		t.Fatalf("300 more made-up methods: %d series of kubetask_http_*, was %d", after, before)
	}
}

// kubeHarness is a server in the kubernetes mode over the fake clientset:
// alice-token is alice's, every other token is unknown; alice may do all.
func kubeHarness(t *testing.T, reviews *atomic.Int32, audiences []string, mods ...func(*server.Config)) *harness {
	t.Helper()
	return newHarness(t, func(c *server.Config) {
		cs := c.Client.(*fake.Clientset)
		cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
			reviews.Add(1)
			tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
			switch tr.Spec.Token {
			case "alice-token", "bob-token":
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "alice"}, Audiences: tr.Spec.Audiences}
			case "apiserver-token": // an authenticator that ignores audiences
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "alice"}}
			}
			return true, tr, nil
		})
		cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
			sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
			sar.Status.Allowed = true
			return true, sar, nil
		})
		auth, err := server.NewKubernetesAuth(server.KubernetesAuthConfig{Client: c.Client, Audiences: audiences})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
		for _, m := range mods {
			m(c)
		}
	})
}

// A flood of bogus tokens from one address costs a few TokenReviews (its
// refusals are rate-limited: checked at RefusedTokenRate, each in its turn,
// and 429 with Retry-After when that is further off than RefusedTokenWait)
// and evicts no known token: the next request of a known caller costs no
// review.
func TestBogusTokenFlood(t *testing.T) {
	var reviews atomic.Int32
	h := kubeHarness(t, &reviews, nil, func(c *server.Config) { c.RefusedTokenWait = 200 * time.Millisecond })
	list := api.Prefix + "/tasks?namespace=team-a"
	if r, b := h.do(http.MethodGet, list, nil, bearer("alice-token")...); r.StatusCode != 200 {
		t.Fatalf("alice: %s %s", r.Status, b)
	}
	r0 := reviews.Load()
	var mu sync.Mutex
	codes := map[int]int{}
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 40 {
		wg.Go(func() {
			for i := range 300 {
				r, _ := h.do(http.MethodGet, list, nil, bearer(fmt.Sprintf("bogus-%d-%d", w, i))...)
				mu.Lock()
				codes[r.StatusCode]++
				mu.Unlock()
				if r.StatusCode == http.StatusTooManyRequests && r.Header.Get("Retry-After") == "" {
					t.Error("429 without Retry-After")
					return
				}
			}
		})
	}
	wg.Wait()
	flood := reviews.Load() - r0
	r1 := reviews.Load()
	if r, b := h.do(http.MethodGet, list, nil, bearer("alice-token")...); r.StatusCode != 200 {
		t.Fatalf("alice after the flood: %s %s", r.Status, b)
	}
	elapsed := time.Since(start)
	t.Logf("12000 bogus tokens in %v: answers %v, %d TokenReviews; alice's next request: %d TokenReviews", elapsed, codes, flood, reviews.Load()-r1)
	if limit := 20 + int32(elapsed.Seconds()) + 2; flood > limit {
		t.Errorf("the flood cost %d TokenReviews in %v, want at most %d (the burst, then 1 a second)", flood, elapsed, limit)
	}
	if n := reviews.Load() - r1; n != 0 {
		t.Errorf("alice's cached token was evicted by the flood: %d TokenReviews", n)
	}
}

// Made-up tokens from one address never lock out a valid token from it
// (issue 33): users behind an Ingress, a mesh sidecar, kubectl port-forward
// or a NAT share an address. Past the address's budget of refusals a token
// not known already waits for its turn (RefusedTokenRate) and is checked:
// bob's valid token, never seen before, is served; a made-up one is still
// refused (401). It was 429 after 21 made-up tokens before.
func TestMadeUpTokensDoNotLockOutAValidOne(t *testing.T) {
	var reviews atomic.Int32
	h := kubeHarness(t, &reviews, nil, func(c *server.Config) { c.RefusedTokenRate = 10 })
	list := api.Prefix + "/tasks?namespace=team-a"
	codes := map[int]int{}
	for i := range 25 {
		r, _ := h.do(http.MethodGet, list, nil, bearer(fmt.Sprintf("bogus-%d", i))...)
		codes[r.StatusCode]++
	}
	if codes[http.StatusUnauthorized] != 25 {
		t.Fatalf("25 made-up tokens: %v, want each checked and refused (401)", codes)
	}
	before := reviews.Load()
	if r, b := h.do(http.MethodGet, list, nil, bearer("bob-token")...); r.StatusCode != http.StatusOK {
		t.Fatalf("bob's valid token from the flooded address: %s %s", r.Status, b)
	}
	if n := reviews.Load() - before; n != 1 {
		t.Fatalf("bob's token: %d TokenReviews, want 1", n)
	}
}

// With audiences set, a token the API server authenticated for another
// audience (or without saying for which) is refused.
func TestKubernetesAudience(t *testing.T) {
	var reviews atomic.Int32
	h := kubeHarness(t, &reviews, []string{"kubetask"})
	list := api.Prefix + "/tasks?namespace=team-a"
	if r, b := h.do(http.MethodGet, list, nil, bearer("alice-token")...); r.StatusCode != 200 {
		t.Fatalf("token for kubetask: %s %s", r.Status, b)
	}
	if r, b := h.do(http.MethodGet, list, nil, bearer("apiserver-token")...); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("token for no audience of ours: %s %s, want 401", r.Status, b)
	}
}

// One caller cannot open streams without bound: beyond its limit a watch
// is a 429 with Retry-After, while another caller still opens one.
func TestStreamsPerCallerLimited(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Auth = exhaustTokens(t) })
	for range 50 {
		h.watch(api.Prefix+"/watch?namespace=team-a", bearer("a")...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.ts.URL+api.Prefix+"/watch?namespace=team-a", nil)
	req.Header.Set("Authorization", "Bearer a")
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("watch 51 of one caller: %s Retry-After=%q, want 429 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
	}
	h.watch(api.Prefix+"/watch?namespace=team-a", bearer("b")...).next()
}

// Host and cross-site checks: without authentication only loopback Host
// names are served (DNS rebinding); in every mode a browser's cross-site
// request is refused.
func TestHostAndCrossSite(t *testing.T) {
	post := func(h *harness, host string, hdr ...string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, h.ts.URL+api.Prefix+"/namespaces/team-a/tasks", strings.NewReader(taskDoc("x")))
		req.Header.Set("Content-Type", "application/yaml")
		if host != "" {
			req.Host = host
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := h.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	none := newHarness(t, nil)
	tokens := newHarness(t, func(c *server.Config) { c.Auth = exhaustTokens(t) })
	for _, tc := range []struct {
		name string
		h    *harness
		host string
		hdr  []string
		want int
	}{
		{"none: a rebound host name", none, "attacker.example", nil, http.StatusMisdirectedRequest},
		{"none: a rebound host name with a port", none, "attacker.example:8080", nil, http.StatusMisdirectedRequest},
		{"none: localhost", none, "localhost:8080", nil, http.StatusCreated},
		{"none: [::1]", none, "[::1]:8080", nil, http.StatusCreated},
		{"none: 127.0.0.1", none, "", nil, http.StatusCreated},
		{"none: cross-site form", none, "", []string{"Origin", "https://evil.example", "Content-Type", "application/x-www-form-urlencoded"}, http.StatusForbidden},
		{"none: Sec-Fetch-Site cross-site", none, "", []string{"Sec-Fetch-Site", "cross-site"}, http.StatusForbidden},
		{"none: Sec-Fetch-Site same-origin", none, "", []string{"Sec-Fetch-Site", "same-origin"}, http.StatusCreated},
		{"token: cross-site with a valid token", tokens, "", append(bearer("a"), "Sec-Fetch-Site", "cross-site"), http.StatusForbidden},
		{"token: another Origin with a valid token", tokens, "", append(bearer("a"), "Origin", "https://evil.example"), http.StatusForbidden},
		{"token: any host name", tokens, "kubetask.example", bearer("a"), http.StatusCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := post(tc.h, tc.host, tc.hdr...); got != tc.want {
				t.Fatalf("%d, want %d", got, tc.want)
			}
		})
	}
}

// One namespace's callers cannot take every stream slot (issue 33): in
// kubernetes mode each ServiceAccount is a caller of its own, and 20 of
// team-a's, 50 watches each (the per-caller limit), filled the server's
// 1,000 before; team-c's only user got 429. Now team-a's watches stop at
// its share (half the total), with a 429 naming it, and team-c's user opens
// a watch and a log follow; request slots are shared the same way.
func TestOneNamespaceCannotTakeEveryStream(t *testing.T) {
	h := newHarness(t, func(c *server.Config) {
		cs := c.Client.(*fake.Clientset)
		cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
			tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: tr.Spec.Token}}
			return true, tr, nil
		})
		cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
			sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
			ra := sar.Spec.ResourceAttributes
			sar.Status.Allowed = ra != nil && ((strings.HasPrefix(sar.Spec.User, "system:serviceaccount:team-a:") && ra.Namespace == "team-a") ||
				(sar.Spec.User == "carol" && ra.Namespace == "team-c"))
			return true, sar, nil
		})
		auth, err := server.NewKubernetesAuth(server.KubernetesAuthConfig{Client: c.Client})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	open := func(token, path string) (int, []byte) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.ts.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := h.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, b
		}
		return resp.StatusCode, nil
	}
	codes := map[int]int{}
	var refusal []byte
	for sa := range 20 {
		for range 50 {
			code, b := open(fmt.Sprintf("system:serviceaccount:team-a:sa-%d", sa), api.Prefix+"/watch?namespace=team-a")
			codes[code]++
			if code == http.StatusTooManyRequests {
				refusal = b
			}
		}
	}
	if codes[http.StatusOK] != 500 || !strings.Contains(string(refusal), `namespace \"team-a\"'s share of 500`) {
		t.Fatalf("team-a's 1,000 watches: %v (%s), want 500 opened, the rest refused naming team-a's share", codes, refusal)
	}
	if code, b := open("carol", api.Prefix+"/watch?namespace=team-c"); code != http.StatusOK {
		t.Fatalf("team-c's watch: %d %s", code, b)
	}
	h.logs.append(t, store.LogKey{TaskID: "c-1", Container: "main"}, "x", false)
	tk := h.mustSubmit("team-c", taskDoc("c"), append(bearer("carol"), "Idempotency-Key", "c-1")...)
	if code, b := open("carol", api.Prefix+"/tasks/"+tk.ID+"/logs?follow=true"); code != http.StatusOK {
		t.Fatalf("team-c's log follow: %d %s", code, b)
	}
}
