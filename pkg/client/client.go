package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kubetask/kubetask/pkg/api"
)

// DefaultServer is the address `kubetask serve` listens on by default.
const DefaultServer = "http://127.0.0.1:8080"

// Client calls kubetask's HTTP API. It is safe for concurrent use; create it
// with New.
type Client struct {
	base      string // scheme://host[:port][/prefix] without a trailing slash
	hc        *http.Client
	token     string
	userAgent string
	backoff   backoffConfig
	retry503  time.Duration
	busy      busyRetry
	log       *slog.Logger
	// wait waits d between the tries of a call, or until ctx ends (a timer;
	// tests see the waits without taking them).
	wait func(ctx context.Context, d time.Duration) error
	// onVersion and versionSeen: WithServerVersion.
	onVersion   func(string)
	versionSeen atomic.Bool
}

// Option configures a Client.
type Option func(*settings) error

type settings struct {
	httpClient *http.Client
	token      string
	userAgent  string
	caFile     string
	caPEM      []byte
	insecure   bool
	backoff    backoffConfig
	retry503   time.Duration
	busy       busyRetry
	log        *slog.Logger
	onVersion  func(string)
}

// busyRetry bounds the tries of a call answered 429 (WithBusyRetry).
type busyRetry struct {
	tries   int
	maxWait time.Duration
}

// WithToken sends token as "Authorization: Bearer <token>" on every request.
func WithToken(token string) Option {
	return func(s *settings) error {
		s.token = strings.TrimSpace(token)
		return nil
	}
}

// WithHTTPClient makes the client send its requests with hc. Its Timeout
// must be 0 for Watch and Logs with Follow, which last as long as their
// context. Without it the client uses its own, over a clone of
// http.DefaultTransport (proxies from the environment, HTTP/2).
func WithHTTPClient(hc *http.Client) Option {
	return func(s *settings) error {
		if hc == nil {
			return errors.New("WithHTTPClient: nil *http.Client")
		}
		s.httpClient = hc
		return nil
	}
}

// WithCAFile trusts the PEM certificates in the file (beside none other) for
// an https server: the CA of a server with a self-signed certificate.
func WithCAFile(path string) Option {
	return func(s *settings) error {
		s.caFile = path
		return nil
	}
}

// WithCA trusts the PEM certificates pem (beside none other) for an https
// server.
func WithCA(pem []byte) Option {
	return func(s *settings) error {
		s.caPEM = pem
		return nil
	}
}

// WithInsecureSkipVerify accepts any certificate of an https server. It
// exposes the token and the tasks to whoever is in the middle: for tests.
func WithInsecureSkipVerify() Option {
	return func(s *settings) error {
		s.insecure = true
		return nil
	}
}

// WithUserAgent sets the User-Agent header of every request. Default
// "kubetask-client".
func WithUserAgent(ua string) Option {
	return func(s *settings) error {
		s.userAgent = ua
		return nil
	}
}

// WithRetryBackoff sets the delays between the reconnections of Watch and
// Logs: min after the first failure, doubling (with jitter) up to max.
// Defaults 250ms and 30s.
func WithRetryBackoff(minDelay, maxDelay time.Duration) Option {
	return func(s *settings) error {
		if minDelay <= 0 || maxDelay < minDelay {
			return fmt.Errorf("WithRetryBackoff: want 0 < min <= max, got %s and %s", minDelay, maxDelay)
		}
		s.backoff = backoffConfig{min: minDelay, max: maxDelay}
		return nil
	}
}

// DefaultUnavailableRetry is how long a call keeps trying again while the
// server answers 503, unless WithUnavailableRetry says otherwise.
const DefaultUnavailableRetry = time.Minute

// WithUnavailableRetry sets how long a call that the server answers 503
// Service Unavailable (its store or the authorizer cannot be reached now)
// keeps trying again: after each answer's Retry-After, or the retry backoff
// (WithRetryBackoff) when it has none, until d has passed since the first
// 503 (then the last 503 is returned) or the context ends. 0 turns it off.
// Default DefaultUnavailableRetry.
//
// Only calls that are safe to repeat are tried again: Get, List, Cancel,
// and Submit and Rerun with an ID (a 503 can hide a write that was made
// while the connection to the store broke; with an ID, the retry returns
// that task instead of making another). A Submit or Rerun without an ID
// returns the first 503. Watch and Logs have their own retries.
func WithUnavailableRetry(d time.Duration) Option {
	return func(s *settings) error {
		if d < 0 {
			return fmt.Errorf("WithUnavailableRetry: negative duration %s", d)
		}
		s.retry503 = d
		return nil
	}
}

// Defaults of WithBusyRetry.
const (
	DefaultBusyRetries = 5
	DefaultBusyWait    = time.Minute
)

