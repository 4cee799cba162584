package service

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigDefaultsAndValidation(t *testing.T) {
	cases := map[string]struct {
		edit func(*Config)
		errs []string // fragments every reported problem must be among
	}{
		"defaults are valid":   {edit: func(*Config) {}},
		"loopback without tls": {edit: func(c *Config) { c.Listen = "[::1]:9000" }},
		"all interfaces without TLS": {edit: func(c *Config) { c.Listen = "0.0.0.0:8080" },
			errs: []string{"not a loopback address"}},
		"TLS without auth off loopback": {edit: func(c *Config) {
			c.Listen, c.TLSCertFile, c.TLSKeyFile, c.Auth = "0.0.0.0:8443", "c", "k", "none"
		}, errs: []string{"not a loopback address"}},
		"cert without key": {edit: func(c *Config) { c.TLSCertFile = "c" }, errs: []string{"go together"}},
		"every problem at once": {edit: func(c *Config) {
			c.Store, c.Auth, c.Retention, c.Parallelism, c.InstanceID = "mysql", "ldap", "a month", -1, "no spaces"
		}, errs: []string{"store \"mysql\"", "auth \"ldap\"", "retention", "parallelism", "instanceID"}},
		"bad listen": {edit: func(c *Config) { c.Listen = "8080" }, errs: []string{"HOST:PORT"}},
		"replicas on postgres": {edit: func(c *Config) {
			c.Store, c.Shards, c.LeaseDuration = "postgres://db/kubetask", 12, "6s"
		}},
		"replicas need postgres": {edit: func(c *Config) { c.Shards = 4 }, errs: []string{"--store postgres"}},
		"shards and leases out of range": {edit: func(c *Config) {
			c.Store, c.Shards, c.LeaseDuration, c.LeaseNamespace = "postgres://db/k", 1001, "1s", "Not_A_Namespace"
		}, errs: []string{"at most 1000", "leaseDuration", "leaseNamespace"}},
		"namespace limits and weights": {edit: func(c *Config) {
			c.Namespaces, c.NamespaceParallelism, c.DefaultNamespaceParallelism = []string{"team-a", "team-b"}, map[string]int{"team-a": 20}, 5
			c.NamespaceWeights, c.SlotOrder = map[string]int{"team-b": 2}, "fifo"
		}},
		"namespace limits out of range": {edit: func(c *Config) {
			c.NamespaceParallelism, c.DefaultNamespaceParallelism = map[string]int{"team-a": 0}, -1
			c.NamespaceWeights, c.SlotOrder = map[string]int{"team-b": -2}, "lifo"
		}, errs: []string{"namespaceParallelism[team-a] must be at least 1", "defaultNamespaceParallelism must not be negative",
			"namespaceWeights[team-b] must be at least 1", `slotOrder "lifo"`}},
		"a limit for a namespace the service does not run": {edit: func(c *Config) {
			c.Namespaces, c.NamespaceParallelism = []string{"team-a"}, map[string]int{"team-c": 3}
		}, errs: []string{`namespaceParallelism names namespace "team-c", which is not one the service runs tasks in (team-a)`}},
		"negative shards":              {edit: func(c *Config) { c.Shards = -1 }, errs: []string{"shards must not be negative"}},
		"audiences in kubernetes mode": {edit: func(c *Config) { c.Auth, c.AuthAudiences = "kubernetes", []string{"kubetask"} }},
		"audiences need kubernetes":    {edit: func(c *Config) { c.AuthAudiences = []string{"kubetask"} }, errs: []string{"--auth kubernetes --auth-audience"}},
		"bad limits and timeouts": {edit: func(c *Config) { c.AuthQPS, c.AuthBurst, c.BodyTimeout, c.WriteTimeout = -1, -1, "soon", "-1s" },
			errs: []string{"authQPS", "authBurst", "bodyTimeout", "writeTimeout"}},
		"pod policy": {edit: func(c *Config) {
			c.PodSecurity, c.NamespacePodSecurity, c.ServiceAccounts = "restricted", map[string]string{"team-a": "privileged"}, map[string][]string{"team-a": {"runner"}}
		}},
		"bad pod policy": {edit: func(c *Config) {
			c.PodSecurity, c.NamespacePodSecurity, c.ServiceAccounts = "root", map[string]string{"team-a": "lax"}, map[string][]string{"team-b": {"Not_An_SA"}, "team-c": {}}
		}, errs: []string{`podSecurity "root"`, "namespacePodSecurity[team-a]", "serviceAccounts[team-b]", "serviceAccounts[team-c]: list at least one"}},
		"refused Secrets and runtimeClassName": {edit: func(c *Config) {
			c.RefuseSecrets, c.RefuseRuntimeClass = []string{"team-a", "team-b"}, []string{"*"}
		}},
		"refusals of bad namespaces": {edit: func(c *Config) {
			c.RefuseSecrets, c.RefuseRuntimeClass = []string{"Team_A"}, []string{"-x"}
		}, errs: []string{`refuseSecrets: namespace "Team_A"`, `refuseRuntimeClass: namespace "-x"`, "(--refuse-runtime-class)"}},
		"clusters": {edit: func(c *Config) {
			c.Clusters = []ClusterConfig{{Name: "east", Context: "east", Labels: map[string]string{"region": "us"}}, {Name: "eu-west-1", Kubeconfig: "/k"}}
		}},
		"bad clusters": {edit: func(c *Config) {
			c.Clusters = []ClusterConfig{{Name: "East"}, {Name: "west", Labels: map[string]string{"bad key!": "x", "region": "not ok"}}, {Name: "west"}, {Name: ""}}
		}, errs: []string{`clusters[0].name: invalid cluster: name "East"`, `clusters[1].labels key "bad key!"`, `clusters[1].labels[region] "not ok"`,
			`clusters[2].name "west": named twice`, `clusters[3].name: invalid cluster: name ""`}},
		"clusters' instance IDs too long": {edit: func(c *Config) {
			c.InstanceID, c.Clusters = strings.Repeat("i", 40), []ClusterConfig{{Name: strings.Repeat("c", 30)}}
		}, errs: []string{"must be a label value", "a shorter instanceID or name"}},
		"clusters with shards whose instances are too long": {edit: func(c *Config) {
			c.Store, c.Shards, c.InstanceID, c.Clusters = "postgres://db/k", 200, strings.Repeat("k", 40), []ClusterConfig{{Name: "east-region-1"}}
		}, errs: []string{`clusters[0].name "east-region-1": its executor instance "` + strings.Repeat("k", 40) + `-east-region-1-shard-199" must be a label value`}},
		"an agent's cluster": {edit: func(c *Config) {
			c.Store, c.Agent, c.Clusters = "postgres://db/k", "west", []ClusterConfig{{Name: "east"}, {Name: "west", Agent: true}}
		}},
		"an agent of a cluster not marked agent": {edit: func(c *Config) {
			c.Store, c.Agent, c.Clusters = "postgres://db/k", "east", []ClusterConfig{{Name: "east"}, {Name: "west", Agent: true}}
		}, errs: []string{`agent "east": not a cluster of clusters marked agent: true`}},
		"agents without PostgreSQL": {edit: func(c *Config) {
			c.Clusters = []ClusterConfig{{Name: "east"}, {Name: "west", Agent: true}}
		}, errs: []string{"clusters run by agents: the service and its agents share their tasks through PostgreSQL"}},
		"group name too long": {edit: func(c *Config) { c.Store, c.Shards, c.InstanceID = "postgres://db/k", 10, strings.Repeat("g", 60) }, errs: []string{"names the replica group"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := Config{StateDir: t.TempDir()}
			if err := c.Defaults(); err != nil {
				t.Fatal(err)
			}
			tc.edit(&c)
			err := c.Validate()
			if len(tc.errs) == 0 {
				if err != nil {
					t.Fatalf("unexpected: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %v", tc.errs)
			}
			for _, want := range tc.errs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

func TestLoadFileIsStrict(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "serve.yaml")
	if err := os.WriteFile(p, []byte("listen: 127.0.0.1:9090\nparalelism: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(p); err == nil || !strings.Contains(err.Error(), "paralelism") {
		t.Errorf("err %v, want one naming the unknown field", err)
	}
	if err := os.WriteFile(p, []byte("listen: 127.0.0.1:9090\nparallelism: 3\nnamespaces: [a, b]\nnamespaceParallelism: {a: 2}\nnamespaceWeights: {b: 3}\nslotOrder: fifo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadFile(p)
	if err != nil || c.Parallelism != 3 || len(c.Namespaces) != 2 || c.NamespaceParallelism["a"] != 2 || c.NamespaceWeights["b"] != 3 || c.SlotOrder != "fifo" {
		t.Errorf("config %+v, err %v", c, err)
	}
}

// Where a postgres store's URL comes from, and the problems of each way.
func TestPostgresURL(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "url")
	if err := os.WriteFile(file, []byte("postgres://kt:secret@db:5432/tasks\nignored\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		store, file, env string
		url              string // the URL; "" for an error
		errs             []string
	}{
		"from the file":                  {store: "postgres", file: file, env: "postgres://env/db", url: "postgres://kt:secret@db:5432/tasks"},
		"from the environment":           {store: "postgres", env: "postgres://env/db", url: "postgres://env/db"},
		"literal":                        {store: "postgresql://h/db", url: "postgresql://h/db"},
		"neither file nor environment":   {store: "postgres", errs: []string{"--store-url-file", EnvStoreURL}},
		"missing file":                   {store: "postgres", file: filepath.Join(dir, "nope"), errs: []string{"storeURLFile", "no such file"}},
		"empty file":                     {store: "postgres", file: empty, errs: []string{"is empty"}},
		"file without postgres":          {store: "sqlite", file: file, errs: []string{"storeURLFile is for store \"postgres\""}},
		"a bad store hides its password": {store: "mysql://u:hunter2@h/db", errs: []string{"xxxxx"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Setenv(EnvStoreURL, tc.env)
			c := Config{StateDir: dir, Store: tc.store, StoreURLFile: tc.file}
			if err := c.Defaults(); err != nil {
				t.Fatal(err)
			}
			err := c.Validate()
			if tc.url != "" {
				u, uerr := c.PostgresURL()
				if err != nil || uerr != nil || u != tc.url {
					t.Errorf("URL %q (%v, %v), want %q", u, err, uerr, tc.url)
				}
				if c.StorePath() != "" {
					t.Errorf("a postgres store has a SQLite path %q", c.StorePath())
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %v", tc.errs)
			}
			for _, want := range tc.errs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "secret") {
				t.Errorf("the error shows a password: %v", err)
			}
		})
	}
}

// TestShardLimits: each shard of a replica group gets its part of every
// namespace's limit, rounded up.
func TestShardLimits(t *testing.T) {
	limits, def := shardLimits(map[string]int{"a": 20, "b": 1}, 5, 3)
	if limits["a"] != 7 || limits["b"] != 1 || def != 2 {
		t.Errorf("limits %v, default %d; want a 7, b 1, default 2", limits, def)
	}
	if _, def := shardLimits(nil, 0, 4); def != 0 {
		t.Errorf("no default limit became %d", def)
	}
}

func TestParseServiceAccounts(t *testing.T) {
	got, err := ParseServiceAccounts([]string{"team-a/runner", "team-a/builder", "team-b/default"})
	if err != nil || len(got) != 2 || strings.Join(got["team-a"], ",") != "runner,builder" || got["team-b"][0] != "default" {
		t.Errorf("%v %v", got, err)
	}
	for _, bad := range []string{"runner", "team-a/", "/runner"} {
		if _, err := ParseServiceAccounts([]string{bad}); err == nil || !strings.Contains(err.Error(), "NAMESPACE/NAME") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestTrustedProxies(t *testing.T) {
	c := Config{TrustedProxies: []string{"10.0.0.0/8", "192.0.2.7", "10.1.2.3/16", "::ffff:192.0.2.8"}}
	got, err := c.TrustedProxyPrefixes()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.0.2.7/32", "10.1.0.0/16", "192.0.2.8/32"}
	for i, p := range got {
		if p.String() != want[i] {
			t.Errorf("%q: %s, want %s", c.TrustedProxies[i], p, want[i])
		}
	}
	c.TrustedProxies = []string{"ingress.local"}
	if _, err := c.TrustedProxyPrefixes(); err == nil || !strings.Contains(err.Error(), "--trusted-proxies") {
		t.Errorf("a host name: %v, want an error naming the flag", err)
	}
}
