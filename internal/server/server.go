package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/internal/version"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Executor is what the server needs of the executor; *executor.Executor is
// one. SubmitCreated must be idempotent by ID (return the existing record
// for an ID it knows) and report whether this call created the record,
// decided atomically (of concurrent calls with one ID exactly one is told
// true); Get must return an error wrapping store.ErrNotFound for an unknown
// ID, and Cancel must do nothing for a finished task.
type Executor interface {
	SubmitCreated(ctx context.Context, id string, t *task.Task, opts ...executor.SubmitOption) (store.Record, bool, error)
	Get(ctx context.Context, id string) (store.Record, error)
	Cancel(ctx context.Context, id string, opts ...executor.CancelOption) error
	// Healthy is the liveness of /healthz.
	Healthy() error
}

var _ Executor = (*executor.Executor)(nil)

// ErrUnavailable wraps an Executor's error that will pass (no cluster a
// task may run on is Ready now): the server answers 503 with Retry-After
// and the error's text, and has stored nothing.
var ErrUnavailable = errors.New("unavailable now")

// Config configures a Server. New checks it and fills in the defaults.
type Config struct {
	// Executor runs the tasks. Required.
	Executor Executor
	// Clusters shows and drains the clusters of a service with several
	// (GET /clusters, POST /clusters/{name}/drain and /resume); nil: one
	// cluster.
	Clusters Clusters
	// Pager lists task records for GET /tasks (the store's). Required.
	Pager store.Pager
	// Logs is the log archive for GET /tasks/{id}/logs. Without it that
	// endpoint answers 501.
	Logs store.Logs
	// Client, when set, reads the Kubernetes events of a Pending task's pod
	// for GET /tasks/{id} (it needs list on events), and checks submitted
	// tasks on the API server when ValidateOnServer is set.
	Client kubernetes.Interface
	// ValidateOnServer checks each new task with a server-side dry-run
	// creation of its pod (task.ValidateOnServer) before accepting it: an
	// invalid pod spec is a 422 at submission instead of a failed task.
	ValidateOnServer bool
	// ValidationTTL is how long the API server's acceptance of a task spec
	// in a namespace stands for later submissions of the same spec there
	// (under any name), so that each distinct spec is dry-run once per TTL.
	// Default 1m; negative: every submission is dry-run.
	ValidationTTL time.Duration
	// Namespaces, when set, are the only namespaces tasks may run in (the
	// executor's): a submission elsewhere is refused before anything else
	// is asked of the API server, with a 422 that names them.
	Namespaces []string
	// PodPolicy is what a task's pod may be (Pod Security Standards level,
	// ServiceAccounts), per namespace; every submission and rerun is
	// checked against it. Default: baseline everywhere, any ServiceAccount.
	// With Client, a namespace's own pod-security.kubernetes.io/enforce
	// label wins where it is stricter (the server reads namespaces: get).
	PodPolicy PodPolicy
	// Auth authenticates callers (NewTokenAuth, NewKubernetesAuth). Nil: no
	// authentication, every caller may do everything (CheckListen allows
	// that on loopback only).
	Auth Authenticator
	// Ready says whether /readyz answers 200: the store is open and the
	// executor's caches have synced. Nil: ready.
	Ready func() error
	// Registry receives the HTTP metrics and is served at /metrics
	// (register the executor's metrics in it too). Default: a new registry.
	Registry Registry
	// MaxBodyBytes bounds a request body (413 beyond). Default 1 MiB.
	MaxBodyBytes int64
	// EventBuffer is how many recent events the server keeps for watches to
	// resume from. Default 100000.
	EventBuffer int
	// Heartbeat is the interval of the comments that keep idle watch streams
	// alive. Default 15s.
	Heartbeat time.Duration
	// StreamTimeout ends a watch or a log follow after this long; the client
	// resumes from its cursor or offset (and is authorized again). Default 30m.
	StreamTimeout time.Duration
	// AuthRecheck is how often an open watch or log follow asks Auth again
	// whether its caller may still do what opened it (the token, and the
	// action in the stream's namespaces); the stream ends once it may not.
	// A revoked permission thus ends a stream within AuthRecheck plus the
	// authenticator's cache (10s in kubernetes mode). Default 5s.
	AuthRecheck time.Duration
	// LogPollInterval is how often a log follow reads the archive when no
	// NotifyLog woke it. Default 1s.
	LogPollInterval time.Duration
	// LogWait is how long a log follow waits, once the attempt has ended,
	// for its archive to be complete before it ends anyway. Default 30s.
	LogWait time.Duration
	// PendingEvents is the number of a Pending task's pod events GET
	// /tasks/{id} reports. Default 10.
	PendingEvents int
	// PodEventsTTL is how long a Pending task's pod events, once listed,
	// answer GET /tasks/{id} (for every caller; the last 1,000 pods are
	// kept). Default 5s; negative: listed at every GET.
	PodEventsTTL time.Duration
	// Tracer, when set (the executors' Config.Tracer), traces each
	// submission: a traceparent header makes the task's trace continue the
	// caller's, and the submission's span (with its dry run) starts when
	// the request arrives (docs/tracing.md). Nil: no tracing.
	Tracer *executor.Tracer
	// UI, when set, serves the web page: GET and HEAD of every path outside
	// the API, /healthz, /readyz and /metrics, without authentication (the
	// page's files are public; its API calls carry the caller's token).
	UI http.Handler
	// TLS, when set, makes Serve serve HTTPS with it.
	TLS *tls.Config
	// BodyTimeout is how long a request body may take to arrive (408 and
	// the connection closed beyond). Default 30s.
	BodyTimeout time.Duration
	// WriteTimeout bounds each write of a response: a client that does
	// not read a response (a stream too) for this long is dropped.
	// Default 1m.
	WriteTimeout time.Duration
	// MaxRequests bounds the requests being served at once, and
	// MaxRequestsPerCaller those of one caller (429 with Retry-After
	// beyond). Streams count apart. Defaults 1000 and 100; negative: no
	// limit.
	MaxRequests, MaxRequestsPerCaller int
	// MaxStreams bounds the watches and log follows open at once, and
	// MaxStreamsPerCaller those of one caller (429 with Retry-After
	// beyond). Defaults 1000 and 50; negative: no limit.
	MaxStreams, MaxStreamsPerCaller int
	// MaxRequestsPerNamespace and MaxStreamsPerNamespace are one
	// namespace's shares of those totals, so that the callers of one
	// namespace (say, its many ServiceAccounts) never take every slot. A
	// stream counts against the namespace it streams; a request against
	// the namespace it names (its path's, ?namespace=); either, when it
	// names none or several, against its caller's own (a ServiceAccount's
	// namespace, a token's only one). Defaults: half of MaxRequests and
	// of MaxStreams; negative: no share.
	MaxRequestsPerNamespace, MaxStreamsPerNamespace int
	// RefusedTokenRate is how many bearer tokens a second one client
	// address may have refused (RefusedTokenBurst at once, default 20):
	// beyond that, its requests with a token not known already get 429
	// without being checked (no TokenReview). Default 1; negative: no
	// limit.
	RefusedTokenRate  float64
	RefusedTokenBurst int
	// RefusedTokenWait is how long a token not known already may wait for
	// its check while its address is over RefusedTokenRate (kubernetes
	// mode): such an address's tokens are checked at that rate, each in
	// its turn, so that a valid token behind an address that others flood
	// with made-up ones (a NAT, a proxy not named in TrustedProxies) is
	// served late, not refused; a token whose turn is further off gets 429.
	// In token mode, where every token is known beforehand, a blocked
	// address's unknown tokens get 429 at once. Default 10s.
	RefusedTokenWait time.Duration
	// TrustedProxies are the peers (reverse proxies, Ingress controllers,
	// mesh sidecars) whose X-Forwarded-For names the client address that
	// RefusedTokenRate counts by: the last address of the header that is
	// not itself a trusted proxy. Without them, the peer's address.
	TrustedProxies []netip.Prefix
	// Quotas, when set, caps the tasks of each namespace (429 or 403
	// naming the cap).
	Quotas *Quotas
	// ShutdownTimeout bounds how long Serve waits for requests in flight
	// once its context ends. Default 10s.
	ShutdownTimeout time.Duration
	// NewID makes the IDs of tasks submitted without one; they must be valid
	// label values, unique, and should sort by creation time. Default: "t"
	// and a lowercase ULID.
	NewID func() string
	// Clock is injected for tests. Default the real clock.
	Clock clock.WithTicker
	// Logger is the structured logger. Default slog.Default().
	Logger *slog.Logger
	// AuditLogger receives one line (message "audit") for every mutating
	// request: who, what, which task, the verdict. Default Logger.
	AuditLogger *slog.Logger
	// Version is the server's version, reported by GET /api/v1/version and
	// the X-Kubetask-Version header. Default: the binary's (internal/version).
	Version api.Version
}

