package service

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
)

// Config configures `kubetask serve`. The zero value of every field but the
// cluster connection is usable: Defaults fills it for a laptop (SQLite in the
// state directory, 127.0.0.1:8080, a generated token).
type Config struct {
	// Listen is the address to serve on. Default 127.0.0.1:8080. A
	// non-loopback address requires TLS and authentication.
	Listen string `json:"listen,omitempty"`
	// TLSCertFile and TLSKeyFile serve HTTPS when both are set.
	TLSCertFile string `json:"tlsCertFile,omitempty"`
	TLSKeyFile  string `json:"tlsKeyFile,omitempty"`
	// StateDir holds the SQLite store and the generated token file. Default
	// $KUBETASK_SERVE_DIR, else $XDG_STATE_HOME/kubetask/serve, else
	// ~/.local/state/kubetask/serve.
	StateDir string `json:"stateDir,omitempty"`
	// Store is "sqlite" (default: tasks.db in StateDir), "sqlite:PATH",
	// "postgres" (the URL from StoreURLFile, else $KUBETASK_STORE_URL, so
	// that it stays out of process listings), a postgres:// URL, or
	// "memory" (tests and demos: nothing survives a restart).
	Store string `json:"store,omitempty"`
	// StoreURLFile holds the PostgreSQL URL of Store "postgres" (a mounted
	// Secret, say): its first line.
	StoreURLFile string `json:"storeURLFile,omitempty"`
	// InstanceID names this service's executor (its pods' label and its
	// Lease). Default "kubetask-serve".
	InstanceID string `json:"instanceID,omitempty"`
	// Namespaces the service runs tasks in; empty means all.
	Namespaces []string `json:"namespaces,omitempty"`
	// DefaultNamespace for tasks that name none. Default "default".
	DefaultNamespace string `json:"defaultNamespace,omitempty"`
	// Parallelism, QPS and Burst are the executor's (defaults 100, 50, 100).
	Parallelism int     `json:"parallelism,omitempty"`
	QPS         float32 `json:"qps,omitempty"`
	Burst       int     `json:"burst,omitempty"`
	// NamespaceParallelism caps the task pods of each namespace named here
	// at once, beside Parallelism (each at least 1); namespaces not named get
	// DefaultNamespaceParallelism (0: Parallelism only).
	NamespaceParallelism        map[string]int `json:"namespaceParallelism,omitempty"`
	DefaultNamespaceParallelism int            `json:"defaultNamespaceParallelism,omitempty"`
	// NamespaceWeights are the namespaces' shares of the slots (default 1
	// each): under slotOrder fair a namespace of weight 2 holds up to twice
	// the slots of one of weight 1 while both have tasks waiting.
	NamespaceWeights map[string]int `json:"namespaceWeights,omitempty"`
	// SlotOrder is "fair" (default: the namespaces with waiting tasks take
	// free slots in turn) or "fifo" (one line for all namespaces).
	SlotOrder string `json:"slotOrder,omitempty"`
	// Retention is how long finished tasks and their logs are kept after
	// their last change. Default 720h (30 days); "0s" keeps them for ever.
	Retention Duration `json:"retention,omitempty"`
	// Auth is "token" (default: bearer tokens from TokenFile) or
	// "kubernetes" (TokenReview and SubjectAccessReview) or "none" (only on
	// a loopback address).
	Auth string `json:"auth,omitempty"`
	// TokenFile lists the accepted tokens (mode token). Default
	// tokens.yaml in StateDir, generated with one token for every namespace
	// when missing.
	TokenFile string `json:"tokenFile,omitempty"`
	// AuthAudiences are the audiences a Kubernetes token must be for (mode
	// kubernetes): with "kubetask", only tokens made for kubetask
	// (kubectl create token SA --audience kubetask) are accepted, and they
	// cannot be used against the API server. Default: the API server's
	// own audience (any token of the cluster).
	AuthAudiences []string `json:"authAudiences,omitempty"`
	// AuthQPS and AuthBurst are the client-side rate limits of the
	// TokenReviews and SubjectAccessReviews (mode kubernetes), a client of
	// their own apart from the executor's. Defaults 20 and 50.
	AuthQPS   float32 `json:"authQPS,omitempty"`
	AuthBurst int     `json:"authBurst,omitempty"`
	// MaxRequests bounds the requests served at once and
	// MaxRequestsPerCaller those of one caller; MaxStreams and
	// MaxStreamsPerCaller the open watches and log follows. Beyond: 429
	// with Retry-After. Defaults 1000, 100, 1000 and 50.
	MaxRequests          int `json:"maxRequests,omitempty"`
	MaxRequestsPerCaller int `json:"maxRequestsPerCaller,omitempty"`
	MaxStreams           int `json:"maxStreams,omitempty"`
	MaxStreamsPerCaller  int `json:"maxStreamsPerCaller,omitempty"`
	// MaxRequestsPerNamespace and MaxStreamsPerNamespace are one
	// namespace's shares of MaxRequests and MaxStreams (a stream counts
	// against the namespace it streams, a request against the one it
	// names, else its caller's). Defaults: half of each; -1: none.
	MaxRequestsPerNamespace int `json:"maxRequestsPerNamespace,omitempty"`
	MaxStreamsPerNamespace  int `json:"maxStreamsPerNamespace,omitempty"`
	// MaxUnfinishedTasksPerNamespace caps the tasks of one namespace not
	// finished yet (a submission beyond: 429), and MaxTasksPerNamespace
	// those it keeps, finished ones included until retention deletes them
	// (beyond: 403). Default 0: no cap.
	MaxUnfinishedTasksPerNamespace int64 `json:"maxUnfinishedTasksPerNamespace,omitempty"`
	MaxTasksPerNamespace           int64 `json:"maxTasksPerNamespace,omitempty"`
	// TrustedProxies are the reverse proxies (an Ingress controller, a
	// mesh sidecar: addresses or CIDRs) whose X-Forwarded-For names the
	// client address that refused tokens are counted by. Default none: the
	// peer's address.
	TrustedProxies []string `json:"trustedProxies,omitempty"`
	// BodyTimeout is how long a request body may take to arrive. Default
	// 30s.
	BodyTimeout Duration `json:"bodyTimeout,omitempty"`
	// WriteTimeout is how long a response (each write of a stream) may
	// wait for a client that does not read. Default 1m.
	WriteTimeout Duration `json:"writeTimeout,omitempty"`
	// ReloadInterval is how often the token file and the TLS certificate
	// and key are read again: a change applies without a restart. Default
	// 10s.
	ReloadInterval Duration `json:"reloadInterval,omitempty"`
	// LogCapBytes caps each archived container log. Default 64 MiB.
	LogCapBytes int64 `json:"logCapBytes,omitempty"`
	// ShutdownTimeout bounds the wait for in-flight requests on SIGTERM.
	// Default 10s.
	ShutdownTimeout Duration `json:"shutdownTimeout,omitempty"`
	// Shards, when positive, runs this process as one replica of a group
	// (named by InstanceID) sharing a PostgreSQL store: tasks belong to
	// Shards shards, each run by the replica that holds its Lease (see
	// docs/replicas.md). Every replica of a group must use the same number;
	// 0 (default) runs one executor holding the instance Lease. Parallelism
	// is divided among the shards.
	Shards int `json:"shards,omitempty"`
	// ReplicaID names this replica in its group's Leases. Default host name,
	// process ID and a random suffix (in a pod: its name is the host name).
	ReplicaID string `json:"replicaID,omitempty"`
	// LeaseNamespace holds the Leases (instance, shards, membership).
	// Default $POD_NAMESPACE (the downward API), else DefaultNamespace.
	LeaseNamespace string `json:"leaseNamespace,omitempty"`
	// LeaseDuration of those Leases: a replica that dies without handing
	// over leaves its shards for this long. Default 15s.
	LeaseDuration Duration `json:"leaseDuration,omitempty"`
	// PodSecurity is the Pod Security Standards level (privileged,
	// baseline or restricted) every task's pod must meet, checked at
	// submission (a 422 names each refused field). Default "baseline". A
	// namespace's own pod-security.kubernetes.io/enforce label wins where
	// it is stricter.
	PodSecurity string `json:"podSecurity,omitempty"`
	// NamespacePodSecurity sets the level of some namespaces (namespace:
	// level).
	NamespacePodSecurity map[string]string `json:"namespacePodSecurity,omitempty"`
	// ServiceAccounts lists, for some namespaces, the ServiceAccounts their
	// tasks may run as (namespace: [names]); a task that sets none runs as
	// "default". Namespaces not listed allow any.
	ServiceAccounts map[string][]string `json:"serviceAccounts,omitempty"`
	// RefuseSecrets lists the namespaces ("*": every one) whose tasks may
	// not name a Secret (env, envFrom, volumes, imagePullSecrets): a 422
	// names each field. Default none: a task's pod may take any Secret of
	// its namespace.
	RefuseSecrets []string `json:"refuseSecrets,omitempty"`
	// RefuseRuntimeClass lists the namespaces ("*": every one) whose tasks
	// may not set runtimeClassName. Default none.
	RefuseRuntimeClass []string `json:"refuseRuntimeClass,omitempty"`
	// PodEvents records Kubernetes Events on each task's pod for what a
	// person looks for with kubectl describe pod (executor.PodEventReasons:
	// the outcome and why, the result read, sidecars stopped, the pod
	// released once its logs are archived, a retry scheduled, a retry
	// waiting for a slot), through client-go's recorder and its rate limits.
	// Off by default: each is a write to the API server (create events is
	// in deploy/'s ClusterRole).
	PodEvents bool `json:"podEvents,omitempty"`
	// Clusters, when set, are the clusters the service runs tasks on
	// (docs/multicluster.md), each with an executor instance of its own,
	// InstanceID-NAME (its pod caches, fence, log capture, Parallelism and
	// namespace limits). A task goes to a cluster its spec.placement allows,
	// the one with the most free slots. Empty (default): the one cluster of
	// --kubeconfig and --context.
	Clusters []ClusterConfig `json:"clusters,omitempty"`
	// UnreachableAfter is how long a cluster's executor instance may not
	// hold its Lease with synced pod caches before the cluster is
	// Unreachable: no new placement, and its tasks without a pod move to
	// another cluster. Default 30s.
	UnreachableAfter Duration `json:"unreachableAfter,omitempty"`
	// Agent, when set (--agent NAME), makes this process the agent of
	// cluster NAME of Clusters (one marked agent): it runs that cluster's
	// executors only, with the cluster's kubeconfig (or, in a pod, its
	// service account), against the service's PostgreSQL store, and places
	// nothing. Default: the service.
	Agent string `json:"agent,omitempty"`
}