// WithBusyRetry sets how a call that the server answers 429 Too Many
// Requests (kubetask serve: a limit on the requests in flight, the
// caller's or everyone's, is reached) is sent again: at most tries times,
// each after the answer's Retry-After (else the retry backoff,
// WithRetryBackoff), as long as the waits add up to at most maxWait; then,
// or when the server asks for a longer wait, the 429 is returned, with how
// often it was sent. The context ends a wait at once. tries 0 turns it off.
// Defaults DefaultBusyRetries and DefaultBusyWait.
//
// Only calls that are safe to repeat are sent again, as after a 503
// (WithUnavailableRetry): Get, List, Cancel, Version, and Submit and Rerun
// with an ID. A Submit or Rerun without an ID returns the first 429.
func WithBusyRetry(tries int, maxWait time.Duration) Option {
	return func(s *settings) error {
		if tries < 0 || maxWait < 0 {
			return fmt.Errorf("WithBusyRetry: want tries >= 0 and maxWait >= 0, got %d and %s", tries, maxWait)
		}
		s.busy = busyRetry{tries: tries, maxWait: maxWait}
		return nil
	}
}

// WithServerVersion calls f once per Client, with the server's version
// (the api.HeaderVersion header) of the first response that carries one, an
// error response included, before the call that got it returns. A client
// compares it with its own to warn about version skew.
func WithServerVersion(f func(version string)) Option {
	return func(s *settings) error {
		s.onVersion = f
		return nil
	}
}

// WithLogger logs the reconnections of Watch and Logs (at debug level) to l.
// Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(s *settings) error {
		s.log = l
		return nil
	}
}

// New returns a client of the API at baseURL (http:// or https://, host and
// port, and the path prefix of a proxy if there is one; the API itself is
// under api.Prefix below it). It reads the CA file of WithCAFile now.
func New(baseURL string, opts ...Option) (*Client, error) {
	base, err := parseBase(baseURL)
	if err != nil {
		return nil, err
	}
	s := settings{userAgent: "kubetask-client", backoff: defaultBackoff, retry503: DefaultUnavailableRetry,
		busy: busyRetry{tries: DefaultBusyRetries, maxWait: DefaultBusyWait}}
	for _, o := range opts {
		if err := o(&s); err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
	}
	hc, err := s.client()
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return &Client{base: base, hc: hc, token: s.token, userAgent: s.userAgent, backoff: s.backoff, retry503: s.retry503,
		busy: s.busy, log: s.log, wait: sleep, onVersion: s.onVersion}, nil
}

// BaseURL returns the server address the client calls (without a trailing
// slash).
func (c *Client) BaseURL() string { return c.base }

func parseBase(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("server address %q: want http://HOST:PORT or https://HOST:PORT (such as %s)", raw, DefaultServer)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("server address %q: give scheme, host, port and path only (no user, query or fragment)", raw)
	}
	return strings.TrimRight(u.Scheme+"://"+u.Host+u.EscapedPath(), "/"), nil
}

// client builds the HTTP client: the given one, or a new one; the TLS
// options apply to a clone of its transport.
func (s *settings) client() (*http.Client, error) {
	hc := s.httpClient
	if hc == nil {
		hc = &http.Client{}
	}
	if s.caFile == "" && s.caPEM == nil && !s.insecure {
		if s.httpClient == nil {
			hc.Transport = http.DefaultTransport.(*http.Transport).Clone()
		}
		return hc, nil
	}
	var tr *http.Transport
	switch rt := hc.Transport.(type) {
	case nil:
		tr = http.DefaultTransport.(*http.Transport).Clone()
	case *http.Transport:
		tr = rt.Clone()
	default:
		return nil, fmt.Errorf("the TLS options need an *http.Transport, the given client has a %T", rt)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if tr.TLSClientConfig != nil {
		cfg = tr.TLSClientConfig.Clone()
	}
	if s.caFile != "" || s.caPEM != nil {
		pem := s.caPEM
		if s.caFile != "" {
			b, err := os.ReadFile(s.caFile)
			if err != nil {
				return nil, fmt.Errorf("reading the CA file: %w", err)
			}
			pem = append(append(pem, '\n'), b...)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no PEM certificate in the CA %s", orText(s.caFile, "given"))
		}
		cfg.RootCAs = pool
	}
	cfg.InsecureSkipVerify = s.insecure // the caller asked for it (WithInsecureSkipVerify)
	tr.TLSClientConfig = cfg
	out := *hc
	out.Transport = tr
	return &out, nil
}

func orText(s, def string) string {
	if s == "" {
		return def
	}
	return "file " + s
}

// request is one API call.
type request struct {
	method string
	path   string // below api.Prefix, escaped
	query  url.Values
	header http.Header
	body   []byte
	// repeatable says that sending the request again is safe (GETs are);
	// call then tries again after a 503.
	repeatable bool
}

// send sends r and returns the response of a 2xx answer, whose body the
// caller closes, or the *Error of another answer.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	u := c.base + api.Prefix + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	var body io.Reader = http.NoBody
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, fmt.Errorf("building the request: %w", err)
	}
	for k, vs := range r.header {
		req.Header[k] = vs
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("User-Agent", c.userAgent)
	injectTraceContext(ctx, req.Header)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if v := resp.Header.Get(api.HeaderVersion); v != "" && c.onVersion != nil && c.versionSeen.CompareAndSwap(false, true) {
		c.onVersion(v)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, errorOf(resp)
	}
	return resp, nil
}

