package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// KubernetesAuthConfig configures the kubernetes mode: the caller's bearer
// token is a Kubernetes token, checked with a TokenReview, and each request
// is checked with a SubjectAccessReview on pods in the task's namespace:
//
//	submit           create pods
//	get              get pods
//	list             list pods
//	watch            watch pods
//	logs             get pods/log
//	cancel           delete pods
//	rerun            create pods
//	metrics          get the non-resource URL /metrics
//
// A list or watch without a namespace is a review for all namespaces (a
// ClusterRole binding); a caller allowed only some namespaces names one.
type KubernetesAuthConfig struct {
	// Client creates the TokenReviews and SubjectAccessReviews (the serve
	// process's own credentials need create on both). Required. Give it a
	// rate limit of its own: reviews should not wait behind, nor hold up,
	// the rest of the process's calls.
	Client kubernetes.Interface
	// Audiences, when set, are the audiences the token must be for (one
	// of them): a token made for kubetask (kubectl create token --audience
	// kubetask) is accepted, and cannot be replayed against the API
	// server; a token for the API server is refused. Empty: the API
	// server's own audiences, so any token of the cluster.
	Audiences []string
	// CacheTTL is how long an answer (a token's user, a review's verdict,
	// an unknown token too) is reused. Default 10s; negative: no cache.
	CacheTTL time.Duration
	// CacheSize bounds the cached answers of known tokens (users and
	// verdicts), least recently used out first. Default 10000. Unknown
	// tokens have a cache of their own, a tenth of that size, so that a
	// flood of them never evicts a known one.
	CacheSize int
	// Clock is injected for tests. Default the real clock.
	Clock clock.PassiveClock
}

// KubernetesAuth is the kubernetes mode's Authenticator.
type KubernetesAuth struct {
	cfg     KubernetesAuthConfig
	cache   *ttlCache // known tokens' users and their verdicts
	unknown *ttlCache // unknown tokens
}

var _ Authenticator = (*KubernetesAuth)(nil)

// NewKubernetesAuth checks cfg, fills its defaults and returns the
// Authenticator.
func NewKubernetesAuth(cfg KubernetesAuthConfig) (*KubernetesAuth, error) {
	if cfg.Client == nil {
		return nil, errors.New("kubernetes auth: Client is required")
	}
	if cfg.CacheSize < 0 {
		return nil, fmt.Errorf("kubernetes auth: CacheSize must not be negative (0 means the default), got %d", cfg.CacheSize)
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = 10 * time.Second
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = 10000
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &KubernetesAuth{
		cfg:     cfg,
		cache:   newTTLCache(cfg.Clock, cfg.CacheTTL, cfg.CacheSize),
		unknown: newTTLCache(cfg.Clock, cfg.CacheTTL, max(cfg.CacheSize/10, 1)),
	}, nil
}

type tokenVerdict struct {
	user *authenticationv1.UserInfo // nil: unknown token
}

// Authenticate asks the API server who the token belongs to (TokenReview),
// or reuses an answer younger than CacheTTL.
func (a *KubernetesAuth) Authenticate(ctx context.Context, token string) (Caller, error) {
	h := tokenHash(token)
	key := "token\x00" + string(h[:])
	if v, ok := a.cache.get(key); ok {
		return a.caller(h, v.(tokenVerdict))
	}
	if _, ok := a.unknown.get(key); ok {
		return nil, ErrUnauthenticated
	}
	tr, err := a.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: a.cfg.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("reviewing the bearer token: %w", err)
	}
	if !tr.Status.Authenticated && tr.Status.Error != "" {
		// An authenticator failed rather than refused the token: refused
		// this time, not cached.
		return nil, fmt.Errorf("%w: %s", ErrUnauthenticated, tr.Status.Error)
	}
	if !tr.Status.Authenticated {
		a.unknown.put(key, tokenVerdict{})
		return nil, ErrUnauthenticated
	}
	if len(a.cfg.Audiences) > 0 && !slices.ContainsFunc(tr.Status.Audiences, func(aud string) bool { return slices.Contains(a.cfg.Audiences, aud) }) {
		// The API server did not say the token is for one of ours.
		a.unknown.put(key, tokenVerdict{})
		return nil, fmt.Errorf("%w: the token is not for the audience %v (its audiences: %v)", ErrUnauthenticated, a.cfg.Audiences, tr.Status.Audiences)
	}
	u := tr.Status.User
	v := tokenVerdict{user: &u}
	a.cache.put(key, v)
	return a.caller(h, v)
}

