package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"unicode/utf8"
)

// auditEntry is what a mutating request's handler tells the audit line: who
// asked, for what, on which task. The audit middleware puts one in the
// request's context; handlers fill it with noteAudit.
type auditEntry struct {
	caller    Caller
	action    Action
	namespace string
	task      string
	created   string // the task a submission or rerun created or found
}

type auditKey struct{}

// noteAudit records, for the request's audit line, the caller, the action
// and the task (its namespace and ID, where known); empty arguments change
// nothing. A no-op outside a mutating request.
func noteAudit(ctx context.Context, action Action, namespace, task string) {
	e, ok := ctx.Value(auditKey{}).(*auditEntry)
	if !ok {
		return
	}
	e.caller = CallerFrom(ctx)
	if action != "" {
		e.action = action
	}
	if namespace != "" {
		e.namespace = namespace
	}
	if task != "" {
		e.task = task
	}
}

// noteCreated records the task a submission or rerun answers with.
func noteCreated(ctx context.Context, id string) {
	if e, ok := ctx.Value(auditKey{}).(*auditEntry); ok {
		e.created = id
	}
}

// mutating reports whether a request may change something: every method but
// GET, HEAD and OPTIONS.
func mutating(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// auditRequests writes one structured line (message "audit") for every
// mutating request once it is answered, refused ones included: who (the
// authenticated caller, or "unauthenticated"), what (the action, method and
// path), which task (namespace, ID), and the verdict with the status code.
func (s *Server) auditRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !mutating(r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		e := &auditEntry{}
		aw := &auditWriter{ResponseWriter: w}
		next.ServeHTTP(aw, r.WithContext(context.WithValue(r.Context(), auditKey{}, e)))
		code := aw.status
		if code == 0 {
			code = http.StatusOK
		}
		attrs := []slog.Attr{
			slog.String("verdict", verdict(code)), slog.Int("code", code),
			slog.String("action", string(e.action)), slog.String("method", clip(r.Method, auditMethodBytes)), slog.String("path", clip(r.URL.Path, auditPathBytes)),
			slog.String("namespace", clip(e.namespace, auditPathBytes)), slog.String("task", clip(e.task, auditPathBytes)), slog.String("created", e.created),
			slog.String("remote", r.RemoteAddr),
		}
		if e.caller == nil {
			attrs = append(attrs, slog.Group("who", slog.String("user", "unauthenticated")))
		} else {
			a := actorOf(e.caller)
			attrs = append(attrs, slog.Group("who", slog.String("auth", a.Auth), slog.String("user", a.User),
				slog.String("uid", a.UID), slog.Any("groups", a.Groups)))
		}
		s.cfg.AuditLogger.LogAttrs(r.Context(), slog.LevelInfo, "audit", attrs...)
	})
}

// What an audit line keeps of a request's method and path (and task): a
// method is a short word, and a path of the API at most about 1.6 KB (a
// task ID of 512 bytes, escaped); a longer one is cut, so that a request,
// unauthenticated ones included, never writes more than a few KB of audit
// log.
const (
	auditMethodBytes = 32
	auditPathBytes   = 2048
)

// clip is s cut to n bytes (at a rune's start), saying how long it was.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("...(%d bytes)", len(s))
}

// verdict names what became of a request by its status code.
func verdict(code int) string {
	switch {
	case code < 400:
		return "allowed"
	case code == http.StatusUnauthorized:
		return "unauthenticated"
	case code == http.StatusForbidden || code == http.StatusNotFound:
		return "refused"
	case code < 500:
		return "invalid"
	}
	return "error"
}

// auditWriter remembers the status code.
type auditWriter struct {
	http.ResponseWriter
	status int
}

func (w *auditWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *auditWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *auditWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