// ClusterConfig is one cluster of Config.Clusters.
type ClusterConfig struct {
	// Name is the cluster's name in records, placements and lists: 1 to 40
	// characters of a-z, 0-9 and '-'.
	Name string `json:"name"`
	// Kubeconfig is the kubeconfig file to reach it with. Default
	// $KUBECONFIG, else ~/.kube/config.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Context is the kubeconfig's context. Default its current context.
	Context string `json:"context,omitempty"`
	// Labels are the cluster's labels (region: eu, gpu: a100), which tasks'
	// spec.placement.clusterSelector match.
	Labels map[string]string `json:"labels,omitempty"`
	// Agent says an agent runs the cluster's executors (pull,
	// docs/multicluster.md): `kubetask serve --agent NAME` in that cluster,
	// with this configuration and the same PostgreSQL store. The service
	// holds no client for it (Kubeconfig and Context are the agent's), and
	// records the tasks it places there for the agent to run.
	Agent bool `json:"agent,omitempty"`
}

// Duration is a Go duration written as a string ("90s", "720h").
type Duration string

// Get returns the duration (0 when empty; Validate rejects malformed values).
func (d Duration) Get() time.Duration {
	v, _ := time.ParseDuration(string(d))
	return v
}

// EnvStateDir overrides the default state directory.
const EnvStateDir = "KUBETASK_SERVE_DIR"

