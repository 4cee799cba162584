package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubetask/kubetask/pkg/api"
)

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight prometheus.Gauge
	streams  *prometheus.GaugeVec
	expired  prometheus.Counter
	events   prometheus.Counter
	// submitSteps times the steps of a submission: the API server's dry
	// run (validate) and the store's write (store).
	submitSteps *prometheus.HistogramVec
	// validations counts the submissions validated on the API server by
	// where the verdict came from: dry-run, shared, cached.
	validations *prometheus.CounterVec
	// refused counts the requests refused by a limit, by limit.
	refused *prometheus.CounterVec
	// refusedLimited counts the requests answered 429 because their
	// address had too many tokens refused.
	refusedLimited prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubetask_http_requests_total", Help: "HTTP requests served, by method, route pattern and status code.",
		}, []string{"method", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubetask_http_request_duration_seconds", Help: "Time to serve an HTTP request (for watches and log follows: the stream's life), by method and route pattern.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60, 600},
		}, []string{"method", "route"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubetask_http_requests_in_flight", Help: "HTTP requests being served (streams included).",
		}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubetask_api_streams", Help: "Open watch and log-follow streams, by kind.",
		}, []string{"kind"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubetask_watch_expired_total", Help: "Watches resumed from a cursor the server no longer keeps (told to list again).",
		}),
		events: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubetask_watch_events_published_total", Help: "Task events published to watches.",
		}),
		submitSteps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubetask_submit_step_seconds", Help: "Time of each step of a submission: validate (each dry run on the API server, client rate limiter included), store (the task's record written).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"step"}),
		validations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubetask_submit_validations_total",
			Help: "Submissions validated on the API server, by where the verdict came from: dry-run (their own), shared (a concurrent submission's of the same spec), cached (the spec was accepted in the namespace within the validation TTL).",
		}, []string{"source"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubetask_http_limited_total",
			Help: "Requests answered 429 by a concurrency limit, by what was limited: requests or streams.",
		}, []string{"kind"}),
		refusedLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubetask_auth_refusals_limited_total",
			Help: "Requests answered 429 without checking their token because their address had too many bearer tokens refused.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.inFlight, m.streams, m.expired, m.events, m.submitSteps, m.validations, m.refused, m.refusedLimited} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// statusWriter remembers the status code; Unwrap and Flush keep streaming
// and deadlines working through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// instrument counts requests by route pattern and status code.
func (s *Server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &requestInfo{route: "unmatched", req: r}
		r = r.WithContext(context.WithValue(r.Context(), requestKey{}, info))
		sw := &statusWriter{ResponseWriter: w}
		s.metrics.inFlight.Inc()
		defer func() {
			s.metrics.inFlight.Dec()
			code := sw.status
			if code == 0 {
				code = http.StatusOK
			}
			// Every label value is bounded: a known method or "other", a
			// route pattern or "unmatched", a valid status code.
			method := methodLabel(r.Method)
			s.metrics.requests.WithLabelValues(method, info.route, codeLabel(code)).Inc()
			s.metrics.duration.WithLabelValues(method, info.route).Observe(time.Since(start).Seconds())
		}()
		next.ServeHTTP(sw, r)
	})
}

// requestInfo is what handlers and metrics learn about a request beyond
// huma's inputs: the route pattern that served it, and the request itself
// (its raw query, to refuse unknown parameters).
type requestInfo struct {
	route string
	req   *http.Request
	// release gives the request's slot back (nil: it holds none); a
	// request that becomes a stream gives it back for a stream's slot.
	release func()
}

type requestKey struct{}

func requestFrom(ctx context.Context) *requestInfo {
	if ri, ok := ctx.Value(requestKey{}).(*requestInfo); ok {
		return ri
	}
	return &requestInfo{route: "unmatched"}
}

