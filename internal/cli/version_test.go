package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/internal/version"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client/clienttest"
)

func TestVersionFlagAndCommand(t *testing.T) {
	isolate(t)
	own := version.String(version.Get())
	kubetask(t, "", "--version").expect(t, 0, own+"\n")
	// No server configured: the client's version alone, no connection tried.
	kubetask(t, "", "version").expect(t, 0, "Client: "+own+"\n")

	srv := clienttest.New(t, clienttest.Options{})
	r := kubetask(t, "", "version", "--server", srv.URL, "-o", "json")
	r.expect(t, 0, "*")
	var got versions
	if err := json.Unmarshal([]byte(r.stdout.String()), &got); err != nil {
		t.Fatalf("version -o json: %v in %s", err, r.stdout.String())
	}
	if got.Client != version.Get() || got.Server == nil || *got.Server != version.Get() {
		t.Errorf("version -o json = %+v, want the client's and the server's version, both %+v", got, version.Get())
	}
	if s := r.stderr.String(); s != "" {
		t.Errorf("stderr %q, want nothing for a server of the same version", s)
	}
	kubetask(t, "", "version", "--client", "--server", srv.URL).expect(t, 0, "Client: "+own+"\n")
	kubetask(t, "", "version", "-o", "xml").expect(t, ExitUsage, "", "-o must be json or yaml")
}

// TestVersionSkewWarns: every client command warns once on stderr when the
// server differs in minor version, and goes on.
func TestVersionSkewWarns(t *testing.T) {
	isolate(t)
	other := api.Version{Version: "v9.3.0", GoVersion: "go1.26.8", Platform: "linux/arm64"}
	auth, err := server.NewTokenAuth([]server.Token{{Token: "s3cret", Subject: "admin", Namespaces: server.Namespaces{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := clienttest.New(t, clienttest.Options{Configure: func(c *server.Config) { c.Version, c.Auth = other, auth }})
	warning := "warning: the client's version " + version.Get().Version + " and the server's v9.3.0 differ in minor version: use a client of the server's minor version, v9.3 (server " + srv.URL + ")"

	r := kubetask(t, "", "list", "--server", srv.URL, "--token", "s3cret")
	r.expect(t, 0, "", "no tasks", warning)
	if n := strings.Count(r.stderr.String(), "warning:"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, r.stderr.String())
	}
	// A refusal carries the version too.
	kubetask(t, "", "get", "x", "--server", srv.URL).expect(t, 1, "", warning, "401 Unauthorized")
	kubetask(t, "", "version", "--server", srv.URL).expect(t, 0, "*", warning)
}