// EnvStoreURL gives the PostgreSQL URL of Store "postgres" when
// StoreURLFile is not set.
const EnvStoreURL = "KUBETASK_STORE_URL"

// LoadFile reads a YAML or JSON configuration file strictly: an unknown field
// is an error that names it.
func LoadFile(path string) (Config, error) {
	var c Config
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("reading config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Defaults fills unset fields.
func (c *Config) Defaults() error {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.StateDir == "" {
		d, err := defaultStateDir()
		if err != nil {
			return err
		}
		c.StateDir = d
	}
	if c.Store == "" {
		c.Store = "sqlite"
	}
	if c.InstanceID == "" {
		c.InstanceID = "kubetask-serve"
	}
	if c.DefaultNamespace == "" {
		c.DefaultNamespace = "default"
	}
	if c.Retention == "" {
		c.Retention = "720h"
	}
	if c.Auth == "" {
		c.Auth = "token"
	}
	if c.TokenFile == "" && c.Auth == "token" {
		c.TokenFile = filepath.Join(c.StateDir, "tokens.yaml")
	}
	if c.LogCapBytes == 0 {
		c.LogCapBytes = 64 << 20
	}
	if c.ShutdownTimeout == "" {
		c.ShutdownTimeout = "10s"
	}
	if c.LeaseNamespace == "" {
		c.LeaseNamespace = os.Getenv("POD_NAMESPACE")
	}
	if c.LeaseNamespace == "" {
		c.LeaseNamespace = c.DefaultNamespace
	}
	if c.LeaseDuration == "" {
		c.LeaseDuration = "15s"
	}
	if c.AuthQPS == 0 {
		c.AuthQPS = 20
	}
	if c.AuthBurst == 0 {
		c.AuthBurst = 50
	}
	if c.BodyTimeout == "" {
		c.BodyTimeout = "30s"
	}
	if c.WriteTimeout == "" {
		c.WriteTimeout = "1m"
	}
	if c.ReloadInterval == "" {
		c.ReloadInterval = "10s"
	}
	if c.UnreachableAfter == "" {
		c.UnreachableAfter = "30s"
	}
	if c.PodSecurity == "" {
		c.PodSecurity = "baseline"
	}
	return nil
}

// Validate reports every problem of a defaulted configuration at once, each
// naming the field (and flag) and the fix.
func (c *Config) Validate() error {
	var errs []error
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		errs = append(errs, fmt.Errorf("listen %q: want HOST:PORT (--listen 127.0.0.1:8080)", c.Listen))
	}
	tls := c.TLSCertFile != "" || c.TLSKeyFile != ""
	if tls && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
		errs = append(errs, errors.New("tlsCertFile and tlsKeyFile go together (--tls-cert-file, --tls-key-file)"))
	}
	if err == nil && !loopback(host) && (!tls || c.Auth == "none") {
		errs = append(errs, fmt.Errorf("listen %q is not a loopback address: serving there needs TLS (--tls-cert-file, --tls-key-file) and authentication (--auth token or kubernetes)", c.Listen))
	}
	switch {
	case c.Store == "sqlite", c.Store == "memory", strings.HasPrefix(c.Store, "sqlite:") && len(c.Store) > len("sqlite:"):
	case c.isPostgres():
		if _, err := c.PostgresURL(); err != nil {
			errs = append(errs, err)
		}
	default:
		errs = append(errs, fmt.Errorf("store %q: want sqlite, sqlite:PATH, postgres (URL from --store-url-file or $%s), a postgres:// URL, or memory (--store)", redactURL(c.Store), EnvStoreURL))
	}
	if c.StoreURLFile != "" && c.Store != "postgres" {
		errs = append(errs, fmt.Errorf("storeURLFile is for store \"postgres\", not %q (--store postgres --store-url-file FILE)", redactURL(c.Store)))
	}
	for _, msg := range validation.IsValidLabelValue(c.InstanceID) {
		errs = append(errs, fmt.Errorf("instanceID %q: %s (--instance-id)", c.InstanceID, msg))
	}
	errs = append(errs, c.validateClusters()...)
	switch c.Auth {
	case "token", "kubernetes", "none":
	default:
		errs = append(errs, fmt.Errorf("auth %q: want token, kubernetes or none (--auth)", c.Auth))
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"retention", c.Retention}, {"shutdownTimeout", c.ShutdownTimeout}, {"leaseDuration", c.LeaseDuration},
		{"bodyTimeout", c.BodyTimeout}, {"writeTimeout", c.WriteTimeout}, {"reloadInterval", c.ReloadInterval},
		{"unreachableAfter", c.UnreachableAfter}} {
		if v, err := time.ParseDuration(string(d.v)); err != nil || v < 0 {
			errs = append(errs, fmt.Errorf("%s %q: want a non-negative Go duration such as 720h or 30s", d.name, d.v))
		}
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"parallelism", int64(c.Parallelism)}, {"burst", int64(c.Burst)}, {"logCapBytes", c.LogCapBytes}, {"authBurst", int64(c.AuthBurst)}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %d", f.name, f.v))
		}
	}
	errs = append(errs, c.validateSlots()...)
	if c.QPS < 0 || c.AuthQPS < 0 {
		errs = append(errs, fmt.Errorf("qps and authQPS must not be negative, got %v and %v", c.QPS, c.AuthQPS))
	}
	if len(c.AuthAudiences) > 0 && c.Auth != "kubernetes" {
		errs = append(errs, fmt.Errorf("authAudiences are for auth \"kubernetes\", not %q (--auth kubernetes --auth-audience kubetask)", c.Auth))
	}
	for _, a := range c.AuthAudiences {
		if strings.TrimSpace(a) == "" {
			errs = append(errs, errors.New("authAudiences: an empty audience: name each (--auth-audience kubetask)"))
		}
	}
	switch {
	case c.Shards < 0:
		errs = append(errs, fmt.Errorf("shards must not be negative, got %d (--shards)", c.Shards))
	case c.Shards > 0 && !c.isPostgres():
		errs = append(errs, fmt.Errorf("shards %d: replicas share their tasks through PostgreSQL: use --store postgres, not %q (or --shards 0 for one process)", c.Shards, redactURL(c.Store)))
	case c.Shards > 1000:
		errs = append(errs, fmt.Errorf("shards %d: at most 1000 (each is a Lease and an executor; a few per replica is plenty)", c.Shards))
	}
	if c.Shards > 0 {
		for _, msg := range validation.IsValidLabelValue(c.InstanceID + "-shard-" + fmt.Sprint(c.Shards-1)) {
			errs = append(errs, fmt.Errorf("instanceID %q names the replica group; its shard IDs must be label values: %s (--instance-id)", c.InstanceID, msg))
		}
	}
	if d := c.LeaseDuration.Get(); d != 0 && d < 3*time.Second {
		errs = append(errs, fmt.Errorf("leaseDuration %s: at least 3s (--lease-duration)", d))
	}
	for _, msg := range validation.IsDNS1123Label(c.LeaseNamespace) {
		errs = append(errs, fmt.Errorf("leaseNamespace %q: %s (--lease-namespace)", c.LeaseNamespace, msg))
	}
	errs = append(errs, c.validatePodPolicy()...)
	if c.MaxUnfinishedTasksPerNamespace < 0 || c.MaxTasksPerNamespace < 0 {
		errs = append(errs, fmt.Errorf("maxUnfinishedTasksPerNamespace and maxTasksPerNamespace must not be negative (0: no cap), got %d and %d (--max-unfinished-tasks-per-namespace, --max-tasks-per-namespace)",
			c.MaxUnfinishedTasksPerNamespace, c.MaxTasksPerNamespace))
	}
	if _, err := c.TrustedProxyPrefixes(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// TrustedProxyPrefixes parses TrustedProxies: CIDRs, or addresses (one
// address each).
func (c *Config) TrustedProxyPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, p := range c.TrustedProxies {
		if pr, err := netip.ParsePrefix(p); err == nil {
			out = append(out, pr.Masked())
			continue
		}
		a, err := netip.ParseAddr(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("trustedProxies: %q is neither an address nor a CIDR such as 10.0.0.0/8 (--trusted-proxies)", p))
			continue
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, errors.Join(errs...)
}

func validLevel(l string) bool { return l == "privileged" || l == "baseline" || l == "restricted" }

// validatePodPolicy checks the Pod Security levels and ServiceAccounts.
func (c *Config) validatePodPolicy() []error {
	var errs []error
	if !validLevel(c.PodSecurity) {
		errs = append(errs, fmt.Errorf("podSecurity %q: want privileged, baseline or restricted (--pod-security)", c.PodSecurity))
	}
	for ns, l := range c.NamespacePodSecurity {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, fmt.Errorf("namespacePodSecurity: namespace %q: %s (--namespace-pod-security NAMESPACE=LEVEL)", ns, msg))
		}
		if !validLevel(l) {
			errs = append(errs, fmt.Errorf("namespacePodSecurity[%s] %q: want privileged, baseline or restricted (--namespace-pod-security %s=LEVEL)", ns, l, ns))
		}
	}
	for ns, sas := range c.ServiceAccounts {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, fmt.Errorf("serviceAccounts: namespace %q: %s (--service-accounts NAMESPACE/NAME)", ns, msg))
		}
		if len(sas) == 0 {
			errs = append(errs, fmt.Errorf("serviceAccounts[%s]: list at least one ServiceAccount, or leave the namespace out to allow any", ns))
		}
		for _, sa := range sas {
			for _, msg := range validation.IsDNS1123Subdomain(sa) {
				errs = append(errs, fmt.Errorf("serviceAccounts[%s]: %q: %s (--service-accounts %s/NAME)", ns, sa, msg, ns))
			}
		}
	}
	for _, o := range []struct {
		field, flag string
		list        []string
	}{{"refuseSecrets", "--refuse-secrets", c.RefuseSecrets}, {"refuseRuntimeClass", "--refuse-runtime-class", c.RefuseRuntimeClass}} {
		for _, ns := range o.list {
			if ns == server.EveryNamespace {
				continue
			}
			for _, msg := range validation.IsDNS1123Label(ns) {
				errs = append(errs, fmt.Errorf("%s: namespace %q: %s, or %q for every namespace (%s)", o.field, ns, msg, server.EveryNamespace, o.flag))
			}
		}
	}
	return errs
}

