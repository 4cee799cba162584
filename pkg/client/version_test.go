package client_test

import (
	"sync"
	"testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/client/clienttest"
)

// TestServerVersion: Version reads GET /version without a token, and
// WithServerVersion hears the server's version once, from the first
// response, even a refusal.
func TestServerVersion(t *testing.T) {
	want := api.Version{Version: "v0.9.1", Commit: "abc", GoVersion: "go1.26.8", Platform: "linux/amd64"}
	auth, err := server.NewTokenAuth([]server.Token{{Token: "root", Subject: "admin", Namespaces: server.Namespaces{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := clienttest.New(t, clienttest.Options{Configure: func(c *server.Config) { c.Auth, c.Version = auth, want }})
	ctx := testContext(t)

	got, err := newClient(t, srv.URL).Version(ctx)
	if err != nil {
		t.Fatalf("Version without a token: %v", err)
	}
	if *got != want {
		t.Errorf("Version = %+v, want %+v", *got, want)
	}

	var mu sync.Mutex
	var heard []string
	c := newClient(t, srv.URL, client.WithServerVersion(func(v string) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, v)
	}))
	if _, err := c.Get(ctx, "nope"); !client.IsUnauthorized(err) {
		t.Fatalf("Get without a token: %v, want 401", err)
	}
	if _, err := c.Get(ctx, "nope"); !client.IsUnauthorized(err) {
		t.Fatalf("Get without a token: %v, want 401", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(heard) != 1 || heard[0] != want.Version {
		t.Errorf("WithServerVersion heard %q, want [%s] once", heard, want.Version)
	}
}
