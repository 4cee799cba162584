package server_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/internal/version"
	"github.com/kubetask/kubetask/pkg/api"
)

// TestVersion: GET /api/v1/version answers without a token, and every
// response, a refusal included, names the server's version in a header.
func TestVersion(t *testing.T) {
	want := api.Version{Version: "v0.7.2", Commit: "0123abc", Date: "2026-12-03T11:00:00Z", GoVersion: "go1.26.8", Platform: "linux/arm64"}
	h := newHarness(t, func(c *server.Config) {
		auth, err := server.NewTokenAuth([]server.Token{{Token: "root", Subject: "root", Namespaces: server.Namespaces{"*"}}})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth, c.Version = auth, want
	})
	resp, body := h.do(http.MethodGet, api.Prefix+"/version", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /version without a token: %s %s", resp.Status, body)
	}
	var got api.Version
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("GET /version: %v in %s", err, body)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("GET /version (-want +got):\n%s", d)
	}
	for _, path := range []string{api.Prefix + "/version", api.Prefix + "/tasks", "/healthz", "/nothing"} {
		resp, _ := h.do(http.MethodGet, path, nil)
		if v := resp.Header.Get(api.HeaderVersion); v != want.Version {
			t.Errorf("GET %s (%s): %s = %q, want %q", path, resp.Status, api.HeaderVersion, v, want.Version)
		}
	}
}

// TestVersionDefault: a server given no version reports the binary's.
func TestVersionDefault(t *testing.T) {
	h := newHarness(t, nil)
	resp, body := h.do(http.MethodGet, api.Prefix+"/version", nil)
	var got api.Version
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("GET /version: %s: %v in %s", resp.Status, err, body)
	}
	if d := cmp.Diff(version.Get(), got); d != "" {
		t.Errorf("GET /version (-want +got):\n%s", d)
	}
}
