package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Action is what a request does. A Caller is allowed or refused an action in
// a namespace; the kubernetes mode maps each action to a SubjectAccessReview
// (see KubernetesAuthConfig).
type Action string

// The actions of the API.
const (
	ActionSubmit  Action = "submit" // POST /namespaces/{ns}/tasks
	ActionGet     Action = "get"    // GET /tasks/{id}
	ActionList    Action = "list"   // GET /tasks
	ActionWatch   Action = "watch"  // GET /watch, /tasks/{id}/watch
	ActionLogs    Action = "logs"   // GET /tasks/{id}/logs
	ActionCancel  Action = "cancel" // POST /tasks/{id}/cancel
	ActionRerun   Action = "rerun"  // POST /tasks/{id}/rerun
	ActionMetrics Action = "metrics"
	ActionDrain   Action = "drain" // POST /clusters/{name}/drain, /resume, /lose
)

// phrase is the action as a refusal says it ("may not read the logs of
// tasks").
func (a Action) phrase() string {
	switch a {
	case ActionLogs:
		return "read the logs of tasks"
	case ActionMetrics:
		return "read the metrics"
	case ActionDrain:
		return "drain, resume or declare lost clusters"
	}
	return string(a) + " tasks"
}

// AllNamespaces is, as the namespace of an authorization question, asks about
// every namespace at once (a list or watch without a namespace filter).
const AllNamespaces = ""

// ErrUnauthenticated is returned (wrapped) by an Authenticator for a token it
// does not know; the server answers 401.
var ErrUnauthenticated = errors.New("unknown bearer token")

// Authenticator maps a request's bearer token to its Caller. The server asks
// it for every request except /healthz, /readyz and the OpenAPI document.
type Authenticator interface {
	// Authenticate returns the caller token stands for, or an error wrapping
	// ErrUnauthenticated when the token is unknown (401). Any other error
	// is the authenticator's failure (503).
	Authenticate(ctx context.Context, token string) (Caller, error)
}

// Caller is an authenticated client.
type Caller interface {
	// Subject names the caller (logs, metrics).
	Subject() string
	// Allowed reports whether the caller may do action in namespace
	// (AllNamespaces: in every namespace). An error is the authorizer's
	// failure, not a refusal.
	Allowed(ctx context.Context, action Action, namespace string) (bool, error)
}

// NamespaceLister is implemented by a Caller whose namespaces are known
// beforehand (token mode). A list or watch without a namespace filter by a
// caller not allowed AllNamespaces then returns what those namespaces hold;
// without it (kubernetes mode) such a request is refused: name a namespace.
type NamespaceLister interface {
	Namespaces() []string
}

// anonymous is the caller of a server without authentication: allowed
// everything (CheckListen permits that on loopback only).
type anonymous struct{}

func (anonymous) Subject() string                                       { return "anonymous" }
func (anonymous) Allowed(context.Context, Action, string) (bool, error) { return true, nil }

type callerKey struct{}

// CallerFrom returns the caller of a request's context: the authenticated
// one, or an allow-all caller named "anonymous" when the server has no
// Authenticator.
func CallerFrom(ctx context.Context) Caller {
	if c, ok := ctx.Value(callerKey{}).(Caller); ok {
		return c
	}
	return anonymous{}
}

func withCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// bearerToken returns the token of an "Authorization: Bearer <token>" header.
func bearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// tokenHash keys caches and tables by token without keeping the token.
func tokenHash(tok string) [sha256.Size]byte { return sha256.Sum256([]byte(tok)) }

// Token is one bearer token of the token mode: who it is and where it may act.
type Token struct {
	// Token is the secret the client sends as "Authorization: Bearer <token>".
	Token string `json:"token"`
	// Subject names the token's holder (logs, metrics).
	Subject string `json:"subject"`
	// Namespaces the token may use: a list, or "*" for every namespace.
	Namespaces Namespaces `json:"namespaces"`
}

// Namespaces is a list of namespaces; "*" stands for all of them. In a token
// file it is written as a list or as the string "*".
type Namespaces []string

// UnmarshalJSON accepts a list of names or the string "*".
func (n *Namespaces) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		if s != "*" {
			return fmt.Errorf(`namespaces must be a list of namespaces or "*", got the string %q`, s)
		}
		*n = Namespaces{"*"}
		return nil
	}
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return fmt.Errorf(`namespaces must be a list of namespaces or "*": %w`, err)
	}
	*n = l
	return nil
}

// All reports whether n allows every namespace.
func (n Namespaces) All() bool { return slices.Contains(n, "*") }

// TokenFile is the token mode's file:
//
//	tokens:
//	- token: 0c4d...   # the bearer token
//	  subject: ci      # who holds it
//	  namespaces: [team-a, team-b]   # or "*"
type TokenFile struct {
	Tokens []Token `json:"tokens"`
}

