package server_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("audit line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// Every mutating request writes exactly one audit line saying who, what,
// which task and the verdict, refusals and unauthenticated ones included;
// reads write none.
func TestMutatingRequestsAudited(t *testing.T) {
	var buf syncBuffer
	auth, err := server.NewTokenAuth([]server.Token{
		{Token: "ta", Subject: "alice", Namespaces: server.Namespaces{"team-a"}},
		{Token: "tb", Subject: "bob", Namespaces: server.Namespaces{"team-b"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *server.Config) {
		c.Auth = auth
		c.AuditLogger = slog.New(slog.NewJSONHandler(&buf, nil))
		c.NewID = func() string { return "t-1" }
	})
	alice, bob := []string{"Authorization", "Bearer ta"}, []string{"Authorization", "Bearer tb"}
	tk := h.mustSubmit("team-a", taskDoc("job"), alice...)
	h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID, nil, alice...)                      // a read: no line
	h.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/cancel", nil, bob...)             // refused (404)
	h.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/cancel", nil, alice...)           // allowed
	h.do(http.MethodPost, api.Prefix+"/namespaces/team-b/tasks", []byte("{}"), alice...) // refused (403)
	postYAML(h, "team-a", escapeDoc, alice...)                                           // invalid (422)
	h.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/cancel", nil, "Authorization", "Bearer nope")

	type want struct{ verdict, user, action, ns, task, created string }
	wants := []want{
		{"allowed", "alice", "submit", "team-a", "", "t-1"},
		{"refused", "bob", "cancel", "", "t-1", ""},
		{"allowed", "alice", "cancel", "team-a", "t-1", ""},
		{"refused", "alice", "submit", "team-b", "", ""},
		{"invalid", "alice", "submit", "team-a", "", ""},
		{"unauthenticated", "unauthenticated", "", "", "", ""},
	}
	lines := buf.lines(t)
	if len(lines) != len(wants) {
		t.Fatalf("%d audit lines, want %d: %v", len(lines), len(wants), lines)
	}
	for i, w := range wants {
		l := lines[i]
		who, _ := l["who"].(map[string]any)
		got := want{l["verdict"].(string), who["user"].(string), l["action"].(string), l["namespace"].(string), l["task"].(string), l["created"].(string)}
		if got != w || l["msg"] != "audit" || l["method"] != "POST" || l["code"] == nil {
			t.Errorf("line %d: %v, want %+v", i, l, w)
		}
	}
	if who := lines[0]["who"].(map[string]any); who["auth"] != "token" {
		t.Errorf("who: %v", who)
	}
}