// ParseServiceAccounts turns NAMESPACE/NAME items (the --service-accounts
// flag) into ServiceAccounts.
func ParseServiceAccounts(items []string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, it := range items {
		ns, sa, ok := strings.Cut(it, "/")
		if !ok || ns == "" || sa == "" {
			return nil, fmt.Errorf("--service-accounts %q: want NAMESPACE/NAME, e.g. team-a/runner", it)
		}
		out[ns] = append(out[ns], sa)
	}
	return out, nil
}

// PostgresURL is the PostgreSQL URL of a postgres store: Store itself, the
// first line of StoreURLFile, or $KUBETASK_STORE_URL.
func (c *Config) PostgresURL() (string, error) {
	if isPostgresURL(c.Store) {
		return c.Store, nil
	}
	if c.StoreURLFile != "" {
		b, err := os.ReadFile(c.StoreURLFile)
		if err != nil {
			return "", fmt.Errorf("storeURLFile: %w (--store-url-file)", err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		if u := strings.TrimSpace(line); u != "" {
			return u, nil
		}
		return "", fmt.Errorf("storeURLFile %s is empty: write the PostgreSQL URL in it (postgres://user:password@host/db)", c.StoreURLFile)
	}
	if u := os.Getenv(EnvStoreURL); u != "" {
		return u, nil
	}
	return "", fmt.Errorf("store \"postgres\" needs its URL: --store-url-file FILE (storeURLFile) or $%s", EnvStoreURL)
}

// isPostgres reports whether the configuration names a PostgreSQL store.
func (c *Config) isPostgres() bool { return c.Store == "postgres" || isPostgresURL(c.Store) }

func isPostgresURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// redactURL hides the password of a URL-shaped store setting.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		return u.Redacted()
	}
	return s
}

