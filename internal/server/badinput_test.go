package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
)

// TestBadInputChangesNothing: every kind of bad request gets its status and a
// problem+json answer naming what is wrong, and submits nothing.
func TestBadInputChangesNothing(t *testing.T) {
	const admin, teamA = "admin-token", "team-a-token"
	h := newHarness(t, func(c *server.Config) {
		auth, err := server.NewTokenAuth([]server.Token{
			{Token: admin, Subject: "admin", Namespaces: server.Namespaces{"*"}},
			{Token: teamA, Subject: "alice", Namespaces: server.Namespaces{"team-a"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
		c.MaxBodyBytes = 4096
	})
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	yaml := []string{"Content-Type", "application/yaml"}
	jsonCT := []string{"Content-Type", "application/json"}
	// Two tasks exist: "taken" (unfinished) in team-a, "other" in team-b.
	h.mustSubmit("team-a", taskDoc("first"), append(bearer(admin), "Idempotency-Key", "taken")...)
	h.mustSubmit("team-b", taskDoc("second"), append(bearer(admin), "Idempotency-Key", "other")...)

	submitPath := api.Prefix + "/namespaces/team-a/tasks"
	noImage := strings.Replace(taskDoc("x"), "        image: busybox:1.37\n", "", 1)
	unknownField := strings.Replace(taskDoc("x"), "  template:", "  tmplate: {}\n  template:", 1)
	for name, tc := range map[string]struct {
		method, path string
		body         string
		hdr          []string
		status       int
		detail       string // in the problem's detail
		location     string // one of its errors' location, when set
	}{
		"malformed YAML": {
			method: http.MethodPost, path: submitPath, body: "apiVersion: [v1", hdr: yaml,
			status: http.StatusBadRequest, detail: "malformed document", location: "body",
		},
		"malformed JSON": {
			method: http.MethodPost, path: submitPath, body: `{"apiVersion": "kubetask.dev/v1alpha1",`, hdr: jsonCT,
			status: http.StatusBadRequest, detail: "malformed JSON", location: "body",
		},
		"YAML sent as JSON": {
			method: http.MethodPost, path: submitPath, body: taskDoc("x"), hdr: jsonCT,
			status: http.StatusBadRequest, detail: "application/yaml",
		},
		"empty body": {
			method: http.MethodPost, path: submitPath, body: "  \n", hdr: yaml,
			status: http.StatusBadRequest, detail: "empty",
		},
		"unknown field with its path": {
			method: http.MethodPost, path: submitPath, body: unknownField, hdr: yaml,
			status: http.StatusUnprocessableEntity, detail: "invalid task", location: "body.spec.tmplate",
		},
		"invalid task with its path": {
			method: http.MethodPost, path: submitPath, body: noImage, hdr: yaml,
			status: http.StatusUnprocessableEntity, detail: "image", location: "body.spec.template.spec.containers[0].image",
		},
		"invalid pod with the pod's path": {
			method: http.MethodPost, path: submitPath, hdr: yaml,
			body:   "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: main\n",
			status: http.StatusUnprocessableEntity, location: "body.spec.containers[0].image",
		},
		"wrong kind": {
			method: http.MethodPost, path: submitPath, body: "apiVersion: v1\nkind: ConfigMap\n", hdr: yaml,
			status: http.StatusUnprocessableEntity, location: "body.kind",
		},
		"another namespace in the document": {
			method: http.MethodPost, path: submitPath, body: strings.Replace(taskDoc("x"), "  name: x", "  name: x\n  namespace: team-b", 1), hdr: yaml,
			status: http.StatusUnprocessableEntity, detail: "omit metadata.namespace", location: "body.metadata.namespace",
		},
		"body over the limit": {
			method: http.MethodPost, path: submitPath, body: taskDoc("x") + "# " + strings.Repeat("x", 5000) + "\n", hdr: yaml,
			status: http.StatusRequestEntityTooLarge, detail: "limit of 4096 bytes",
		},
		"wrong content type": {
			method: http.MethodPost, path: submitPath, body: taskDoc("x"), hdr: []string{"Content-Type", "text/plain"},
			status: http.StatusUnsupportedMediaType, detail: "application/json, application/yaml, text/yaml", location: "header.Content-Type",
		},
		"no content type": {
			method: http.MethodPost, path: submitPath, body: taskDoc("x"),
			status: http.StatusUnsupportedMediaType, location: "header.Content-Type",
		},
		"task ID with a slash": {
			method: http.MethodPost, path: submitPath + "?id=a%2Fb", body: taskDoc("x"), hdr: yaml,
			status: http.StatusBadRequest, detail: "has a '/'", location: "query.id",
		},
		"task ID with a control character": {
			method: http.MethodPost, path: submitPath + "?id=a%0Ab", body: taskDoc("x"), hdr: yaml,
			status: http.StatusBadRequest, detail: "control character", location: "query.id",
		},
		"task ID too long": {
			method: http.MethodPost, path: submitPath + "?id=" + strings.Repeat("k", 513), body: taskDoc("x"), hdr: yaml,
			status: http.StatusBadRequest, detail: "longer than 512", location: "query.id",
		},
		"task ID with white space at its end": {
			method: http.MethodPost, path: submitPath + "?id=a%20", body: taskDoc("x"), hdr: yaml,
			status: http.StatusBadRequest, detail: "white space", location: "query.id",
		},
		"task ID ..": {
			method: http.MethodPost, path: submitPath, body: taskDoc("x"), hdr: append([]string{"Idempotency-Key", ".."}, yaml...),
			status: http.StatusBadRequest, detail: "relative path segment", location: "header.Idempotency-Key",
		},
		"id and Idempotency-Key differ": {
			method: http.MethodPost, path: submitPath + "?id=a", body: taskDoc("x"), hdr: append([]string{"Idempotency-Key", "b"}, yaml...),
			status: http.StatusBadRequest, detail: "give the task ID once",
		},
		"unknown query parameter": {
			method: http.MethodPost, path: submitPath + "?ID=a", body: taskDoc("x"), hdr: yaml,
			status: http.StatusBadRequest, detail: "unknown query parameter", location: "query.ID",
		},
		"bad namespace": {
			method: http.MethodPost, path: api.Prefix + "/namespaces/Team_A/tasks", body: taskDoc("x"), hdr: yaml,
			status: http.StatusBadRequest, location: "path.ns",
		},
		"no token": {
			method: http.MethodPost, path: submitPath, body: taskDoc("x"), hdr: yaml, status: http.StatusUnauthorized,
			detail: "Authorization: Bearer",
		},
		"unknown token": {
			method: http.MethodPost, path: submitPath, body: taskDoc("x"), hdr: append(bearer("nope"), yaml...),
			status: http.StatusUnauthorized, detail: "unknown or expired bearer token",
		},
		"not a bearer token": {
			method: http.MethodGet, path: api.Prefix + "/tasks", hdr: []string{"Authorization", "Basic YTpi"},
			status: http.StatusUnauthorized, detail: "missing bearer token",
		},
		"forbidden namespace": {
			method: http.MethodPost, path: api.Prefix + "/namespaces/team-b/tasks", body: taskDoc("x"), hdr: append(bearer(teamA), yaml...),
			status: http.StatusForbidden, detail: `alice may not submit tasks in namespace "team-b"`,
		},
		"forbidden list": {
			method: http.MethodGet, path: api.Prefix + "/tasks?namespace=team-b", hdr: bearer(teamA),
			status: http.StatusForbidden, detail: `may not list tasks in namespace "team-b"`,
		},
		"task of a namespace the caller cannot see": {
			method: http.MethodGet, path: api.Prefix + "/tasks/other", hdr: bearer(teamA),
			status: http.StatusNotFound, detail: `no task "other"`,
		},
		"cancel of a task the caller cannot see": {
			method: http.MethodPost, path: api.Prefix + "/tasks/other/cancel", hdr: bearer(teamA),
			status: http.StatusNotFound, detail: `no task "other"`,
		},
		"unknown task": {
			method: http.MethodGet, path: api.Prefix + "/tasks/nope", hdr: bearer(admin),
			status: http.StatusNotFound, detail: `no task "nope"`,
		},
		"rerun of an unknown task": {
			method: http.MethodPost, path: api.Prefix + "/tasks/nope/rerun", hdr: bearer(admin),
			status: http.StatusNotFound, detail: `no task "nope"`,
		},
		"conflicting ID": {
			method: http.MethodPost, path: submitPath + "?id=taken", body: taskDoc("changed"), hdr: append(bearer(admin), yaml...),
			status: http.StatusConflict, detail: `task ID "taken" is taken by a different document`,
		},
		"conflicting Idempotency-Key in another namespace": {
			method: http.MethodPost, path: api.Prefix + "/namespaces/team-b/tasks", body: taskDoc("first"), hdr: append(bearer(admin), append(yaml, "Idempotency-Key", "taken")...),
			status: http.StatusConflict, detail: `"taken"`,
		},
		"rerun of an unfinished task": {
			method: http.MethodPost, path: api.Prefix + "/tasks/taken/rerun", hdr: bearer(admin),
			status: http.StatusConflict, detail: "not finished",
		},
		"bad continue token": {
			method: http.MethodGet, path: api.Prefix + "/tasks?continue=bm90LWEtdG9rZW4", hdr: bearer(admin),
			status: http.StatusBadRequest, detail: "bad continue token", location: "query.continue",
		},
		"label selector with inequality": {
			method: http.MethodGet, path: api.Prefix + "/tasks?labels=team!%3Da", hdr: bearer(admin),
			status: http.StatusBadRequest, detail: "only equality", location: "query.labels",
		},
		"label selector with a set": {
			method: http.MethodGet, path: api.Prefix + "/tasks?labels=team+in+(a,b)", hdr: bearer(admin),
			status: http.StatusBadRequest, location: "query.labels",
		},
		"bad phase": {
			method: http.MethodGet, path: api.Prefix + "/tasks?phase=Done", hdr: bearer(admin),
			status: http.StatusBadRequest, detail: "Pending, Running, Succeeded, Failed", location: "query.phase",
		},
		"bad limit and time, both reported": {
			method: http.MethodGet, path: api.Prefix + "/tasks?limit=1001&createdAfter=yesterday", hdr: bearer(admin),
			status: http.StatusBadRequest, detail: "2 bad request parameters", location: "query.createdAfter",
		},
		"misspelled filter": {
			method: http.MethodGet, path: api.Prefix + "/tasks?namespce=team-a", hdr: bearer(admin),
			status: http.StatusBadRequest, detail: "this endpoint takes namespace", location: "query.namespce",
		},
		"bad terminal": {
			method: http.MethodGet, path: api.Prefix + "/tasks?terminal=yes", hdr: bearer(admin),
			status: http.StatusBadRequest, location: "query.terminal",
		},
		"malformed watch cursor": {
			method: http.MethodGet, path: api.Prefix + "/watch?cursor=nonsense", hdr: bearer(admin),
			status: http.StatusBadRequest, detail: "malformed cursor", location: "query.cursor",
		},
		"bad log offset": {
			method: http.MethodGet, path: api.Prefix + "/tasks/taken/logs?offset=-1", hdr: bearer(admin),
			status: http.StatusBadRequest, location: "query.offset",
		},
		"unknown attempt": {
			method: http.MethodGet, path: api.Prefix + "/tasks/taken/logs?attempt=3", hdr: bearer(admin),
			status: http.StatusNotFound, detail: "no attempt 3", location: "query.attempt",
		},
		"unknown container": {
			method: http.MethodGet, path: api.Prefix + "/tasks/taken/logs?container=envoy", hdr: bearer(admin),
			status: http.StatusNotFound, detail: `keeps no log of container "envoy"`, location: "query.container",
		},
		"number too large for any field, in JSON": {
			method: http.MethodPost, path: submitPath, hdr: jsonCT,
			body: `{"apiVersion":"kubetask.dev/v1alpha1","kind":"Task","metadata":{"name":"x"},"spec":{"retries":{"limit":1e400},` +
				`"template":{"spec":{"containers":[{"name":"main","image":"busybox:1.37"}]}}}}`,
			status: http.StatusUnprocessableEntity, detail: "whole number", location: "body.spec.retries.limit",
		},
		"number too large for any field, in YAML": {
			method: http.MethodPost, path: submitPath, hdr: yaml,
			body:   strings.Replace(taskDoc("x"), "  template:", "  retries: {limit: 1e400}\n  template:", 1),
			status: http.StatusUnprocessableEntity, detail: "whole number", location: "body.spec.retries.limit",
		},
		"raw .. in the task path": {
			method: http.MethodGet, path: api.Prefix + "/tasks/../x", hdr: bearer(admin),
			status: http.StatusBadRequest, detail: "'.' or '..'", location: "path",
		},
		"raw . in the task path": {
			method: http.MethodPost, path: api.Prefix + "/tasks/./taken/cancel", hdr: bearer(admin),
			status: http.StatusBadRequest, detail: "'.' or '..'", location: "path",
		},
		"raw .. as the task ID": {
			method: http.MethodGet, path: api.Prefix + "/tasks/..", hdr: bearer(admin),
			status: http.StatusBadRequest, detail: "'.' or '..'", location: "path",
		},
		"repeated slash in the path": {
			method: http.MethodGet, path: api.Prefix + "//tasks", hdr: bearer(admin),
			status: http.StatusBadRequest, detail: "repeated '/'", location: "path",
		},
		"unknown endpoint": {
			method: http.MethodGet, path: api.Prefix + "/taks", hdr: bearer(admin),
			status: http.StatusNotFound, detail: "no endpoint GET /api/v1/taks",
		},
	} {
		t.Run(name, func(t *testing.T) {
			before := h.exec.submits.Load()
			recs, err := h.store.List(context.Background(), store.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			hdr := tc.hdr
			if name != "no token" && name != "not a bearer token" && !hasAuth(hdr) {
				hdr = append(bearer(admin), hdr...)
			}
			resp, b := h.do(tc.method, tc.path, body, hdr...)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %s, want %d: %s", resp.Status, tc.status, b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q, want application/problem+json", ct)
			}
			p := problemOf(t, b)
			if p.Status != tc.status || !strings.Contains(p.Detail, tc.detail) {
				t.Errorf("problem %+v: want status %d and detail containing %q", p, tc.status, tc.detail)
			}
			if tc.location != "" && !hasLocation(p, tc.location) {
				t.Errorf("problem %s: no error at %s", b, tc.location)
			}
			if n := h.exec.submits.Load(); n != before {
				t.Errorf("%d submissions reached the executor", n-before)
			}
			after, err := h.store.List(context.Background(), store.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(after) != len(recs) {
				t.Errorf("%d task records, want %d", len(after), len(recs))
			}
		})
	}
}

func hasAuth(hdr []string) bool {
	for i := 0; i < len(hdr); i += 2 {
		if hdr[i] == "Authorization" {
			return true
		}
	}
	return false
}

func hasLocation(p api.Problem, loc string) bool {
	for _, e := range p.Errors {
		if e.Location == loc {
			return true
		}
	}
	return false
}