func (c *Config) defaults() error {
	var errs []error
	if c.Executor == nil {
		errs = append(errs, errors.New("config: Executor is required"))
	}
	if c.Pager == nil {
		errs = append(errs, errors.New("config: Pager is required (the store's store.Pager)"))
	}
	if c.ValidateOnServer && c.Client == nil {
		errs = append(errs, errors.New("ValidateOnServer needs Client"))
	}
	if c.AuthRecheck < 0 {
		errs = append(errs, fmt.Errorf("AuthRecheck must not be negative (0 means the default), got %d", c.AuthRecheck))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"MaxBodyBytes", c.MaxBodyBytes}, {"EventBuffer", int64(c.EventBuffer)}, {"PendingEvents", int64(c.PendingEvents)},
		{"Heartbeat", int64(c.Heartbeat)}, {"StreamTimeout", int64(c.StreamTimeout)}, {"LogPollInterval", int64(c.LogPollInterval)},
		{"LogWait", int64(c.LogWait)}, {"ShutdownTimeout", int64(c.ShutdownTimeout)},
		{"BodyTimeout", int64(c.BodyTimeout)}, {"WriteTimeout", int64(c.WriteTimeout)}, {"RefusedTokenWait", int64(c.RefusedTokenWait)}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (0 means the default), got %d", f.name, f.v))
		}
	}
	if c.RefusedTokenBurst < 0 {
		errs = append(errs, fmt.Errorf("RefusedTokenBurst must not be negative (0 means the default), got %d", c.RefusedTokenBurst))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("server config: %w", err)
	}
	setLimit(&c.MaxRequests, 1000)
	setLimit(&c.MaxRequestsPerCaller, 100)
	setLimit(&c.MaxStreams, 1000)
	setLimit(&c.MaxStreamsPerCaller, 50)
	setLimit(&c.MaxRequestsPerNamespace, c.MaxRequests/2)
	setLimit(&c.MaxStreamsPerNamespace, c.MaxStreams/2)
	if c.RefusedTokenRate == 0 {
		c.RefusedTokenRate = 1
	}
	if c.RefusedTokenBurst == 0 {
		c.RefusedTokenBurst = 20
	}
	setDuration(&c.RefusedTokenWait, 10*time.Second)
	setDuration(&c.BodyTimeout, 30*time.Second)
	setDuration(&c.WriteTimeout, time.Minute)
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.EventBuffer == 0 {
		c.EventBuffer = 100000
	}
	if c.PendingEvents == 0 {
		c.PendingEvents = 10
	}
	setDuration(&c.PodEventsTTL, 5*time.Second)
	setDuration(&c.Heartbeat, 15*time.Second)
	setDuration(&c.StreamTimeout, 30*time.Minute)
	setDuration(&c.LogPollInterval, time.Second)
	setDuration(&c.LogWait, 30*time.Second)
	setDuration(&c.ShutdownTimeout, 10*time.Second)
	setDuration(&c.ValidationTTL, time.Minute)
	setDuration(&c.AuthRecheck, 5*time.Second)
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.NewID == nil {
		c.NewID = newIDSource(c.Clock).next
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.AuditLogger == nil {
		c.AuditLogger = c.Logger
	}
	if c.Version.Version == "" {
		c.Version = version.Get()
	}
	return nil
}

