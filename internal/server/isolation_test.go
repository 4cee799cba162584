package server_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
)

// The tests of this file check that no caller learns anything of a task in
// a namespace it may not see (issue 21 §3).

// isolationTokens are three token-mode callers: every namespace, team-a and
// team-b, team-a only.
func isolationTokens(t *testing.T) *server.TokenAuth {
	t.Helper()
	auth, err := server.NewTokenAuth([]server.Token{
		{Token: "root", Subject: "admin", Namespaces: server.Namespaces{"*"}},
		{Token: "ab", Subject: "ci", Namespaces: server.Namespaces{"team-a", "team-b"}},
		{Token: "a", Subject: "alice", Namespaces: server.Namespaces{"team-a"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return auth
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// A caller of several namespaces lists without a namespace filter: every
// page holds its namespaces' tasks only, full pages until the last, and no
// continue token names a task of another namespace. Before the store read
// the caller's namespaces, pages were read across all of them and filtered
// afterwards: the token carried the last record's ID whatever its
// namespace, and with labels= and namePrefix= it spelled out another
// team's task IDs (an empty page with a token said that a hidden task
// matched).
func TestListReadsOnlyTheCallersNamespaces(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Auth = isolationTokens(t) })
	hidden := map[string]bool{}
	var visible []string
	for i := range 4 { // interleaved, so team-c's tasks lie between the others in page order
		_, tk := h.submit("team-c", taskDoc(fmt.Sprintf("payroll-run-%d", i), "app", "payroll"), bearer("root")...)
		hidden[tk.ID] = true
		for _, ns := range []string{"team-a", "team-b"} {
			visible = append(visible, h.mustSubmit(ns, taskDoc(fmt.Sprintf("job-%d", i)), bearer("root")...).ID)
		}
	}
	// leaks reports the hidden IDs a continue token carries, in whatever
	// form it encodes them.
	leaks := func(cont string) []string {
		raw, _ := base64.RawURLEncoding.DecodeString(cont)
		var out []string
		for id := range hidden {
			if strings.Contains(cont, id) || strings.Contains(string(raw), id) {
				out = append(out, id)
			}
		}
		return out
	}
	list := func(query string) api.TaskList {
		t.Helper()
		resp, b := h.do(http.MethodGet, api.Prefix+"/tasks?"+query, nil, bearer("ab")...)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("list %s: %s %s", query, resp.Status, b)
		}
		var l api.TaskList
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, filters := range []string{"", "&labels=app=payroll", "&namePrefix=payroll-", "&labels=app=payroll&namePrefix=payroll-"} {
		for _, limit := range []int{1, 3} {
			var got []string
			cont := ""
			for page := 0; ; page++ {
				if page > 20 {
					t.Fatal("more than 20 pages")
				}
				q := fmt.Sprintf("limit=%d%s", limit, filters)
				if cont != "" {
					q += "&continue=" + cont
				}
				l := list(q)
				for _, tk := range l.Items {
					if tk.Namespace != "team-a" && tk.Namespace != "team-b" {
						t.Fatalf("filters %q: a task of %s listed: %+v", filters, tk.Namespace, tk)
					}
					got = append(got, tk.ID)
				}
				if l.Continue == "" {
					break
				}
				if len(l.Items) != limit {
					t.Errorf("filters %q, limit %d, page %d: %d tasks and a continue token: only the last page may be short (a hidden task took a place)", filters, limit, page, len(l.Items))
				}
				if ids := leaks(l.Continue); len(ids) > 0 {
					t.Fatalf("filters %q, limit %d, page %d: the continue token carries team-c's %v", filters, limit, page, ids)
				}
				cont = l.Continue
			}
			var want []string // the payroll filters match team-c's tasks only
			if filters == "" {
				want = slices.Clone(visible)
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("filters %q, limit %d: listed %v, want %v", filters, limit, got, want)
			}
		}
	}
}
