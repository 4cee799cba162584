package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
)

// TestKubeFlagsAreKubectls: kubetask's connection flags are cli-runtime's
// ConfigFlags (kubectl's): the same names, shorthands and types.
func TestKubeFlagsAreKubectls(t *testing.T) {
	type flag struct{ Short, Type string }
	set := func(add func(*pflag.FlagSet)) map[string]flag {
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		add(fs)
		m := map[string]flag{}
		fs.VisitAll(func(f *pflag.Flag) { m[f.Name] = flag{f.Shorthand, f.Value.Type()} })
		return m
	}
	want := set(genericclioptions.NewConfigFlags(true).AddFlags)
	got := set(newKubeFlags().addFlags)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("flags differ from ConfigFlags' (-ConfigFlags +kubetask):\n%s", d)
	}
}

// TestKubeFlagsSelectAsKubectl: for each command line, kubetask's flags
// select the same cluster, user, namespace and client settings from a
// kubeconfig as ConfigFlags does.
func TestKubeFlagsSelectAsKubectl(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "config")
	doc := `apiVersion: v1
kind: Config
current-context: a
clusters:
- name: ca
  cluster: {server: "https://a.example:6443", insecure-skip-tls-verify: true}
- name: cb
  cluster: {server: "https://b.example:6443", tls-server-name: b-name}
users:
- name: ua
  user: {token: token-a}
- name: ub
  user: {username: bob, password: secret}
contexts:
- name: a
  context: {cluster: ca, user: ua, namespace: na}
- name: b
  context: {cluster: cb, user: ub}
`
	if err := os.WriteFile(kubeconfig, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	type selected struct {
		Host, ServerName, Token, Username, Password, As, AsUID string
		AsGroups                                               []string
		AsExtra                                                map[string][]string
		Insecure, NoCompression                                bool
		Timeout                                                string
		Namespace                                              string
		NamespaceFromFlag                                      bool
	}
	read := func(c *rest.Config, ns string, explicit bool) selected {
		return selected{Host: c.Host, ServerName: c.ServerName, Token: c.BearerToken, Username: c.Username, Password: c.Password,
			As: c.Impersonate.UserName, AsUID: c.Impersonate.UID, AsGroups: c.Impersonate.Groups, AsExtra: c.Impersonate.Extra,
			Insecure: c.Insecure, NoCompression: c.DisableCompression, Timeout: c.Timeout.String(), Namespace: ns, NamespaceFromFlag: explicit}
	}
	cases := map[string][]string{
		"the current context":  nil,
		"another context":      {"--context", "b"},
		"a namespace":          {"-n", "jobs"},
		"a long namespace":     {"--namespace", "jobs", "--context", "b"},
		"a server":             {"-s", "https://c.example:1"},
		"a long server":        {"--server", "https://c.example:1", "--tls-server-name", "c-name"},
		"a token":              {"--token", "t0"},
		"a cluster and a user": {"--cluster", "cb", "--user", "ub"},
		"impersonation": {"--as", "alice", "--as-uid", "42", "--as-group", "g1", "--as-group", "g2",
			"--as-user-extra", "k=v1", "--as-user-extra", "k=v2", "--as-user-extra", "novalue"},
		"client settings":   {"--context", "b", "--insecure-skip-tls-verify", "--disable-compression", "--request-timeout", "5s"},
		"ignored cache dir": {"--cache-dir", "/tmp/x"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			args = append([]string{"--kubeconfig", kubeconfig}, args...)
			cf := genericclioptions.NewConfigFlags(true)
			fsWant := pflag.NewFlagSet("want", pflag.ContinueOnError)
			cf.AddFlags(fsWant)
			if err := fsWant.Parse(args); err != nil {
				t.Fatal(err)
			}
			wantCfg, err := cf.ToRESTConfig()
			if err != nil {
				t.Fatal(err)
			}
			wantNS, wantExplicit, err := cf.ToRawKubeConfigLoader().Namespace()
			if err != nil {
				t.Fatal(err)
			}
			kf := newKubeFlags()
			fsGot := pflag.NewFlagSet("got", pflag.ContinueOnError)
			kf.addFlags(fsGot)
			if err := fsGot.Parse(args); err != nil {
				t.Fatal(err)
			}
			gotCfg, err := kf.restConfig()
			if err != nil {
				t.Fatal(err)
			}
			gotNS, gotExplicit, err := kf.clientConfig().Namespace()
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(read(wantCfg, wantNS, wantExplicit), read(gotCfg, gotNS, gotExplicit)); d != "" {
				t.Errorf("selected differently (-ConfigFlags +kubetask):\n%s", d)
			}
			if *cf.Namespace != kf.namespace() {
				t.Errorf("-n read as %q, ConfigFlags %q", kf.namespace(), *cf.Namespace)
			}
		})
	}
}
