package service

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/internal/tracing"
	"github.com/kubetask/kubetask/internal/version"
	"github.com/kubetask/kubetask/internal/web"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/logcapture"
	"github.com/kubetask/kubetask/pkg/store"
)

// Run runs `kubetask serve` until ctx ends: it opens the store, starts the
// executor (with log capture into the store's archive), the retention loop
// and the API server on cfg.Listen. On the end of ctx (SIGTERM) it stops
// accepting, finishes the requests in flight (at most ShutdownTimeout), then
// stops the executor, leaving pods under their finalizer for the next start
// to adopt, and closes the store. out receives the lines a person starting
// the service needs (the address, a generated token).
func Run(ctx context.Context, cfg Config, rc *rest.Config, out io.Writer, log *slog.Logger) error {
	if err := cfg.Defaults(); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if u, err := url.Parse(cfg.Store); err == nil && isPostgresURL(cfg.Store) && u.User != nil {
		if _, ok := u.User.Password(); ok {
			log.Warn("the store URL's password is visible in process listings and the configuration: give it with --store-url-file or $" + EnvStoreURL)
		}
	}
	st, storeDesc, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	// Traces, when the OTEL_* environment names a receiver
	// (docs/tracing.md); nil, and no cost, otherwise. Stopped last: the
	// executors' final spans are flushed on the way out.
	tracer, stopTracing, err := tracing.Setup(ctx, os.Getenv, "kubetask", version.Get().Version, processIdentity(cfg))
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := stopTracing(sctx); err != nil {
			log.Warn("sending the last spans failed", "err", err)
		}
	}()
	if tracer != nil {
		log.Info("tracing: sending spans to the OTLP receiver the OTEL_* environment names")
	}
	pager, ok1 := st.(store.Pager)
	logs, ok2 := st.(store.Logs)
	ret, ok3 := st.(store.Retention)
	if !ok1 || !ok2 || !ok3 {
		return errors.New("the store does not support pages, logs and retention")
	}

	client, err := serviceClient(cfg, rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	// The reviews of the kubernetes mode get a client of their own: a
	// flood of them does not hold up log capture and dry runs, nor they it.
	arc := rest.CopyConfig(rc)
	arc.QPS, arc.Burst = cfg.AuthQPS, cfg.AuthBurst
	authClient, err := kubernetes.NewForConfig(arc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	auth, err := newAuth(cfg, authClient, out)
	if err != nil {
		return err
	}
	var reloaders []*reloader
	if ta, ok := auth.(*server.TokenAuth); ok {
		reloaders = append(reloaders, newReloader("token file", []string{cfg.TokenFile}, func() error {
			toks, err := loadTokens(cfg.TokenFile)
			if err != nil {
				return err
			}
			return ta.Reload(toks)
		}, clock.RealClock{}, log))
	}
	var tlsCfg *tls.Config
	if cfg.TLSCertFile != "" {
		cert := &certificate{certFile: cfg.TLSCertFile, keyFile: cfg.TLSKeyFile}
		if err := cert.load(); err != nil {
			return err
		}
		tlsCfg = &tls.Config{GetCertificate: cert.get, MinVersion: tls.VersionTLS12}
		reloaders = append(reloaders, newReloader("TLS certificate", []string{cfg.TLSCertFile, cfg.TLSKeyFile}, cert.load, clock.RealClock{}, log))
	}
	if err := server.CheckListen(cfg.Listen, tlsCfg != nil, auth != nil); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	m := newProcessMetrics(reg)
	var srv *server.Server // the executor's events go to it; set before Start
	var srvMu sync.Mutex
	// The replicas of a group share their events, so that a watch on any
	// replica sees every task.
	var sharer *eventSharer
	agents := cfg.Agent != "" || slices.ContainsFunc(cfg.Clusters, func(c ClusterConfig) bool { return c.Agent })
	if bus, ok := st.(store.Broadcaster); ok && (cfg.Shards > 0 || agents) {
		sharer = newEventSharer(bus, func() publisher {
			srvMu.Lock()
			defer srvMu.Unlock()
			if srv == nil {
				return nil
			}
			return srv
		}, log)
	}
	// onEvent sends an event to this server's watches and, in a group, the
	// other replicas'.
	onEvent := func(ev executor.Event) {
		srvMu.Lock()
		s := srv
		srvMu.Unlock()
		if s != nil {
			s.Publish(ev)
		}
		if sharer != nil {
			sharer.offer(ev)
		}
	}
	// The clusters' event recorders (podEvents): stopped, with what they
	// still hold sent, when the service ends.
	var broadcasters []record.EventBroadcaster
	var droppedEvents *prometheus.CounterVec // kubetask_pod_events_dropped_total
	if cfg.PodEvents {
		droppedEvents = newDroppedEvents(reg)
	}
	defer func() {
		for _, b := range broadcasters {
			b.Shutdown()
		}
	}()
	recorder := func(rc *rest.Config) record.EventRecorder {
		if !cfg.PodEvents || rc == nil {
			return nil
		}
		// A client of their own, with a rate limit of its own, as the
		// kubelet's --event-qps: events never wait for, nor hold up, the
		// dry runs and log reads of the service's client (on one client,
		// make bench-podevents at 59fcd72: 0.79x tasks/s). Beyond the
		// limits they are dropped as they are recorded (limitedRecorder):
		// they are for people, never state.
		erc := rest.CopyConfig(rc)
		erc.QPS, erc.Burst = podEventsQPS, podEventsBurst
		client, err := kubernetes.NewForConfig(erc)
		if err != nil {
			log.Warn("no client for the pods' events; recording none", "err", err)
			return nil
		}
		b := record.NewBroadcaster()
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
		broadcasters = append(broadcasters, b)
		return newLimitedRecorder(b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubetask"}), time.Now, droppedEvents)
	}
	// exConfig is the executor configuration of one cluster, whose client
	// (captureClient) reads its pods' logs and records their events.
	exConfig := func(rc *rest.Config, captureClient kubernetes.Interface) executor.Config {
		return executor.Config{
			Recorder:   recorder(rc),
			Tracer:     tracer,
			RESTConfig: rc, Namespaces: cfg.Namespaces,
			DefaultNamespace: cfg.DefaultNamespace, Parallelism: cfg.Parallelism, QPS: cfg.QPS, Burst: cfg.Burst,
			NamespaceParallelism: cfg.NamespaceParallelism, DefaultNamespaceParallelism: cfg.DefaultNamespaceParallelism,
			NamespaceWeights: cfg.NamespaceWeights, SlotOrder: executor.SlotOrder(cfg.SlotOrder),
			Store: st, Registerer: reg, Logger: log,
			OnEvent: onEvent,
			CaptureLogs: func(ctx context.Context, lc executor.LogCapture) error {
				key := store.LogKey{TaskID: lc.TaskID, Attempt: lc.Attempt, Container: lc.Container}
				srvMu.Lock()
				s := srv
				srvMu.Unlock()
				m.active.Inc()
				defer m.active.Dec()
				err := logcapture.Run(ctx, logcapture.Config{
					Client: captureClient, Namespace: lc.Namespace, Pod: lc.Pod, Container: lc.Container, UID: lc.UID,
					Key: key, Nonce: lc.Nonce, Logs: logs, Progress: lc.Progress, Changed: lc.Changed, Logger: log,
					OnAppend: func(n int64) {
						m.bytes.Add(float64(n))
						if s != nil {
							s.NotifyLog(key)
						}
					},
				})
				if err != nil && ctx.Err() == nil {
					m.failures.Inc()
				}
				return err
			},
		}
	}
	var run *runner
	var clusters server.Clusters // nil: one cluster
	if len(cfg.Clusters) == 0 {
		run, err = newRunner(cfg, exConfig(rc, client), rc, st, reg, log)
		if err != nil {
			return err
		}
	} else {
		var r *router
		var first *kubernetes.Clientset
		r, first, err = newRouter(ctx, cfg, st, reg, log, exConfig)
		if err != nil {
			return err
		}
		if first != nil { // else every cluster is an agent's: the home cluster's client
			client = first
		}
		reloaders = append(reloaders, r.reloaders...)
		r.publish = onEvent
		run = &runner{api: r, start: r.start, ready: r.ready}
		clusters = r
	}
	proxies, err := cfg.TrustedProxyPrefixes()
	if err != nil {
		return err
	}
	var quotas *server.Quotas
	if cfg.MaxUnfinishedTasksPerNamespace > 0 || cfg.MaxTasksPerNamespace > 0 {
		counter, ok := st.(store.NamespaceCounter)
		if !ok {
			return fmt.Errorf("maxUnfinishedTasksPerNamespace, maxTasksPerNamespace: the store %s cannot count a namespace's tasks", storeDesc)
		}
		quotas = &server.Quotas{Counter: counter, MaxUnfinished: cfg.MaxUnfinishedTasksPerNamespace, MaxTotal: cfg.MaxTasksPerNamespace}
	}
	s, err := server.New(server.Config{
		Executor: run.api, Clusters: clusters, Pager: pager, Logs: logs, Client: client, ValidateOnServer: true, Auth: auth,
		Namespaces: cfg.Namespaces,
		PodPolicy: server.PodPolicy{Level: cfg.PodSecurity, NamespaceLevels: cfg.NamespacePodSecurity, ServiceAccounts: cfg.ServiceAccounts,
			RefuseSecrets: cfg.RefuseSecrets, RefuseRuntimeClass: cfg.RefuseRuntimeClass},
		Ready: func() error {
			if err := run.ready(); err != nil {
				return err
			}
			if p, ok := st.(store.Pinger); ok {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				if err := p.Ping(pctx); err != nil {
					return fmt.Errorf("the store does not answer: %w", err)
				}
			}
			return nil
		},
		Registry: reg, TLS: tlsCfg, ShutdownTimeout: cfg.ShutdownTimeout.Get(), Logger: log,
		MaxRequests: cfg.MaxRequests, MaxRequestsPerCaller: cfg.MaxRequestsPerCaller,
		MaxStreams: cfg.MaxStreams, MaxStreamsPerCaller: cfg.MaxStreamsPerCaller,
		MaxRequestsPerNamespace: cfg.MaxRequestsPerNamespace, MaxStreamsPerNamespace: cfg.MaxStreamsPerNamespace,
		TrustedProxies: proxies, Quotas: quotas,
		BodyTimeout: cfg.BodyTimeout.Get(), WriteTimeout: cfg.WriteTimeout.Get(),
		UI: web.Handler(), Tracer: tracer,
	})
	if err != nil {
		return err
	}
	srvMu.Lock()
	srv = s
	srvMu.Unlock()

	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.Listen, err)
	}
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
	}
	fmt.Fprintf(out, "kubetask serve: %s://%s/api/v1 (store %s, auth %s)\n", scheme, l.Addr(), storeDesc, cfg.Auth)

	exCtx, stopEx := context.WithCancel(context.WithoutCancel(ctx))
	defer stopEx()
	if cfg.Shards > 0 {
		// A replica hands its shards over as soon as SIGTERM comes, while
		// the API drains: the others take over without waiting for expiry.
		exCtx = ctx
	}
	// An executor (or replica) that ends with an error while it should
	// run ends the process with that error: serving on would accept tasks
	// that nothing runs.
	serveCtx, stopServe := context.WithCancel(ctx)
	defer stopServe()
	exDone := make(chan error, 1)
	go func() {
		err := run.start(exCtx)
		if err != nil && exCtx.Err() == nil {
			log.Error("the executor stopped; shutting down", "err", err)
			stopServe()
		}
		exDone <- err
	}()
	if sharer != nil {
		go sharer.run(exCtx)
	}
	go retain(exCtx, ret, cfg.Retention.Get(), time.Hour, clock.RealClock{}, log)
	for _, r := range reloaders {
		go r.run(serveCtx, cfg.ReloadInterval.Get())
	}

	serveErr := s.Serve(serveCtx, l) // returns after the graceful shutdown when serveCtx ends
	stopEx()
	exErr := <-exDone
	return errors.Join(serveErr, exErr)
}