// recover answers 500 for a handler's panic (net/http would drop the
// connection without an answer) and logs it.
func (s *Server) recover(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler { //nolint:errorlint // the sentinel is panicked as is
				panic(v)
			}
			s.log.Error("panic serving a request", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v))
			writeProblem(w, http.StatusInternalServerError, "internal error: the server logged it")
		}()
		next.ServeHTTP(w, r)
	})
}

// public lists what needs no token (for GET and HEAD): probes and the
// API's description.
var public = map[string]bool{
	"/healthz": true, "/readyz": true,
	api.Prefix + "/openapi.json": true, api.Prefix + "/openapi.yaml": true,
	api.Prefix + "/openapi-3.0.json": true, api.Prefix + "/openapi-3.0.yaml": true,
	api.Prefix + "/version": true,
}

// isUI reports whether r is for the web page (Config.UI): a GET or HEAD
// outside the API and the operational endpoints.
func (s *Server) isUI(r *http.Request) bool {
	if s.cfg.UI == nil || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		return false
	}
	p := r.URL.Path
	return p != api.Prefix && !strings.HasPrefix(p, api.Prefix+"/") && p != "/metrics" && p != "/healthz" && p != "/readyz"
}

// authenticate puts the request's Caller in its context, or answers 401
// (no or unknown bearer token) or 503 (the authenticator failed). Whether
// the caller may do what it asks is each handler's decision.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Auth == nil || s.isPublic(r) || s.isUI(r) {
			next.ServeHTTP(w, r)
			return
		}
		tok, ok := bearerToken(r.Header.Get("Authorization"))
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kubetask"`)
			writeProblem(w, http.StatusUnauthorized, "missing bearer token: send the header Authorization: Bearer <token>")
			return
		}
		addr := clientAddr(r, s.cfg.TrustedProxies)
		var c Caller
		var err error
		end, wait, blocked := s.refusals.begin(addr)
		if blocked {
			// This client address had too many tokens refused: a token
			// known already is served without asking anyone; another
			// is checked in the address's turn, at RefusedTokenRate,
			// so that a valid one is served, late, and made-up ones
			// cost at most that rate of reviews.
			var known bool
			if c, known = knownCaller(s.cfg.Auth, tok); !known {
				var due time.Duration
				ok := false
				if ca, isComplete := s.cfg.Auth.(completeAuthenticator); !isComplete || !ca.KnowsEveryToken() {
					due, ok = s.refusals.turn(addr, s.cfg.RefusedTokenWait)
				}
				if !ok {
					s.metrics.refusedLimited.Inc()
					writeProblemHeaders(w, http.StatusTooManyRequests, retryAfter429(max(wait, due)),
						"too many unknown bearer tokens from this address: wait for Retry-After, then send a valid token")
					return
				}
				if !s.sleep(r.Context(), due) {
					return // the client left
				}
				c, err = s.cfg.Auth.Authenticate(r.Context(), tok)
			}
		} else {
			c, err = s.cfg.Auth.Authenticate(r.Context(), tok)
			if errors.Is(err, ErrUnauthenticated) {
				s.refusals.refused(addr)
			}
			end()
		}
		switch {
		case errors.Is(err, ErrUnauthenticated):
			// (A paced check was counted when its turn was reserved.)
			s.log.Info("refused a bearer token", "remote", r.RemoteAddr, "err", err)
			w.Header().Set("WWW-Authenticate", `Bearer realm="kubetask", error="invalid_token"`)
			writeProblem(w, http.StatusUnauthorized, "unknown or expired bearer token: send a token the server knows (its token file, or a valid Kubernetes token)")
			return
		case err != nil:
			s.log.Error("cannot authenticate", "remote", r.RemoteAddr, "err", err)
			writeProblem(w, http.StatusServiceUnavailable, "cannot check the bearer token now; try again")
			return
		}
		next.ServeHTTP(w, r.WithContext(withCaller(r.Context(), c)))
	})
}

// sleep waits d, or until ctx ends (false).
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := s.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

// isPublic reports whether r needs no token: a GET or HEAD of a public path.
func (s *Server) isPublic(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && public[r.URL.Path]
}