// LoadTokenFile reads and checks a token file (YAML or JSON, see TokenFile).
func LoadTokenFile(path string) ([]Token, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading token file: %w", err)
	}
	toks, err := ParseTokenFile(data)
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return toks, nil
}

// ParseTokenFile decodes and checks a token file's content; unknown fields are
// errors.
func ParseTokenFile(data []byte) ([]Token, error) {
	var f TokenFile
	if err := yaml.UnmarshalStrict(bytes.TrimSpace(data), &f); err != nil {
		return nil, fmt.Errorf("decoding tokens: %w", err)
	}
	if err := checkTokens(f.Tokens); err != nil {
		return nil, err
	}
	return f.Tokens, nil
}

func checkTokens(toks []Token) error {
	var errs []error
	if len(toks) == 0 {
		errs = append(errs, errors.New("tokens: list at least one token"))
	}
	seen := map[[sha256.Size]byte]int{}
	for i, t := range toks {
		at := fmt.Sprintf("tokens[%d]", i)
		if t.Token == "" {
			errs = append(errs, fmt.Errorf("%s.token: required: set the bearer token", at))
		} else if strings.ContainsAny(t.Token, " \t\r\n") {
			errs = append(errs, fmt.Errorf("%s.token: must not contain white space", at))
		}
		if j, dup := seen[tokenHash(t.Token)]; dup && t.Token != "" {
			errs = append(errs, fmt.Errorf("%s.token: the same token as tokens[%d]: give each holder its own", at, j))
		}
		seen[tokenHash(t.Token)] = i
		if t.Subject == "" {
			errs = append(errs, fmt.Errorf("%s.subject: required: name the token's holder", at))
		}
		if len(t.Namespaces) == 0 {
			errs = append(errs, fmt.Errorf(`%s.namespaces: required: list the namespaces the token may use, or "*" for all`, at))
		}
		for _, ns := range t.Namespaces {
			if ns == "*" {
				continue
			}
			for _, msg := range validation.IsDNS1123Label(ns) {
				errs = append(errs, fmt.Errorf("%s.namespaces: %q: %s", at, ns, msg))
			}
		}
	}
	return errors.Join(errs...)
}

// TokenAuth is the token mode: a fixed table of bearer tokens, each with a
// subject and the namespaces it may use for every action. Any known token may
// read /metrics.
type TokenAuth struct {
	callers atomic.Pointer[map[[sha256.Size]byte]*tokenCaller]
}

var _ Authenticator = (*TokenAuth)(nil)

// NewTokenAuth returns the token mode's Authenticator for toks (checked as
// ParseTokenFile checks them).
func NewTokenAuth(toks []Token) (*TokenAuth, error) {
	if err := checkTokens(toks); err != nil {
		return nil, fmt.Errorf("token auth: %w", err)
	}
	a := &TokenAuth{}
	if err := a.Reload(toks); err != nil {
		return nil, err
	}
	return a, nil
}

// Reload replaces the tokens with toks (checked as ParseTokenFile checks
// them; on an error the tokens stay as they were). Requests authenticated
// from then on see the new tokens: a removed token is refused at once.
func (a *TokenAuth) Reload(toks []Token) error {
	if err := checkTokens(toks); err != nil {
		return fmt.Errorf("token auth: %w", err)
	}
	m := map[[sha256.Size]byte]*tokenCaller{}
	for _, t := range toks {
		m[tokenHash(t.Token)] = &tokenCaller{subject: t.Subject, namespaces: slices.Clone(t.Namespaces)}
	}
	a.callers.Store(&m)
	return nil
}

// Authenticate looks the token up by its SHA-256 (the table holds no token).
func (a *TokenAuth) Authenticate(_ context.Context, token string) (Caller, error) {
	c, ok := a.Known(token)
	if !ok {
		return nil, ErrUnauthenticated
	}
	return c, nil
}

// Known is Authenticate: every token is known beforehand.
func (a *TokenAuth) Known(token string) (Caller, bool) {
	c, ok := (*a.callers.Load())[tokenHash(token)]
	return c, ok
}

// KnowsEveryToken is true: Known answers for every token of the file.
func (a *TokenAuth) KnowsEveryToken() bool { return true }

type tokenCaller struct {
	subject    string
	namespaces Namespaces
}

var _ NamespaceLister = (*tokenCaller)(nil)

func (c *tokenCaller) Subject() string { return c.subject }

func (c *tokenCaller) Allowed(_ context.Context, action Action, ns string) (bool, error) {
	if action == ActionMetrics || c.namespaces.All() {
		return true, nil
	}
	return ns != AllNamespaces && slices.Contains(c.namespaces, ns), nil
}

func (c *tokenCaller) Namespaces() []string {
	if c.namespaces.All() {
		return nil
	}
	return slices.Clone(c.namespaces)
}