// sendRetrying is send that sends a GET or repeatable request again while
// the server answers 503, after its Retry-After (else the backoff), for up
// to c.retry503 from the first 503; and while it answers 429, after its
// Retry-After (else the backoff), within c.busy's tries and waits.
func (c *Client) sendRetrying(ctx context.Context, r request) (*http.Response, error) {
	var (
		deadline time.Time // of the 503s
		b        *backoff
		busy     busyTries
	)
	for {
		resp, err := c.send(ctx, r)
		var e *Error
		if err == nil || !errors.As(err, &e) {
			return resp, err
		}
		switch {
		case e.StatusCode == http.StatusTooManyRequests && c.busy.tries > 0 && r.method != http.MethodGet && !r.repeatable:
			return nil, fmt.Errorf("%w (not sent again: a submission without an ID could run twice; give it an ID to let the client retry it)", err)
		case r.method != http.MethodGet && !r.repeatable:
			return nil, err
		case e.StatusCode == http.StatusTooManyRequests:
			d, berr := c.nextBusy(&busy, err, e)
			if berr != nil {
				return nil, berr
			}
			c.log.Debug("server at its request limit, trying again", "method", r.method, "path", api.Prefix+r.path, "after", d, "detail", e.Problem.Detail)
			if serr := c.wait(ctx, d); serr != nil {
				return nil, fmt.Errorf("%w (while waiting to try again after: %w)", serr, err)
			}
		case e.StatusCode == http.StatusServiceUnavailable && c.retry503 > 0:
			if deadline.IsZero() {
				deadline = time.Now().Add(c.retry503)
			}
			if b == nil {
				b = c.backoff.start()
			}
			d := e.RetryAfter
			if d <= 0 {
				d = b.delay()
			}
			if time.Until(deadline) < d {
				return nil, err
			}
			c.log.Debug("server unavailable, trying again", "method", r.method, "path", api.Prefix+r.path, "after", d, "detail", e.Problem.Detail)
			if serr := c.wait(ctx, d); serr != nil {
				return nil, fmt.Errorf("%w (while waiting to try again after: %w)", serr, err)
			}
		default:
			return nil, err
		}
	}
}

// busyTries counts the 429s of one call and the time waited after them
// (WithBusyRetry).
type busyTries struct {
	n      int
	waited time.Duration
	b      *backoff
}

// nextBusy says how long to wait before sending again a call that the
// server answered err, the 429 e: its Retry-After, else the retry backoff.
// It returns err, saying why, when it is not to be sent again: retries are
// off, c.busy.tries are spent, or the wait would take the call beyond
// c.busy.maxWait.
func (c *Client) nextBusy(t *busyTries, err error, e *Error) (time.Duration, error) {
	if c.busy.tries <= 0 {
		return 0, err
	}
	t.n++
	if t.b == nil {
		t.b = c.backoff.start()
	}
	d := e.RetryAfter
	if d <= 0 {
		d = t.b.delay()
	}
	switch {
	case t.n > c.busy.tries:
		return 0, fmt.Errorf("%w (sent %d times, waiting %s in all; the server is still at its limit)", err, t.n, t.waited.Round(time.Millisecond))
	case t.waited+d > c.busy.maxWait:
		return 0, fmt.Errorf("%w (sent %d times; the server asks to wait %s, beyond the client's bound of %s in all: try again later)", err, t.n, d, c.busy.maxWait)
	}
	t.waited += d
	return d, nil
}

// isBusy returns the *Error of a 429 in err's chain.
func isBusy(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) && e.StatusCode == http.StatusTooManyRequests {
		return e, true
	}
	return nil, false
}

// reconnectDelay is the wait before a stream (Watch, Logs) connects again
// after err: the backoff's delay d, or the answer's Retry-After (a 429 or
// a 503) when that is longer, up to the bound of WithBusyRetry.
func (c *Client) reconnectDelay(d time.Duration, err error) time.Duration {
	var e *Error
	if errors.As(err, &e) && e.RetryAfter > d {
		return min(e.RetryAfter, max(c.busy.maxWait, d))
	}
	return d
}

// answer is what call returns of a response besides its body.
type answer struct {
	status int
	header http.Header
}

// call sends r and decodes the JSON answer into out. A GET or repeatable
// request answered 503 is sent again (WithUnavailableRetry).
func (c *Client) call(ctx context.Context, r request, out any) (answer, error) {
	if r.header == nil {
		r.header = http.Header{}
	}
	r.header.Set("Accept", "application/json")
	resp, err := c.sendRetrying(ctx, r)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return answer{}, fmt.Errorf("decoding the answer of %s %s: %w", r.method, api.Prefix+r.path, err)
	}
	return answer{status: resp.StatusCode, header: resp.Header}, nil
}

// pathOf joins escaped path segments.
func pathOf(segments ...string) string {
	var b strings.Builder
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}
