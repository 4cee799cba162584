package server

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/kubetask/kubetask/pkg/api"
)

// knownAuthenticator is an Authenticator that tells a token it knows
// already without asking anyone (no TokenReview).
type knownAuthenticator interface {
	Known(token string) (Caller, bool)
}

// completeAuthenticator is a knownAuthenticator that knows every token it
// would accept (token mode): a token it does not know is unknown, and
// checking it again costs nothing.
type completeAuthenticator interface {
	KnowsEveryToken() bool
}

// knownCaller is the caller of a token a knownAuthenticator knows.
func knownCaller(a Authenticator, tok string) (Caller, bool) {
	if k, ok := a.(knownAuthenticator); ok {
		return k.Known(tok)
	}
	return nil, false
}

// guardBody gives a request body a deadline and refuses one where none
// belongs, before authentication: only POST takes a body. A body must
// arrive within BodyTimeout of the request (408 and the connection closed
// beyond); any other request with a body is a 400 and its connection is
// closed without reading it. The response must be written within
// WriteTimeout (streams push that deadline on as they write).
func (s *Server) guardBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		now := time.Now()
		_ = rc.SetWriteDeadline(now.Add(s.cfg.WriteTimeout))
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			if r.Method != http.MethodPost {
				w.Header().Set("Connection", "close")
				writeProblem(w, http.StatusBadRequest, fmt.Sprintf("%s requests take no body: send it without one", r.Method))
				return
			}
			_ = rc.SetReadDeadline(now.Add(s.cfg.BodyTimeout))
			// A refusal before the body was read (401, 403, 429, ...)
			// closes the connection: net/http would otherwise read
			// the rest of a small body before answering, for up to
			// BodyTimeout, to reuse the connection.
			body := &readBody{ReadCloser: r.Body}
			r.Body = body
			w = &closeUnread{ResponseWriter: w, body: body}
		}
		next.ServeHTTP(w, r)
	})
}

// readBody is a request body that tells whether it was read to its end.
type readBody struct {
	io.ReadCloser
	done atomic.Bool
}

func (b *readBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done.Store(true)
	}
	return n, err
}

// closeUnread answers "Connection: close" with an error status whose
// request body was not read, and reads no more of the body.
type closeUnread struct {
	http.ResponseWriter
	body *readBody
}

func (w *closeUnread) WriteHeader(code int) {
	if code >= 400 && !w.body.done.Load() {
		w.Header().Set("Connection", "close")
		// Closing the body after the handler would still read up to
		// 256 KiB of it: the read deadline ends that at once.
		_ = http.NewResponseController(w.ResponseWriter).SetReadDeadline(time.Now())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *closeUnread) Write(b []byte) (int, error) { return w.ResponseWriter.Write(b) }

func (w *closeUnread) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *closeUnread) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// limitKey is what the per-caller limits count by: the caller's subject.
func limitKey(c Caller) string { return c.Subject() }

// requestNamespace is the namespace whose share of the request slots r
// counts against: the one it names (its path's, ?namespace=), else its
// caller's own (callerNamespace); "" for none.
func requestNamespace(r *http.Request, c Caller) string {
	if rest, ok := strings.CutPrefix(r.URL.Path, api.Prefix+"/namespaces/"); ok {
		ns, _, _ := strings.Cut(rest, "/")
		return ns
	}
	if ns := r.URL.Query().Get("namespace"); ns != "" {
		return ns
	}
	return callerNamespace(c)
}

// callerNamespace is the namespace a caller belongs to, if any: a
// Kubernetes ServiceAccount's (system:serviceaccount:NS:NAME), or a token's
// only namespace; "" otherwise (the per-caller limit holds alone then).
func callerNamespace(c Caller) string {
	if rest, ok := strings.CutPrefix(c.Subject(), "system:serviceaccount:"); ok {
		if _, isKube := c.(*kubeCaller); isKube {
			ns, _, _ := strings.Cut(rest, ":")
			return ns
		}
	}
	if nl, ok := c.(NamespaceLister); ok {
		if nss := nl.Namespaces(); len(nss) == 1 {
			return nss[0]
		}
	}
	return ""
}