// Known returns the caller of a token whose user is cached, asking no one.
func (a *KubernetesAuth) Known(token string) (Caller, bool) {
	h := tokenHash(token)
	v, ok := a.cache.get("token\x00" + string(h[:]))
	if !ok {
		return nil, false
	}
	c, err := a.caller(h, v.(tokenVerdict))
	return c, err == nil
}

func (a *KubernetesAuth) caller(h [sha256.Size]byte, v tokenVerdict) (Caller, error) {
	if v.user == nil {
		return nil, ErrUnauthenticated
	}
	return &kubeCaller{auth: a, hash: h, user: v.user}, nil
}

type kubeCaller struct {
	auth *KubernetesAuth
	hash [sha256.Size]byte
	user *authenticationv1.UserInfo
}

func (c *kubeCaller) Subject() string { return c.user.Username }

// reviewAttributes maps an action to what it does to pods.
func reviewAttributes(action Action, ns string) (*authorizationv1.ResourceAttributes, *authorizationv1.NonResourceAttributes) {
	ra := &authorizationv1.ResourceAttributes{Namespace: ns, Resource: "pods"}
	switch action {
	case ActionSubmit, ActionRerun:
		ra.Verb = "create"
	case ActionGet:
		ra.Verb = "get"
	case ActionList:
		ra.Verb = "list"
	case ActionWatch:
		ra.Verb = "watch"
	case ActionLogs:
		ra.Verb, ra.Subresource = "get", "log"
	case ActionCancel:
		ra.Verb = "delete"
	case ActionMetrics:
		return nil, &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}
	case ActionDrain:
		// Draining a cluster is cordoning all of it: for who may cordon
		// nodes (of the cluster the service authenticates against).
		return &authorizationv1.ResourceAttributes{Resource: "nodes", Verb: "patch"}, nil
	default:
		return nil, nil
	}
	return ra, nil
}

// Allowed asks a SubjectAccessReview for the token's user, or reuses a
// verdict younger than CacheTTL (keyed by the token's hash, the action and
// the namespace).
func (c *kubeCaller) Allowed(ctx context.Context, action Action, ns string) (bool, error) {
	key := "sar\x00" + string(c.hash[:]) + "\x00" + string(action) + "\x00" + ns
	if v, ok := c.auth.cache.get(key); ok {
		return v.(bool), nil
	}
	ra, nra := reviewAttributes(action, ns)
	if ra == nil && nra == nil {
		return false, nil
	}
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range c.user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := c.auth.cfg.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			ResourceAttributes: ra, NonResourceAttributes: nra,
			User: c.user.Username, UID: c.user.UID, Groups: c.user.Groups, Extra: extra,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("reviewing access of %s to %s in namespace %q: %w", c.user.Username, action, ns, err)
	}
	if sar.Status.EvaluationError != "" && !sar.Status.Allowed && !sar.Status.Denied {
		// No authorizer had an opinion because one failed: not cached.
		return false, nil
	}
	c.auth.cache.put(key, sar.Status.Allowed)
	return sar.Status.Allowed, nil
}

// ttlCache keeps answers for a while, the size most recently used of them
// (an LRU: a burst of new keys evicts the least recently used, never the
// whole cache).
type ttlCache struct {
	clock clock.PassiveClock
	ttl   time.Duration
	lru   *lru.Cache
}

type ttlEntry struct {
	v       any
	expires time.Time
}

func newTTLCache(clk clock.PassiveClock, ttl time.Duration, size int) *ttlCache {
	return &ttlCache{clock: clk, ttl: ttl, lru: lru.New(size)}
}

func (c *ttlCache) get(key string) (any, bool) {
	if c.ttl <= 0 {
		return nil, false
	}
	v, ok := c.lru.Get(key)
	if !ok {
		return nil, false
	}
	e := v.(ttlEntry)
	if !c.clock.Now().Before(e.expires) {
		c.lru.Remove(key)
		return nil, false
	}
	return e.v, true
}

func (c *ttlCache) put(key string, v any) {
	if c.ttl <= 0 {
		return
	}
	c.lru.Add(key, ttlEntry{v: v, expires: c.clock.Now().Add(c.ttl)})
}
