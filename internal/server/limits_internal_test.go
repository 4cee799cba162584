package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestMethodAndCodeLabels(t *testing.T) {
	for in, want := range map[string]string{"GET": "GET", "POST": "POST", "DELETE": "DELETE", "get": "other", "X0000001": "other", "PROPFIND": "other", "": "other"} {
		if got := methodLabel(in); got != want {
			t.Errorf("methodLabel(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[int]string{200: "200", 429: "429", 599: "599", 99: "other", 600: "other", 0: "other"} {
		if got := codeLabel(in); got != want {
			t.Errorf("codeLabel(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestSlots(t *testing.T) {
	s := newSlots(3, 2, 0)
	var held []func()
	for i, tc := range []struct {
		key, limit string
	}{
		{"a", ""}, {"a", ""}, {"a", "this caller's limit of 2"}, {"b", ""}, {"c", "the server's limit of 3"},
	} {
		release, limit := s.acquire(tc.key, "")
		if limit != tc.limit || (release == nil) != (tc.limit != "") {
			t.Fatalf("acquire %d (%s): limit %q, want %q", i, tc.key, limit, tc.limit)
		}
		if release != nil {
			held = append(held, release)
		}
	}
	held[0]()
	held[0]() // idempotent
	if total, a := s.open("a"); total != 2 || a != 1 {
		t.Fatalf("after one release: %d open, %d of a; want 2 and 1", total, a)
	}
	if release, limit := s.acquire("c", ""); release == nil {
		t.Fatalf("a freed slot is not given again: %s", limit)
	}
	unlimited := newSlots(0, 0, 0)
	for range 1000 {
		if r, _ := unlimited.acquire("a", ""); r == nil {
			t.Fatal("no limit refused")
		}
	}
}

func TestRefusals(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	f := newRefusals(1, 3, 2, clk.Now)
	for i := range 3 {
		if _, blocked := f.blocked("10.0.0.1"); blocked {
			t.Fatalf("blocked after %d refusals, burst 3", i)
		}
		f.refused("10.0.0.1")
	}
	wait, blocked := f.blocked("10.0.0.1")
	if !blocked || wait < time.Second {
		t.Fatalf("after the burst: blocked %v for %s, want blocked for at least 1s", blocked, wait)
	}
	if _, blocked := f.blocked("10.0.0.2"); blocked {
		t.Fatal("another address is blocked")
	}
	clk.SetTime(clk.Now().Add(1100 * time.Millisecond))
	if _, blocked := f.blocked("10.0.0.1"); blocked {
		t.Fatal("still blocked once a refusal's time passed")
	}
	if _, blocked := (*refusals)(nil).blocked("x"); blocked {
		t.Fatal("no limiter blocks")
	}
}

// The auth cache is an LRU: new keys beyond its size evict the least
// recently used, never the whole cache; an answer expires after the TTL.
func TestTTLCacheIsLRU(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	c := newTTLCache(clk, 10*time.Second, 100)
	c.put("alice", true)
	for i := range 1000 {
		c.get("alice") // used all along
		c.put(fmt.Sprint("bogus-", i), false)
	}
	if v, ok := c.get("alice"); !ok || v != true {
		t.Fatal("a flood of new keys evicted a key in use")
	}
	if _, ok := c.get("bogus-0"); ok {
		t.Fatal("the least recently used key is still there")
	}
	clk.SetTime(clk.Now().Add(10 * time.Second))
	if _, ok := c.get("alice"); ok {
		t.Fatal("an answer outlived its TTL")
	}
}

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "localhost:8080": true, "LOCALHOST.": true, "127.0.0.1:80": true, "127.1.2.3": true, "[::1]:8080": true, "::1": true,
		"attacker.example": false, "attacker.example:8080": false, "localhost.attacker.example": false, "10.0.0.1": false, "": false, "[::]:80": false,
	} {
		if got := loopbackHost(host); got != want {
			t.Errorf("loopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

// The client address is the peer's unless the peer is a trusted proxy:
// then the last address of X-Forwarded-For that is no trusted proxy. A
// header from anyone else is ignored (a client could name any address).
func TestClientAddr(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for name, tc := range map[string]struct {
		remote string
		xff    []string
		want   string
	}{
		"no proxy":                         {remote: "192.0.2.1:5000", want: "192.0.2.1"},
		"an untrusted peer's header":       {remote: "192.0.2.1:5000", xff: []string{"198.51.100.7"}, want: "192.0.2.1"},
		"a trusted proxy":                  {remote: "10.1.2.3:5000", xff: []string{"198.51.100.7"}, want: "198.51.100.7"},
		"a chain: the last untrusted hop":  {remote: "10.1.2.3:5000", xff: []string{"203.0.113.9, 198.51.100.7, 10.9.9.9"}, want: "198.51.100.7"},
		"several headers":                  {remote: "10.1.2.3:5000", xff: []string{"203.0.113.9", "198.51.100.7"}, want: "198.51.100.7"},
		"a trusted proxy without a header": {remote: "10.1.2.3:5000", want: "10.1.2.3"},
		"a hop that is not an address":     {remote: "10.1.2.3:5000", xff: []string{"unknown"}, want: "10.1.2.3"},
		"IPv6":                             {remote: "[fd00::1]:5000", xff: []string{"2001:db8::5"}, want: "2001:db8::5"},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tc.remote
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := clientAddr(r, trusted); got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.1.2.3:5000"
	r.Header.Set("X-Forwarded-For", "198.51.100.7")
	if got := clientAddr(r, nil); got != "10.1.2.3" {
		t.Errorf("no trusted proxies: %q, want the peer", got)
	}
}

// A namespace's share bounds the slots of all its callers together; other
// namespaces, and requests of no namespace, keep theirs.
func TestSlotsNamespaceShare(t *testing.T) {
	s := newSlots(10, 5, 3)
	for i := range 3 {
		if r, limit := s.acquire(fmt.Sprintf("sa-%d", i), "team-a"); r == nil {
			t.Fatalf("slot %d of team-a: %s", i, limit)
		}
	}
	if r, limit := s.acquire("sa-9", "team-a"); r != nil || limit != `namespace "team-a"'s share of 3` {
		t.Fatalf("a 4th slot of team-a: %v, want refused by the namespace's share", limit)
	}
	release, _ := s.acquire("carol", "team-c")
	if release == nil {
		t.Fatal("team-c refused")
	}
	release()
	if r, _ := s.acquire("sa-9", ""); r == nil {
		t.Fatal("a request of no namespace refused")
	}
}

// A request counts against the namespace it names, else its caller's.
func TestRequestNamespace(t *testing.T) {
	sa := &kubeCaller{user: &authenticationv1.UserInfo{Username: "system:serviceaccount:team-a:ci"}}
	tok := &tokenCaller{subject: "bob", namespaces: Namespaces{"team-b"}}
	for name, tc := range map[string]struct {
		target string
		c      Caller
		want   string
	}{
		"the path's":               {"/api/v1/namespaces/team-c/tasks", sa, "team-c"},
		"the query's":              {"/api/v1/tasks?namespace=team-c", sa, "team-c"},
		"a ServiceAccount's":       {"/api/v1/tasks/x", sa, "team-a"},
		"a token's only namespace": {"/api/v1/tasks/x", tok, "team-b"},
		"none":                     {"/api/v1/tasks/x", &tokenCaller{subject: "ops", namespaces: Namespaces{"*"}}, ""},
	} {
		if got := requestNamespace(httptest.NewRequest(http.MethodGet, tc.target, nil), tc.c); got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
}
