package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubetask/kubetask/internal/service"
)

// newServeCommand builds `kubetask serve`: the task service.
func newServeCommand() *cobra.Command {
	cf := newKubeFlags()
	var (
		configFile    string
		flags         service.Config
		retention     time.Duration
		shutdown      time.Duration
		leaseDuration time.Duration
		namespaces    []string
		audiences     []string
		bodyTimeout   time.Duration
		writeTimeout  time.Duration
		// reloadInterval of the token file and TLS certificate.
		reloadInterval time.Duration
		nsLevels       map[string]string
		cpuProfile     string
		accounts       []string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the task API: submit, watch, logs that outlive the pod, history (SQLite by default)",
		Long: `kubetask serve runs the executor with a durable store and serves the task API
on /api/v1 (OpenAPI at /api/v1/openapi.json), with /metrics, /healthz and /readyz.

Defaults work on a laptop: SQLite in the state directory, 127.0.0.1:8080, a
token generated on the first start and printed. Every setting can come from a
YAML file (--config); flags given on the command line override it.

SIGTERM (or Ctrl-C) stops accepting requests, finishes those in flight, and
stops the executor leaving running pods under their finalizer: the next start
adopts them and their logs go on from where the archive ends.`,
		Example: `  # On a laptop, against the current kubeconfig context:
  kubetask serve

  # The local cluster, another port, tasks kept 7 days:
  kubetask serve --kubeconfig "$(kubetask cluster kubeconfig)" --listen 127.0.0.1:9090 --retention 168h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tune, err := tunesGC(os.Getenv("GOGC"))
			if err != nil {
				return err
			}
			if cpuProfile != "" {
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			cfg := service.Config{}
			if configFile != "" {
				if cfg, err = service.LoadFile(configFile); err != nil {
					return err
				}
			}
			set := func(name string, apply func()) {
				if cmd.Flags().Changed(name) {
					apply()
				}
			}
			set("listen", func() { cfg.Listen = flags.Listen })
			set("tls-cert-file", func() { cfg.TLSCertFile = flags.TLSCertFile })
			set("tls-key-file", func() { cfg.TLSKeyFile = flags.TLSKeyFile })
			set("state-dir", func() { cfg.StateDir = flags.StateDir })
			set("store", func() { cfg.Store = flags.Store })
			set("store-url-file", func() { cfg.StoreURLFile = flags.StoreURLFile })
			set("instance-id", func() { cfg.InstanceID = flags.InstanceID })
			set("namespaces", func() { cfg.Namespaces = namespaces })
			set("parallelism", func() { cfg.Parallelism = flags.Parallelism })
			set("namespace-parallelism", func() { cfg.NamespaceParallelism = flags.NamespaceParallelism })
			set("default-namespace-parallelism", func() { cfg.DefaultNamespaceParallelism = flags.DefaultNamespaceParallelism })
			set("namespace-weights", func() { cfg.NamespaceWeights = flags.NamespaceWeights })
			set("slot-order", func() { cfg.SlotOrder = flags.SlotOrder })
			set("qps", func() { cfg.QPS = flags.QPS })
			set("burst", func() { cfg.Burst = flags.Burst })
			set("retention", func() { cfg.Retention = service.Duration(retention.String()) })
			set("auth", func() { cfg.Auth = flags.Auth })
			set("token-file", func() { cfg.TokenFile = flags.TokenFile })
			set("log-cap-bytes", func() { cfg.LogCapBytes = flags.LogCapBytes })
			set("auth-audience", func() { cfg.AuthAudiences = audiences })
			set("auth-qps", func() { cfg.AuthQPS = flags.AuthQPS })
			set("auth-burst", func() { cfg.AuthBurst = flags.AuthBurst })
			set("max-requests", func() { cfg.MaxRequests = flags.MaxRequests })
			set("max-requests-per-caller", func() { cfg.MaxRequestsPerCaller = flags.MaxRequestsPerCaller })
			set("max-streams", func() { cfg.MaxStreams = flags.MaxStreams })
			set("max-streams-per-caller", func() { cfg.MaxStreamsPerCaller = flags.MaxStreamsPerCaller })
			set("max-requests-per-namespace", func() { cfg.MaxRequestsPerNamespace = flags.MaxRequestsPerNamespace })
			set("max-streams-per-namespace", func() { cfg.MaxStreamsPerNamespace = flags.MaxStreamsPerNamespace })
			set("max-unfinished-tasks-per-namespace", func() { cfg.MaxUnfinishedTasksPerNamespace = flags.MaxUnfinishedTasksPerNamespace })
			set("max-tasks-per-namespace", func() { cfg.MaxTasksPerNamespace = flags.MaxTasksPerNamespace })
			set("trusted-proxies", func() { cfg.TrustedProxies = flags.TrustedProxies })
			set("body-timeout", func() { cfg.BodyTimeout = service.Duration(bodyTimeout.String()) })
			set("write-timeout", func() { cfg.WriteTimeout = service.Duration(writeTimeout.String()) })
			set("reload-interval", func() { cfg.ReloadInterval = service.Duration(reloadInterval.String()) })
			set("shutdown-timeout", func() { cfg.ShutdownTimeout = service.Duration(shutdown.String()) })
			set("shards", func() { cfg.Shards = flags.Shards })
			set("agent", func() { cfg.Agent = flags.Agent })
			set("replica-id", func() { cfg.ReplicaID = flags.ReplicaID })
			set("lease-namespace", func() { cfg.LeaseNamespace = flags.LeaseNamespace })
			set("lease-duration", func() { cfg.LeaseDuration = service.Duration(leaseDuration.String()) })
			set("pod-security", func() { cfg.PodSecurity = flags.PodSecurity })
			set("namespace-pod-security", func() { cfg.NamespacePodSecurity = nsLevels })
			set("refuse-secrets", func() { cfg.RefuseSecrets = flags.RefuseSecrets })
			set("refuse-runtime-class", func() { cfg.RefuseRuntimeClass = flags.RefuseRuntimeClass })
			set("pod-events", func() { cfg.PodEvents = flags.PodEvents })
			if cmd.Flags().Changed("service-accounts") {
				sas, err := service.ParseServiceAccounts(accounts)
				if err != nil {
					return err
				}
				cfg.ServiceAccounts = sas
			}
			if cmd.Flags().Changed("namespace") && cfg.DefaultNamespace == "" {
				cfg.DefaultNamespace = cf.namespace()
			}
			rc, err := cf.restConfig()
			if err != nil {
				return fmt.Errorf("kubernetes connection (--kubeconfig, --context): %w", err)
			}
			if cfg.DefaultNamespace == "" {
				if ns, _, err := cf.clientConfig().Namespace(); err == nil {
					cfg.DefaultNamespace = ns
				}
			}
			if tune {
				ctx, cancel := context.WithCancel(cmd.Context())
				defer cancel()
				go tuneGC(ctx, 10*time.Second)
			}
			return service.Run(cmd.Context(), cfg, rc, cmd.OutOrStdout(), slog.Default())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&configFile, "config", "", "YAML configuration file (fields as in docs/serve.md); flags override it")
	fs.StringVar(&flags.Listen, "listen", "", "address to serve on (default 127.0.0.1:8080; a non-loopback address requires --tls-cert-file and auth)")
	fs.StringVar(&flags.TLSCertFile, "tls-cert-file", "", "TLS certificate (PEM) to serve HTTPS")
	fs.StringVar(&flags.TLSKeyFile, "tls-key-file", "", "TLS private key (PEM)")
	fs.StringVar(&flags.StateDir, "state-dir", "", "directory of the SQLite store and the generated token file (default $KUBETASK_SERVE_DIR or ~/.local/state/kubetask/serve)")
	fs.StringVar(&flags.Store, "store", "", `"sqlite" (tasks.db in the state directory), "sqlite:PATH", "postgres" (the URL from --store-url-file or $KUBETASK_STORE_URL), or "memory"`)
	fs.StringVar(&flags.StoreURLFile, "store-url-file", "", `file whose first line is the PostgreSQL URL of --store postgres (keeps the password out of process listings)`)
	fs.StringVar(&flags.InstanceID, "instance-id", "", "the executor's instance ID: pods and the Lease carry it (default kubetask-serve)")
	fs.StringSliceVar(&namespaces, "namespaces", nil, "namespaces tasks may run in (default: every namespace)")
	fs.IntVar(&flags.Parallelism, "parallelism", 0, "tasks running at once (default 100)")
	fs.StringToIntVar(&flags.NamespaceParallelism, "namespace-parallelism", nil, "tasks running at once per namespace, beside --parallelism: team-a=20,team-b=5 (repeatable)")
	fs.IntVar(&flags.DefaultNamespaceParallelism, "default-namespace-parallelism", 0, "tasks running at once in each namespace --namespace-parallelism does not name (default 0: --parallelism only)")
	fs.StringToIntVar(&flags.NamespaceWeights, "namespace-weights", nil, "namespaces' shares of the slots while several have tasks waiting: team-a=2 (default 1 each)")
	fs.StringVar(&flags.SlotOrder, "slot-order", "", `which waiting task takes a free slot: "fair" (default: namespaces with waiting tasks in turn, by weight) or "fifo" (one line for all namespaces)`)
	fs.Float32Var(&flags.QPS, "qps", 0, "client-side QPS limit towards the API server (default 50)")
	fs.IntVar(&flags.Burst, "burst", 0, "client-side burst towards the API server (default 100)")
	fs.DurationVar(&retention, "retention", 0, "how long finished tasks and their logs are kept (default 720h; 0 keeps them for ever)")
	fs.StringVar(&flags.Auth, "auth", "", `"token" (default: bearer tokens from --token-file), "kubernetes" (TokenReview and SubjectAccessReview) or "none" (loopback only)`)
	fs.StringVar(&flags.TokenFile, "token-file", "", "token file of the token mode (default tokens.yaml in the state directory, generated when missing)")
	fs.StringSliceVar(&audiences, "auth-audience", nil, "audiences a Kubernetes token must be for (--auth kubernetes): with kubetask, only tokens from 'kubectl create token SA --audience kubetask' are accepted (default: the API server's)")
	fs.Float32Var(&flags.AuthQPS, "auth-qps", 0, "client-side QPS limit of the token and access reviews, apart from --qps (default 20)")
	fs.IntVar(&flags.AuthBurst, "auth-burst", 0, "client-side burst of the token and access reviews (default 50)")
	fs.IntVar(&flags.MaxRequests, "max-requests", 0, "requests served at once, beyond: 429 (default 1000; -1: no limit)")
	fs.IntVar(&flags.MaxRequestsPerCaller, "max-requests-per-caller", 0, "requests of one caller served at once, beyond: 429 (default 100; -1: no limit)")
	fs.IntVar(&flags.MaxStreams, "max-streams", 0, "watches and log follows open at once, beyond: 429 (default 1000; -1: no limit)")
	fs.IntVar(&flags.MaxStreamsPerCaller, "max-streams-per-caller", 0, "watches and log follows of one caller open at once, beyond: 429 (default 50; -1: no limit)")
	fs.IntVar(&flags.MaxRequestsPerNamespace, "max-requests-per-namespace", 0, "one namespace's share of --max-requests: requests naming it (or of its ServiceAccounts) served at once, beyond: 429 (default half of --max-requests; -1: none)")
	fs.IntVar(&flags.MaxStreamsPerNamespace, "max-streams-per-namespace", 0, "one namespace's share of --max-streams: its watches and log follows open at once, beyond: 429 (default half of --max-streams; -1: none)")
	fs.Int64Var(&flags.MaxUnfinishedTasksPerNamespace, "max-unfinished-tasks-per-namespace", 0, "tasks of one namespace not finished yet (waiting or running), beyond: 429 (default 0: no cap)")
	fs.Int64Var(&flags.MaxTasksPerNamespace, "max-tasks-per-namespace", 0, "tasks one namespace keeps, finished ones until retention deletes them, beyond: 403 (default 0: no cap)")
	fs.StringSliceVar(&flags.TrustedProxies, "trusted-proxies", nil, "reverse proxies (addresses or CIDRs: an Ingress controller, a mesh sidecar) whose X-Forwarded-For names the client address refused tokens are counted by (default none: the peer's address)")
	fs.DurationVar(&bodyTimeout, "body-timeout", 0, "how long a request body may take to arrive (default 30s)")
	fs.DurationVar(&writeTimeout, "write-timeout", 0, "how long a response, or each write of a stream, may wait for a client that does not read (default 1m)")
	fs.DurationVar(&reloadInterval, "reload-interval", 0, "how often the token file and the TLS certificate are read again, a change applying without a restart (default 10s)")
	fs.Int64Var(&flags.LogCapBytes, "log-cap-bytes", 0, "size cap of each archived container log (default 64 MiB; the rest is dropped and marked)")
	fs.DurationVar(&shutdown, "shutdown-timeout", 0, "how long SIGTERM waits for requests in flight (default 10s)")
	fs.StringVar(&flags.Agent, "agent", "", "run as the agent of this cluster of the configuration's clusters (one marked agent: true): its executors only, on the service's PostgreSQL store; run it in that cluster (docs/multicluster.md)")
	fs.IntVar(&flags.Shards, "shards", 0, "run as one replica of a group sharing a PostgreSQL store: tasks belong to this many shards, balanced among the replicas through Leases (same number on every replica; default 0: one process)")
	fs.StringVar(&flags.ReplicaID, "replica-id", "", "this replica's name in the Leases (default host name, process ID and a random suffix)")
	fs.StringVar(&flags.LeaseNamespace, "lease-namespace", "", "namespace of the Leases (default $POD_NAMESPACE, else the default namespace)")
	fs.DurationVar(&leaseDuration, "lease-duration", 0, "duration of the Leases: how long a replica that died holds its shards (default 15s)")
	fs.StringVar(&flags.PodSecurity, "pod-security", "", "Pod Security Standards level every task's pod must meet: privileged, baseline or restricted (default baseline; a namespace's stricter pod-security.kubernetes.io/enforce label wins)")
	fs.StringToStringVar(&nsLevels, "namespace-pod-security", nil, "the level of some namespaces: NAMESPACE=LEVEL[,NAMESPACE=LEVEL...]")
	fs.StringSliceVar(&accounts, "service-accounts", nil, "the only ServiceAccounts tasks of a namespace may run as: NAMESPACE/NAME[,...] (namespaces not named: any)")
	fs.StringSliceVar(&flags.RefuseSecrets, "refuse-secrets", nil, `namespaces whose tasks may not name a Secret (env, envFrom, volumes, imagePullSecrets): NAMESPACE[,...], "*" for every one (default none: a task's pod may take any Secret of its namespace)`)
	fs.BoolVar(&flags.PodEvents, "pod-events", false, "record Kubernetes Events on each task's pod for kubectl describe (the outcome and why, result read, sidecars stopped, released, retry scheduled)")
	fs.StringSliceVar(&flags.RefuseRuntimeClass, "refuse-runtime-class", nil, `namespaces whose tasks may not set runtimeClassName: NAMESPACE[,...], "*" for every one (default none)`)
	fs.StringVar(&cpuProfile, "cpu-profile", "", "write a Go CPU profile of the whole run to this file (for benchmarks: go tool pprof)")
	_ = fs.MarkHidden("cpu-profile")
	cf.addFlags(fs)
	return cmd
}

// startCPUProfile profiles the process's CPU into path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