// StorePath is the SQLite file the configuration names ("" for memory).
func (c *Config) StorePath() string {
	switch {
	case c.Store == "memory", c.isPostgres():
		return ""
	case strings.HasPrefix(c.Store, "sqlite:"):
		return strings.TrimPrefix(c.Store, "sqlite:")
	default:
		return filepath.Join(c.StateDir, "tasks.db")
	}
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func defaultStateDir() (string, error) {
	if d := os.Getenv(EnvStateDir); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "kubetask", "serve"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no state directory: set --state-dir or $%s: %w", EnvStateDir, err)
	}
	return filepath.Join(home, ".local", "state", "kubetask", "serve"), nil
}

// validateSlots checks the namespaces' limits, weights and the slot order.
func (c *Config) validateSlots() []error {
	var errs []error
	known := func(field, flag string, m map[string]int) {
		for _, ns := range slices.Sorted(maps.Keys(m)) {
			if len(c.Namespaces) > 0 && !slices.Contains(c.Namespaces, ns) {
				errs = append(errs, fmt.Errorf("%s names namespace %q, which is not one the service runs tasks in (%s): add it to namespaces (--namespaces) or leave it out of %s", field, ns, strings.Join(c.Namespaces, ", "), flag))
			}
			if m[ns] < 1 {
				errs = append(errs, fmt.Errorf("%s[%s] must be at least 1, got %d (%s %s=N; leave the namespace out for no limit of its own)", field, ns, m[ns], flag, ns))
			}
		}
	}
	known("namespaceParallelism", "--namespace-parallelism", c.NamespaceParallelism)
	known("namespaceWeights", "--namespace-weights", c.NamespaceWeights)
	if c.DefaultNamespaceParallelism < 0 {
		errs = append(errs, fmt.Errorf("defaultNamespaceParallelism must not be negative (0: no limit of its own), got %d (--default-namespace-parallelism)", c.DefaultNamespaceParallelism))
	}
	switch c.SlotOrder {
	case "", string(executor.SlotOrderFair), string(executor.SlotOrderFIFO):
	default:
		errs = append(errs, fmt.Errorf("slotOrder %q: want fair or fifo (--slot-order)", c.SlotOrder))
	}
	return errs
}

