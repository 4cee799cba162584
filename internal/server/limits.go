package server

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/utils/lru"
)

// The methods the metrics name; every other method is counted as "other",
// so that made-up methods cannot create series.
var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

// methodLabel is the method as a metric label: one of knownMethods or
// "other".
func methodLabel(m string) string {
	if knownMethods[m] {
		return m
	}
	return "other"
}

// codeLabel is a status code as a metric label: a valid code (100-599) or
// "other".
func codeLabel(code int) string {
	if code < 100 || code > 599 {
		return "other"
	}
	return strconv.Itoa(code)
}

// slots counts what is open (requests, streams) in total, per caller and
// per namespace, and refuses beyond any limit. A limit of 0 or less is no
// limit; a namespace "" has none of its own.
type slots struct {
	total, perKey, perNS int

	mu    sync.Mutex
	n     int
	byKey map[string]int
	byNS  map[string]int
}

func newSlots(total, perKey, perNS int) *slots {
	return &slots{total: total, perKey: perKey, perNS: perNS, byKey: map[string]int{}, byNS: map[string]int{}}
}

// acquire takes a slot for key in namespace ns. It returns the function
// that gives it back (idempotent) or, when a limit is reached, nil and
// which one ("the server's", "this caller's" or the namespace's share).
func (s *slots) acquire(key, ns string) (release func(), limit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total > 0 && s.n >= s.total {
		return nil, fmt.Sprintf("the server's limit of %d", s.total)
	}
	if s.perKey > 0 && s.byKey[key] >= s.perKey {
		return nil, fmt.Sprintf("this caller's limit of %d", s.perKey)
	}
	if ns != "" && s.perNS > 0 && s.byNS[ns] >= s.perNS {
		return nil, fmt.Sprintf("namespace %q's share of %d", ns, s.perNS)
	}
	s.n++
	s.byKey[key]++
	if ns != "" {
		s.byNS[ns]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.n--
			if s.byKey[key]--; s.byKey[key] <= 0 {
				delete(s.byKey, key)
			}
			if ns != "" {
				if s.byNS[ns]--; s.byNS[ns] <= 0 {
					delete(s.byNS, ns)
				}
			}
		})
	}, ""
}

// open returns the number of slots taken, in total and by key.
func (s *slots) open(key string) (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.byKey[key]
}

// refusals rate-limits refused bearer tokens by client address: each
// address may have a token refused rate times a second (burst at once);
// beyond that its requests with a token the authenticator does not already
// know get 429 without asking the authenticator (no TokenReview). It keeps
// the limiters of the most recent size addresses.
type refusals struct {
	rate  rate.Limit
	burst int
	now   func() time.Time
	cache *lru.Cache
}

func newRefusals(r float64, burst, size int, now func() time.Time) *refusals {
	return &refusals{rate: rate.Limit(r), burst: burst, now: now, cache: lru.New(size)}
}

// addrState is one address's limiter of refusals and its checks under
// way that may yet be refused (counted against what the limiter allows, so
// that concurrent requests cannot all pass a limiter with one token left).
type addrState struct {
	l        *rate.Limiter
	mu       sync.Mutex
	checking int
}

func (f *refusals) state(addr string) *addrState {
	if v, ok := f.cache.Get(addr); ok {
		return v.(*addrState)
	}
	st := &addrState{l: rate.NewLimiter(f.rate, f.burst)}
	f.cache.Add(addr, st)
	return st
}

func (f *refusals) limiter(addr string) *rate.Limiter { return f.state(addr).l }

// blocked reports whether addr has used its refusals up (those under way
// included), and when it may try again.
func (f *refusals) blocked(addr string) (time.Duration, bool) {
	if f == nil || f.rate <= 0 {
		return 0, false
	}
	st := f.state(addr)
	st.mu.Lock()
	defer st.mu.Unlock()
	return f.blockedLocked(st)
}

func (f *refusals) blockedLocked(st *addrState) (time.Duration, bool) {
	left := st.l.TokensAt(f.now()) - float64(st.checking)
	if left >= 1 {
		return 0, false
	}
	wait := time.Duration((1 - left) / float64(f.rate) * float64(time.Second))
	return max(wait, time.Second), true
}

// begin starts a check of a token from addr unless addr is blocked: end,
// called once the check is over (after refused, if it was refused), gives
// the place back.
func (f *refusals) begin(addr string) (end func(), wait time.Duration, blocked bool) {
	if f == nil || f.rate <= 0 {
		return func() {}, 0, false
	}
	st := f.state(addr)
	st.mu.Lock()
	defer st.mu.Unlock()
	if wait, blocked := f.blockedLocked(st); blocked {
		return nil, wait, true
	}
	st.checking++
	return func() {
		st.mu.Lock()
		st.checking--
		st.mu.Unlock()
	}, 0, false
}

// turn reserves addr's next check of a token while addr is blocked: the
// delay until it is due, or false (and nothing reserved) when that is
// further off than maxWait.
func (f *refusals) turn(addr string, maxWait time.Duration) (time.Duration, bool) {
	now := f.now()
	st := f.state(addr)
	st.mu.Lock()
	defer st.mu.Unlock()
	// Nothing is reserved for a refusal (a cancelled reservation may give
	// back more than it took while others are outstanding), and the
	// checks under way count as taken.
	left := st.l.TokensAt(now) - float64(st.checking)
	d := max(time.Duration((1-left)/float64(f.rate)*float64(time.Second)), 0)
	if d > maxWait {
		return d, false
	}
	r := st.l.ReserveN(now, 1)
	return max(r.DelayFrom(now), d), r.OK()
}

// refused counts one refusal of addr.
func (f *refusals) refused(addr string) {
	if f == nil || f.rate <= 0 {
		return
	}
	f.limiter(addr).AllowN(f.now(), 1)
}

// clientAddr is the address a request came from, without its port: the
// peer's, or, when the peer is one of trusted (a reverse proxy, an Ingress
// controller, a mesh sidecar), the address that proxy says it serves, the
// last of X-Forwarded-For that is not itself a trusted proxy. Without
// trusted proxies X-Forwarded-For is never read: anyone may send it.
func clientAddr(r *http.Request, trusted []netip.Prefix) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if len(trusted) == 0 || !isTrusted(host, trusted) {
		return host
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop := strings.TrimSpace(hops[i])
		if hop == "" {
			continue
		}
		if _, err := netip.ParseAddr(hop); err != nil {
			return host // not an address: the proxy's own
		}
		if !isTrusted(hop, trusted) {
			return hop
		}
	}
	return host
}

func isTrusted(addr string, trusted []netip.Prefix) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// retryAfter429 is the header of a 429: seconds, rounded up, at least 1.
func retryAfter429(d time.Duration) http.Header {
	s := int((d + time.Second - 1) / time.Second)
	return http.Header{"Retry-After": {strconv.Itoa(max(s, 1))}}
}