// setLimit fills a limit: 0 is def, negative is none (0).
func setLimit(n *int, def int) {
	switch {
	case *n == 0:
		*n = def
	case *n < 0:
		*n = 0
	}
}

func setDuration(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

// Server is kubetask's HTTP API. Create it with New; serve Handler yourself
// or call Serve; feed it the executor's events with Publish.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	api     huma.API
	handler http.Handler
	ring    *ring
	meta    *metaCache
	valid   *validations
	pods    *podSecurity
	logWake *wakers
	// podEventsCache keeps the pods' events podEvents listed.
	podEventsCache *ttlCache
	quotas         *quotas

	requests *slots    // requests being served
	streams  *slots    // watches and log follows open
	refusals *refusals // refused tokens by client address

	stopOnce sync.Once
	stopping chan struct{} // closed when streams must end (shutdown)
}

// Registry is where the server registers its metrics and what /metrics
// serves: a *prometheus.Registry, or something that passes to one.
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// New checks cfg, fills its defaults and builds the server. It registers the
// HTTP metrics in cfg.Registry (an error if they are registered already).
func New(cfg Config) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	pods, err := newPodSecurity(cfg.PodPolicy, cfg.Client, cfg.Clock)
	if err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	q, err := newQuotas(cfg.Quotas, cfg.Clock.Now)
	if err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("server metrics: %w", err)
	}
	s := &Server{
		cfg:            cfg,
		log:            cfg.Logger,
		metrics:        m,
		ring:           newRing(cfg.EventBuffer),
		meta:           newMetaCache(10000),
		valid:          newValidations(cfg.Client, cfg.Clock, cfg.ValidationTTL, 10000),
		pods:           pods,
		logWake:        newWakers(),
		podEventsCache: newTTLCache(cfg.Clock, cfg.PodEventsTTL, 1000),
		quotas:         q,
		requests:       newSlots(cfg.MaxRequests, cfg.MaxRequestsPerCaller, cfg.MaxRequestsPerNamespace),
		streams:        newSlots(cfg.MaxStreams, cfg.MaxStreamsPerCaller, cfg.MaxStreamsPerNamespace),
		refusals:       newRefusals(cfg.RefusedTokenRate, cfg.RefusedTokenBurst, 10000, cfg.Clock.Now),
		stopping:       make(chan struct{}),
	}
	mux := routeMux{http.NewServeMux()}
	s.valid.observe = func(d time.Duration) { m.submitSteps.WithLabelValues("validate").Observe(d.Seconds()) }
	s.api = huma.NewAPI(apiConfig(), humago.NewAdapter(mux, ""))
	s.register()
	s.registerVersion()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /metrics", s.serveMetrics)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if s.isUI(r) {
			s.cfg.UI.ServeHTTP(w, r)
			return
		}
		writeProblem(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s: the API is under %s, described by %s/openapi.json", r.Method, r.URL.Path, api.Prefix, api.Prefix))
	})
	s.handler = s.sendVersion(s.auditRequests(s.instrument(s.recover(s.guardBody(s.refuseUncleanPaths(s.checkHost(s.refuseCrossSite(
		s.authenticate(s.limitRequests(s.limitBody(mux)))))))))))
	return s, nil
}