// refuseUncleanPaths answers 400 for a path with '.' or '..' segments or a
// repeated '/', which the router would otherwise redirect (307, text/html)
// to another path: a client that sent them did not mean that other path (a
// task ID "..", sent unescaped, would become the parent's URL), so it is told
// what is wrong instead. The server never redirects.
func (s *Server) refuseUncleanPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if r.Method == http.MethodConnect || p == cleanPath(p) {
			next.ServeHTTP(w, r)
			return
		}
		detail, msg := "the path has '.' or '..' segments: send the path itself (task IDs are never '.' or '..'; escape an ID as a path segment)", "has '.' or '..' segments"
		if !strings.Contains("/"+p+"/", "/./") && !strings.Contains("/"+p+"/", "/../") {
			detail, msg = "the path has a repeated '/': send it with single slashes (task IDs never contain '/')", "has a repeated '/'"
		}
		writeProblem(w, http.StatusBadRequest, detail, api.ProblemDetail{Location: "path", Value: p, Message: msg})
	})
}

// cleanPath is the path the router serves for p (net/http's cleaning):
// rooted, without '.' and '..' segments or repeated slashes, keeping a
// trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// limitBody reads request bodies up to MaxBodyBytes and answers 413 beyond,
// before any handler decodes them. It runs after authentication (a body
// is read only for a known caller), within the read deadline guardBody set.
func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		limit := s.cfg.MaxBodyBytes
		tooLarge := func() {
			w.Header().Set("Connection", "close")
			writeProblem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf(
				"request body larger than the server's limit of %d bytes: send a smaller document (put large data in a ConfigMap or a volume, not in the task)", limit))
		}
		if r.ContentLength > limit {
			tooLarge()
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
		_ = r.Body.Close()
		// The answer's WriteTimeout counts from the body's end.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			w.Header().Set("Connection", "close")
			writeProblem(w, http.StatusRequestTimeout, fmt.Sprintf("the request body did not arrive within %s: send it at once", s.cfg.BodyTimeout))
			return
		case err != nil:
			w.Header().Set("Connection", "close")
			writeProblem(w, http.StatusBadRequest, "cannot read the request body: "+err.Error())
			return
		}
		// The body is read: the connection's next request gets its own
		// deadline.
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		if int64(len(body)) > limit {
			tooLarge()
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	if err := s.cfg.Executor.Healthy(); err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "not healthy: "+err.Error())
		return
	}
	writeText(w, "ok\n")
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	select {
	case <-s.stopping:
		writeProblem(w, http.StatusServiceUnavailable, "not ready: shutting down")
		return
	default:
	}
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
	}
	writeText(w, "ok\n")
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	c := CallerFrom(r.Context())
	ok, err := c.Allowed(r.Context(), ActionMetrics, AllNamespaces)
	switch {
	case err != nil:
		s.log.Error("cannot authorize", "subject", c.Subject(), "action", ActionMetrics, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, "cannot check permissions now; try again")
		return
	case !ok:
		writeProblem(w, http.StatusForbidden, fmt.Sprintf("%s may not read /metrics (needs get on the non-resource URL /metrics)", c.Subject()))
		return
	}
	promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{Registry: s.cfg.Registry}).ServeHTTP(w, r)
}

func writeText(w http.ResponseWriter, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, s)
}

// writeProblemHeaders is writeProblem with extra headers (Retry-After).
func writeProblemHeaders(w http.ResponseWriter, status int, h http.Header, detail string) {
	for k, v := range h {
		w.Header()[k] = v
	}
	writeProblem(w, status, detail)
}

// writeProblem answers with RFC 9457 problem details, as huma's handlers do.
func writeProblem(w http.ResponseWriter, status int, detail string, errs ...api.ProblemDetail) {
	b, _ := json.Marshal(api.Problem{Title: http.StatusText(status), Status: status, Detail: detail, Errors: errs})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		for k, v := range retryAfterHeader() {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
