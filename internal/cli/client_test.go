package cli

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
)

func TestResolveConnection(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("xdg/kubetask/client.yaml", "server: https://from-xdg:8443\ntoken-file: token\nca-file: ca.pem\n")
	write("xdg/kubetask/token", "xdg-token\n")
	write("home/.config/kubetask/client.yaml", "server: http://from-home:8080\ntoken: home-token\n")
	explicit := write("explicit.yaml", "server: http://from-explicit:1\ntoken-file: /abs/missing\n")
	both := write("both.yaml", "token: a\ntoken-file: b\n")
	unknown := write("unknown.yaml", "sever: http://typo\n")
	emptyToken := write("empty.yaml", "token-file: empty\n")
	write("empty", "\n")
	insecure := write("insecure.yaml", "insecure-skip-tls-verify: true\n")

	for name, tc := range map[string]struct {
		flags   clientFlags
		changed []string
		env     map[string]string
		want    connection
		err     string // substring of the error; "" for none
	}{
		"nothing: the default server, no token": {
			env:  map[string]string{"HOME": filepath.Join(dir, "nowhere")},
			want: connection{Server: client.DefaultServer, ServerFrom: "the default"},
		},
		"no HOME and no XDG: no file": {
			want: connection{Server: client.DefaultServer, ServerFrom: "the default"},
		},
		"the XDG file, relative paths from its directory": {
			env: map[string]string{"XDG_CONFIG_HOME": filepath.Join(dir, "xdg"), "HOME": filepath.Join(dir, "home")},
			want: connection{
				Server: "https://from-xdg:8443", ServerFrom: "the client config " + filepath.Join(dir, "xdg/kubetask/client.yaml"),
				Token: "xdg-token", TokenFrom: "the client config " + filepath.Join(dir, "xdg/kubetask/client.yaml"),
				CAFile: filepath.Join(dir, "xdg/kubetask/ca.pem"), ConfigFile: filepath.Join(dir, "xdg/kubetask/client.yaml"),
			},
		},
		"~/.config without XDG_CONFIG_HOME": {
			env: map[string]string{"HOME": filepath.Join(dir, "home")},
			want: connection{
				Server: "http://from-home:8080", ServerFrom: "the client config " + filepath.Join(dir, "home/.config/kubetask/client.yaml"),
				Token: "home-token", TokenFrom: "the client config " + filepath.Join(dir, "home/.config/kubetask/client.yaml"),
				ConfigFile: filepath.Join(dir, "home/.config/kubetask/client.yaml"),
			},
		},
		"environment over the file": {
			env: map[string]string{"HOME": filepath.Join(dir, "home"), EnvServer: "http://from-env:1", EnvToken: "env-token", EnvCAFile: "/env/ca.pem"},
			want: connection{
				Server: "http://from-env:1", ServerFrom: "$" + EnvServer, Token: "env-token", TokenFrom: "$" + EnvToken,
				CAFile: "/env/ca.pem", ConfigFile: filepath.Join(dir, "home/.config/kubetask/client.yaml"),
			},
		},
		"flags over the environment": {
			flags:   clientFlags{server: "http://from-flag:1", token: "flag-token", caFile: "/flag/ca.pem"},
			changed: []string{"server", "token", "ca-file"},
			env:     map[string]string{"HOME": filepath.Join(dir, "home"), EnvServer: "http://from-env:1", EnvToken: "env-token"},
			want: connection{
				Server: "http://from-flag:1", ServerFrom: "--server", Token: "flag-token", TokenFrom: "--token",
				CAFile: "/flag/ca.pem", ConfigFile: filepath.Join(dir, "home/.config/kubetask/client.yaml"),
			},
		},
		"an empty --token given on purpose wins": {
			flags:   clientFlags{token: ""},
			changed: []string{"token"},
			env:     map[string]string{"HOME": filepath.Join(dir, "home")},
			want: connection{
				Server: "http://from-home:8080", ServerFrom: "the client config " + filepath.Join(dir, "home/.config/kubetask/client.yaml"),
				TokenFrom: "--token", ConfigFile: filepath.Join(dir, "home/.config/kubetask/client.yaml"),
			},
		},
		"--client-config over the environment's and XDG's": {
			flags:   clientFlags{config: unknown},
			changed: []string{"client-config"},
			env:     map[string]string{EnvClientConfig: explicit, "XDG_CONFIG_HOME": filepath.Join(dir, "xdg")},
			err:     `unknown field "sever"`,
		},
		"$KUBETASK_CLIENT_CONFIG over XDG's": {
			env: map[string]string{EnvClientConfig: explicit, "XDG_CONFIG_HOME": filepath.Join(dir, "xdg")},
			err: "token-file: open /abs/missing",
		},
		"a missing --client-config is an error": {
			flags:   clientFlags{config: filepath.Join(dir, "missing.yaml")},
			changed: []string{"client-config"},
			err:     "reading the client config",
		},
		"token and token-file": {
			env: map[string]string{EnvClientConfig: both},
			err: "give token or token-file, not both",
		},
		"an empty token file": {
			env: map[string]string{EnvClientConfig: emptyToken},
			err: "is empty",
		},
		"insecure from the file": {
			env:  map[string]string{EnvClientConfig: insecure},
			want: connection{Server: client.DefaultServer, ServerFrom: "the default", Insecure: true, ConfigFile: insecure},
		},
		"insecure from the file, refused by the flag": {
			flags:   clientFlags{insecure: false},
			changed: []string{"insecure-skip-tls-verify"},
			env:     map[string]string{EnvClientConfig: insecure},
			want:    connection{Server: client.DefaultServer, ServerFrom: "the default", ConfigFile: insecure},
		},
	} {
		t.Run(name, func(t *testing.T) {
			changed := func(n string) bool {
				for _, c := range tc.changed {
					if c == n {
						return true
					}
				}
				return false
			}
			got, err := resolveConnection(&tc.flags, changed, func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("connection (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExplain(t *testing.T) {
	unauthorized := &client.Error{StatusCode: 401, Problem: api.Problem{Status: 401, Title: "Unauthorized", Detail: "missing bearer token"}}
	refused := fmt.Errorf("listing tasks: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
	for name, tc := range map[string]struct {
		conn connection
		err  error
		want []string // substrings of the message
	}{
		"401 without a token": {
			conn: connection{Server: "http://s", ServerFrom: "the default"},
			err:  unauthorized,
			want: []string{"401 Unauthorized: the server wants a bearer token: give the token printed by `kubetask serve` with --token or $KUBETASK_TOKEN", "Server: missing bearer token"},
		},
		"401 with a token from the file": {
			conn: connection{Token: "x", TokenFrom: "the client config /c.yaml", ConfigFile: "/c.yaml"},
			err:  unauthorized,
			want: []string{"the server does not know the token from the client config /c.yaml", "(or token/token-file in /c.yaml)"},
		},
		"connection refused": {
			conn: connection{Server: "http://127.0.0.1:8080", ServerFrom: "the default"},
			err:  refused,
			want: []string{"cannot reach the kubetask server at http://127.0.0.1:8080 (from the default): start it with `kubetask serve`, or give its address with --server or $KUBETASK_SERVER", "connection refused"},
		},
		"other answers as they are": {
			err:  &client.Error{StatusCode: 404, Problem: api.Problem{Status: 404, Title: "Not Found", Detail: `no task "x"`}},
			want: []string{`404 Not Found: no task "x"`},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := tc.conn.explain(tc.err)
			if !errors.Is(got, tc.err) {
				t.Errorf("the explained error does not wrap the original")
			}
			for _, w := range tc.want {
				if !strings.Contains(got.Error(), w) {
					t.Errorf("%q\ndoes not contain %q", got, w)
				}
			}
		})
	}
}

func TestDocumentNamespace(t *testing.T) {
	for doc, want := range map[string]string{
		"metadata:\n  namespace: jobs\n":   "jobs",
		`{"metadata":{"namespace":"x"}}`:   "x",
		"metadata:\n  name: n\n":           "",
		"{not yaml":                        "",
		"kind: Pod\nmetadata: [weird]\n":   "",
		"apiVersion: v1\nkind: Pod\n":      "",
		"metadata: {namespace: flow}\n":    "flow",
		"# comment only\n":                 "",
		"metadata:\n  namespace: \"\"\n":   "",
		"metadata:\n  namespace: a\n---\n": "a",
	} {
		if got := documentNamespace([]byte(doc)); got != want {
			t.Errorf("documentNamespace(%q) = %q, want %q", doc, got, want)
		}
	}
}