// serviceClient is the service's own client of a cluster (log streams,
// dry-run validation): the executor's rate limits, not client-go's default
// of 5 requests per second.
func serviceClient(cfg Config, rc *rest.Config) (*kubernetes.Clientset, error) {
	crc := rest.CopyConfig(rc)
	crc.QPS, crc.Burst = cfg.QPS, cfg.Burst
	if crc.QPS == 0 {
		crc.QPS = executor.DefaultQPS
	}
	if crc.Burst == 0 {
		crc.Burst = executor.DefaultBurst
	}
	return kubernetes.NewForConfig(crc)
}

// openStore opens the store cfg names and returns it with a description for
// the start-up line (a PostgreSQL URL without its credentials).
func openStore(ctx context.Context, cfg Config) (store.Store, string, error) {
	opts := store.Options{MaxLogSize: cfg.LogCapBytes}
	switch {
	case cfg.Store == "memory":
		return store.NewMemoryWithOptions(opts), "memory", nil
	case cfg.isPostgres():
		u, err := cfg.PostgresURL()
		if err != nil {
			return nil, "", err
		}
		desc := "postgres"
		if pu, err := url.Parse(u); err == nil && pu.Host != "" {
			desc += " " + pu.Host + pu.Path
		}
		st, err := store.OpenPostgres(ctx, u, opts)
		return st, desc, err
	}
	st, err := store.OpenSQLiteWithOptions(ctx, cfg.StorePath(), opts)
	return st, "sqlite " + cfg.StorePath(), err
}