// OpenAPI returns the API's OpenAPI 3.1 document (also served at
// /api/v1/openapi.json and .yaml).
func (s *Server) OpenAPI() *huma.OpenAPI { return s.api.OpenAPI() }

// Handler returns the server's HTTP handler: the API under /api/v1,
// /healthz, /readyz and /metrics.
func (s *Server) Handler() http.Handler { return s.handler }

// CloseStreams ends every watch and log follow now and makes new ones end at
// once (their clients resume elsewhere or later); /readyz answers 503 from
// then on. Serve calls it when its context ends.
func (s *Server) CloseStreams() {
	s.stopOnce.Do(func() { close(s.stopping) })
}

// Serve serves the API on l until ctx ends, then shuts down: it stops
// accepting, ends the streams, waits up to ShutdownTimeout for requests in
// flight and closes what is left. With cfg.TLS it serves HTTPS. It refuses a
// listener CheckListen refuses. It returns nil after a shutdown for ctx.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if err := CheckListen(l.Addr().String(), s.cfg.TLS != nil, s.cfg.Auth != nil); err != nil {
		return err
	}
	if s.cfg.TLS != nil {
		l = tls.NewListener(l, s.cfg.TLS)
	}
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		// Bodies get BodyTimeout and responses WriteTimeout per request
		// (guardBody); an idle connection goes after a minute.
		IdleTimeout:    time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:    func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(l) }()
	select {
	case err := <-done:
		return fmt.Errorf("serving the API: %w", err)
	case <-ctx.Done():
	}
	s.CloseStreams()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		s.log.Warn("requests still in flight after the shutdown timeout; closing them", "timeout", s.cfg.ShutdownTimeout)
		_ = hs.Close()
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the API: %w", err)
	}
	return nil
}