// limitRequests holds a slot of MaxRequests (in total) and
// MaxRequestsPerCaller (per caller) for each authenticated request while it
// is served, and answers 429 with Retry-After beyond either. A request that
// becomes a stream gives its slot back for a stream's (openStream).
func (s *Server) limitRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.isPublic(r) || s.isUI(r) {
			next.ServeHTTP(w, r)
			return
		}
		c := CallerFrom(r.Context())
		release, limit := s.requests.acquire(limitKey(c), requestNamespace(r, c))
		if release == nil {
			s.metrics.refused.WithLabelValues("requests").Inc()
			writeProblemHeaders(w, http.StatusTooManyRequests, retryAfter429(time.Second),
				fmt.Sprintf("too many requests at once: %s requests in flight is reached; retry after Retry-After seconds", limit))
			return
		}
		defer release()
		requestFrom(r.Context()).release = release
		next.ServeHTTP(w, r)
	})
}

// streamRetry is the Retry-After of a stream refused by a limit.
const streamRetry = 10 * time.Second

// openStream takes a stream's slot (MaxStreams, MaxStreamsPerCaller,
// MaxStreamsPerNamespace) for caller c, of namespace ns (the one streamed;
// "" for several: then the caller's own, callerNamespace), giving back the slot of its request r, or returns a 429 error.
// The gauge kubetask_api_streams{kind} counts the slot from here until its
// release: once it reads 0, every stream of that kind has given its slot
// back.
func (s *Server) openStream(r *requestInfo, c Caller, kind, ns string) (func(), error) {
	if ns == "" {
		ns = callerNamespace(c)
	}
	release, limit := s.streams.acquire(limitKey(c), ns)
	if release == nil {
		s.metrics.refused.WithLabelValues("streams").Inc()
		return nil, tooManyStreams(limit)
	}
	if r.release != nil {
		r.release()
	}
	open := s.metrics.streams.WithLabelValues(kind)
	open.Inc()
	return func() { release(); open.Dec() }, nil
}

// checkHost refuses, without authentication, a request whose Host is not a
// loopback name or address (DNS rebinding: a web page of another site
// reaching the loopback server under its own name).
func (s *Server) checkHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Auth != nil || loopbackHost(r.Host) {
			next.ServeHTTP(w, r)
			return
		}
		writeProblem(w, http.StatusMisdirectedRequest, fmt.Sprintf(
			"host %q is not a loopback name: without authentication (auth mode none) the server answers only requests for localhost, 127.0.0.1 or [::1]; use one of them, or configure authentication", r.Host))
	})
}

// loopbackHost reports whether a Host header names a loopback host.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return isLoopback(host) || strings.EqualFold(strings.TrimSuffix(host, "."), "localhost")
}

// refuseCrossSite refuses, in every auth mode, requests a browser sent from
// another site: state-changing ones by net/http's CrossOriginProtection
// (Sec-Fetch-Site, else Origin against Host), and any request to the API or
// /metrics that Sec-Fetch-Site says is cross-site.
func (s *Server) refuseCrossSite(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		apiPath := p == api.Prefix || strings.HasPrefix(p, api.Prefix+"/") || p == "/metrics"
		if err := cop.Check(r); err != nil || (apiPath && r.Header.Get("Sec-Fetch-Site") == "cross-site") {
			writeProblem(w, http.StatusForbidden, "cross-site request refused: the API answers only its own web page and clients that are not browsers (the request's Sec-Fetch-Site or Origin names another site)")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// tooManyStreams is the 429 of a stream refused by limit.
func tooManyStreams(limit string) error {
	return huma.ErrorWithHeaders(huma.NewError(http.StatusTooManyRequests, fmt.Sprintf(
		"too many streams at once: %s open watches and log follows is reached; close one, or retry after Retry-After seconds", limit)),
		retryAfter429(streamRetry))
}
