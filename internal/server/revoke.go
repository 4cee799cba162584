package server

import (
	"context"
	"errors"
	"time"
)

// streamAccess is what an open stream (a watch, a log follow) was allowed
// when it opened: its caller's bearer token and an action in some
// namespaces. The stream asks again every AuthRecheck (stillAllowed) and
// ends once the answer is no, so that a revoked token or permission (a
// RoleBinding removed, a token deleted) does not keep a stream open until
// StreamTimeout.
type streamAccess struct {
	s      *Server
	token  string
	action Action
	// namespaces must each still allow action (AllNamespaces: all at once).
	namespaces []string
}

// access returns the streamAccess of the request in ctx doing action in
// namespaces.
func (s *Server) access(ctx context.Context, action Action, namespaces ...string) *streamAccess {
	a := &streamAccess{s: s, action: action, namespaces: namespaces}
	if r := requestFrom(ctx).req; r != nil {
		a.token, _ = bearerToken(r.Header.Get("Authorization"))
	}
	return a
}

// scopeNamespaces are the namespaces a list or watch of sc covers, as
// authorization questions.
func (sc scope) namespaces() []string {
	switch {
	case sc.namespace != "":
		return []string{sc.namespace}
	case sc.only != nil:
		return sc.only
	}
	return []string{AllNamespaces}
}

// recheck returns the channel of the stream's periodic checks and the
// function that stops them; a server without authentication has none (a
// nil channel).
func (a *streamAccess) recheck() (<-chan time.Time, func()) {
	if a.s.cfg.Auth == nil {
		return nil, func() {}
	}
	t := a.s.cfg.Clock.NewTicker(a.s.cfg.AuthRecheck)
	return t.C(), t.Stop
}

// stillAllowed authenticates the stream's token again and asks whether its
// caller may still do the action in each of the stream's namespaces (through
// the authenticator's cache). Only a refusal ends a stream: an authenticator
// or authorizer that cannot answer now is logged and asked again at the next
// check.
func (a *streamAccess) stillAllowed(ctx context.Context) bool {
	if a.s.cfg.Auth == nil {
		return true
	}
	c, err := a.s.cfg.Auth.Authenticate(ctx, a.token)
	switch {
	case errors.Is(err, ErrUnauthenticated):
		a.s.log.Info("stream ended: its bearer token is refused now", "action", a.action, "err", err)
		return false
	case err != nil:
		if ctx.Err() == nil {
			a.s.log.Warn("cannot check an open stream's token now; checking again later", "action", a.action, "err", err)
		}
		return true
	}
	for _, ns := range a.namespaces {
		ok, err := c.Allowed(ctx, a.action, ns)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				a.s.log.Warn("cannot check an open stream's permission now; checking again later", "subject", c.Subject(), "action", a.action, "namespace", ns, "err", err)
			}
			return true
		case !ok:
			a.s.log.Info("stream ended: its caller may no longer do what opened it", "subject", c.Subject(), "action", a.action, "namespace", ns)
			return false
		}
	}
	return true
}