// CheckListen refuses to serve on a non-loopback address without TLS and
// authentication: tasks run arbitrary pods, so whoever reaches the API
// controls pods. addr is host:port; an empty host, 0.0.0.0 and [::] are every
// interface, a host name other than localhost counts as non-loopback.
func CheckListen(addr string, tlsOn, authOn bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if isLoopback(host) || (tlsOn && authOn) {
		return nil
	}
	var missing []string
	if !tlsOn {
		missing = append(missing, "TLS (a certificate and key)")
	}
	if !authOn {
		missing = append(missing, "authentication (auth mode token or kubernetes)")
	}
	return fmt.Errorf("refusing to listen on %s without %s: anyone who reaches it could run pods; configure them, or listen on 127.0.0.1",
		addr, strings.Join(missing, " and "))
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// apiConfig is huma's configuration: JSON only, the OpenAPI document under
// the prefix, no docs page (it would load scripts from the internet) and no
// $schema links in responses.
func apiConfig() huma.Config {
	c := huma.DefaultConfig("kubetask", "v1")
	c.Info.Description = "Run tasks as Kubernetes pods: submit, read state and attempts, list, watch, logs, cancel, rerun. See docs/api.md."
	c.OpenAPIPath = api.Prefix + "/openapi"
	c.DocsPath = ""
	c.SchemasPath = ""
	c.CreateHooks = nil
	c.Formats = map[string]huma.Format{"application/json": huma.DefaultJSONFormat, "json": huma.DefaultJSONFormat}
	c.Components.SecuritySchemes = map[string]*huma.SecurityScheme{
		"bearer": {Type: "http", Scheme: "bearer", Description: "A token of the token mode's file, or a Kubernetes token in the kubernetes mode."},
	}
	c.Security = []map[string][]string{{"bearer": {}}}
	return c
}

// routeMux records the pattern that served a request for the metrics (the
// request the mux sees is a copy of the one the outer handlers hold).
type routeMux struct{ *http.ServeMux }

func (m routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.ServeMux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if ri, ok := r.Context().Value(requestKey{}).(*requestInfo); ok {
			ri.route = pattern
		}
		h(w, r)
	})
}