// validateClusters checks Clusters: valid, distinct names whose instance
// IDs (with shards, each cluster's shard instances) are label values, and
// valid labels.
func (c *Config) validateClusters() []error {
	var errs []error
	agents := slices.ContainsFunc(c.Clusters, func(cl ClusterConfig) bool { return cl.Agent })
	switch {
	case c.Agent != "" && !slices.ContainsFunc(c.Clusters, func(cl ClusterConfig) bool { return cl.Name == c.Agent && cl.Agent }):
		errs = append(errs, fmt.Errorf("agent %q: not a cluster of clusters marked agent: true (--agent names the cluster this agent runs; mark it agent: true, as the service's configuration does)", c.Agent))
	case (agents || c.Agent != "") && !c.isPostgres():
		errs = append(errs, fmt.Errorf("clusters run by agents: the service and its agents share their tasks through PostgreSQL: use --store postgres, not %q", redactURL(c.Store)))
	}
	seen := map[string]bool{}
	for i, cl := range c.Clusters {
		field := fmt.Sprintf("clusters[%d]", i)
		if err := store.ValidateClusterName(cl.Name); err != nil {
			errs = append(errs, fmt.Errorf("%s.name: %w", field, err))
		} else {
			inst := c.InstanceID + "-" + cl.Name
			if c.Shards > 0 {
				inst = replica.ShardID(inst, c.Shards-1)
			}
			for _, msg := range validation.IsValidLabelValue(inst) {
				errs = append(errs, fmt.Errorf("%s.name %q: its executor instance %q must be a label value: %s (a shorter instanceID or name)", field, cl.Name, inst, msg))
			}
		}
		if seen[cl.Name] {
			errs = append(errs, fmt.Errorf("%s.name %q: named twice; each cluster needs a name of its own", field, cl.Name))
		}
		seen[cl.Name] = true
		for _, k := range slices.Sorted(maps.Keys(cl.Labels)) {
			for _, msg := range validation.IsQualifiedName(k) {
				errs = append(errs, fmt.Errorf("%s.labels key %q: %s", field, k, msg))
			}
			for _, msg := range validation.IsValidLabelValue(cl.Labels[k]) {
				errs = append(errs, fmt.Errorf("%s.labels[%s] %q: %s", field, k, cl.Labels[k], msg))
			}
		}
	}
	return errs
}