// newAuth builds the authenticator of cfg.Auth; in token mode it generates a
// token file (mode 0600) with one token for every namespace when there is
// none, says where (never the token itself), and refuses a token file
// others may read.
func newAuth(cfg Config, client kubernetes.Interface, out io.Writer) (server.Authenticator, error) {
	switch cfg.Auth {
	case "none":
		return nil, nil
	case "kubernetes":
		return server.NewKubernetesAuth(server.KubernetesAuthConfig{Client: client, Audiences: cfg.AuthAudiences})
	}
	if _, err := os.Stat(cfg.TokenFile); errors.Is(err, os.ErrNotExist) {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return nil, fmt.Errorf("generating a token: %w", err)
		}
		tok := hex.EncodeToString(b)
		doc := fmt.Sprintf("# Generated by kubetask serve. Each token: a bearer token, its holder and its namespaces.\ntokens:\n- token: %s\n  subject: admin\n  namespaces: \"*\"\n", tok)
		if err := os.MkdirAll(filepath.Dir(cfg.TokenFile), 0o700); err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		if err := os.WriteFile(cfg.TokenFile, []byte(doc), 0o600); err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		// The token stays in the file: what the process prints lands in
		// logs (a pod's, a terminal's scrollback).
		fmt.Fprintf(out, "kubetask serve: generated %s with a token for every namespace (read it there: it is not printed)\n", cfg.TokenFile)
	}
	toks, err := loadTokens(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	return server.NewTokenAuth(toks)
}

// newProcessMetrics registers in reg the metrics of the process itself,
// beside the executors' and the server's: Go's and the process's, and the
// log captures' (returned).
func newProcessMetrics(reg prometheus.Registerer) *captureMetrics {
	// The scheduler's metrics (go_sched_latencies_seconds among them) tell
	// how long the service's goroutines waited for a CPU: the store's one
	// writer among them.
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return newCaptureMetrics(reg)
}

// captureMetrics count the log captures.
type captureMetrics struct {
	active   prometheus.Gauge
	bytes    prometheus.Counter
	failures prometheus.Counter
}

func newCaptureMetrics(reg prometheus.Registerer) *captureMetrics {
	m := &captureMetrics{
		active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kubetask_log_captures",
			Help: "Container logs being captured into the archive now."}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "kubetask_log_archived_bytes_total",
			Help: "Bytes of container logs durably archived."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "kubetask_log_capture_failures_total",
			Help: "Log captures that failed (the archive refused a write) and started again from where the archive ends."}),
	}
	reg.MustRegister(m.active, m.bytes, m.failures)
	return m
}
