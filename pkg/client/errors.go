package client

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kubetask/kubetask/pkg/api"
)

// Error is an answer of the API other than 2xx: its HTTP status and the
// problem details the server sent (RFC 9457). When the body was not problem
// details (a proxy's answer), Problem holds the status, its text and the
// start of the body.
type Error struct {
	// StatusCode is the HTTP status of the answer.
	StatusCode int
	// Problem is what the server said: title, detail and, for a bad
	// request or an invalid task, every individual error with its location
	// (body.<field path>, query.<name>, header.<name>, path.<name>).
	Problem api.Problem
	// RetryAfter is the answer's Retry-After (in seconds, or an HTTP date),
	// 0 when it has none: how long the server asks the client to wait
	// before it tries again (kubetask serve sends it with every 503).
	RetryAfter time.Duration
}

// Error renders the status, the detail and every individual error.
func (e *Error) Error() string { return e.Problem.Error() }

// errorOf reads a non-2xx response into an *Error.
func errorOf(resp *http.Response) *Error {
	e := &Error{StatusCode: resp.StatusCode, RetryAfter: retryAfter(resp.Header.Get("Retry-After"), time.Now())}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "application/problem+json" || mt == "application/json" {
		if json.Unmarshal(body, &e.Problem) != nil {
			e.Problem = api.Problem{}
		}
	}
	if e.Problem.Status == 0 {
		e.Problem.Status = resp.StatusCode
	}
	if e.Problem.Title == "" {
		e.Problem.Title = http.StatusText(resp.StatusCode)
	}
	if e.Problem.Detail == "" && len(e.Problem.Errors) == 0 {
		text := strings.TrimSpace(string(body))
		if len(text) > 512 {
			text = text[:512] + "..."
		}
		e.Problem.Detail = text
	}
	return e
}

// retryAfter reads a Retry-After value, delay-seconds or an HTTP date
// (RFC 9110), as a duration from now; 0 when it is missing, malformed or
// in the past.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 || n > int64(24*time.Hour/time.Second) {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// IsUnavailable reports whether err is a 503: the server cannot serve the
// request now (its store or the authorizer cannot be reached) and asks to
// be called again later (Error.RetryAfter).
func IsUnavailable(err error) bool { return StatusCode(err) == http.StatusServiceUnavailable }

// StatusCode returns the HTTP status of an *Error in err's chain, 0 when
// there is none (the request got no answer).
func StatusCode(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.StatusCode
	}
	return 0
}

// IsNotFound reports whether err is a 404: no such task (or one the caller may
// not see), attempt or container log.
func IsNotFound(err error) bool { return StatusCode(err) == http.StatusNotFound }

// IsConflict reports whether err is a 409: the task ID is taken by another
// document, or a rerun of a task that is not finished.
func IsConflict(err error) bool { return StatusCode(err) == http.StatusConflict }

// IsUnauthorized reports whether err is a 401: no token, or one the server
// does not know.
func IsUnauthorized(err error) bool { return StatusCode(err) == http.StatusUnauthorized }

// IsForbidden reports whether err is a 403: the token may not do that in that
// namespace.
func IsForbidden(err error) bool { return StatusCode(err) == http.StatusForbidden }

// IsInvalid reports whether err is a 422: an invalid task, whose problems
// are in the Problem's Errors, each with its field path.
func IsInvalid(err error) bool { return StatusCode(err) == http.StatusUnprocessableEntity }

// retryable reports whether a failed connection of a stream may succeed when
// tried again: no answer (a network error, a cut connection) or an answer
// that says "later" (408, 429, 502, 503, 504) or that the server failed (500:
// its store, say) when it may not fail again. Other answers (the request is
// refused) and TLS verification failures are final.
func retryable(err error) bool {
	if code := StatusCode(err); code != 0 {
		switch code {
		case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
			http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
		return false
	}
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		verification     *tls.CertificateVerificationError
		proto            *protocolError
	)
	return !errors.As(err, &unknownAuthority) && !errors.As(err, &hostname) && !errors.As(err, &invalid) &&
		!errors.As(err, &verification) && !errors.As(err, &proto)
}

// protocolError is an answer that is not what the API sends (a body that is
// not an event stream, an event that is not JSON): final.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return e.msg }
