package costs

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kubetask/kubetask/pkg/store"
)

// call is one kind of API request: a verb as Kubernetes names it (get,
// list, watch, create, update, patch, delete, deletecollection), a resource
// and a subresource ("" for none); for a patch, what it does (patchKind);
// and whether its answer was not a success (failed: an error or a status
// other than 2xx).
type call struct {
	verb, resource, sub, what string
	failed                    bool
}

func (c call) String() string {
	s := c.verb + " " + c.resource
	if c.sub != "" {
		s += "/" + c.sub
	}
	if c.what != "" {
		s += " (" + c.what + ")"
	}
	if c.failed {
		s += " FAILED"
	}
	return s
}

// patchKind names what a pod patch of the executor does, from its body:
// the fence's ungate, the finalizer's release, a stop (activeDeadlineSeconds)
// or an adoption's relabel.
func patchKind(body []byte) string {
	switch b := string(body); {
	case strings.Contains(b, "/spec/schedulingGates"):
		return "ungate"
	case strings.Contains(b, "/metadata/finalizers"), strings.Contains(b, `"finalizers"`):
		return "release"
	case strings.Contains(b, "activeDeadlineSeconds"):
		return "stop"
	case strings.Contains(b, "kubetask.dev/executor"):
		return "relabel"
	}
	return "other"
}

// apiCounts counts every request that leaves a client, by call, and the
// answers that were not 2xx, by call and status code.
type apiCounts struct {
	mu     sync.Mutex
	calls  map[call]int
	failed map[string]int
	by     map[string]int // pod requests by the executor's function that made them
	// inFlight holds the writes to one pod (by namespace/name) on their
	// way: sent, not answered yet. overlaps counts the writes sent while
	// another write to the same pod was (by both calls): the client racing
	// itself inside the API server.
	inFlight map[string][]call
	overlaps map[string]int
}

var debug = os.Getenv("KUBETASK_COSTS_DEBUG") != ""

func newAPICounts() *apiCounts {
	return &apiCounts{calls: map[call]int{}, failed: map[string]int{}, by: map[string]int{}, inFlight: map[string][]call{}, overlaps: map[string]int{}}
}

// config returns a copy of rc whose requests count into a. The executor
// wraps its transport further (its own metric, the fence's check before a
// creation leaves the client): a wrapper added later runs first, so a
// request the executor's check refuses is not counted here; every request
// counted reached the API server.
func (a *apiCounts) config(rc *rest.Config) *rest.Config {
	rc = rest.CopyConfig(rc)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			c := classify(r)
			var body []byte
			if (c.verb == "patch" || debug) && r.GetBody != nil {
				if b, err := r.GetBody(); err == nil {
					body, _ = io.ReadAll(b)
				}
			}
			if c.verb == "patch" && c.resource == "pods" {
				c.what = patchKind(body)
			}
			pod := podWritten(r, c)
			if pod != "" {
				a.mu.Lock()
				for _, other := range a.inFlight[pod] {
					a.overlaps[c.String()+" sent while "+other.String()+" was on its way"]++
				}
				a.inFlight[pod] = append(a.inFlight[pod], c)
				a.mu.Unlock()
				defer func() {
					a.mu.Lock()
					defer a.mu.Unlock()
					w := a.inFlight[pod]
					for i := range w {
						if w[i] == c {
							w = append(w[:i], w[i+1:]...)
							break
						}
					}
					if len(w) == 0 {
						delete(a.inFlight, pod)
					} else {
						a.inFlight[pod] = w
					}
				}()
			}
			resp, err := rt.RoundTrip(r)
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			if debug { // KUBETASK_COSTS_DEBUG=1: every request on stderr
				fmt.Fprintf(os.Stderr, "costs: %s %s %s?%s %d %s\n", time.Now().Format("15:04:05.000"), r.Method, r.URL.Path, r.URL.RawQuery, code, body)
			}
			c.failed = err != nil || code >= 300
			var caller string
			if c.resource == "pods" && c.verb != "list" && c.verb != "watch" {
				caller = executorCaller()
			}
			a.mu.Lock()
			a.calls[c]++
			if caller != "" {
				a.by[c.String()+" from "+caller]++
			}
			switch {
			case err != nil:
				a.failed[c.String()+" error"]++
			case code >= 300:
				a.failed[fmt.Sprintf("%s %d", c, code)]++
			}
			a.mu.Unlock()
			return resp, err
		})
	})
	return rc
}

// podWritten returns the namespace/name of the pod r writes (a PATCH, PUT or
// DELETE of one pod or its subresource), "" for any other request.
func podWritten(r *http.Request, c call) string {
	if c.resource != "pods" || (c.verb != "patch" && c.verb != "update" && c.verb != "delete") {
		return ""
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	for i := 0; i+3 < len(parts); i++ {
		if parts[i] == "namespaces" && parts[i+2] == "pods" {
			return parts[i+1] + "/" + parts[i+3]
		}
	}
	return ""
}

// overlapping returns the writes sent while another write of the same pod
// was on its way, so far.
func (a *apiCounts) overlapping() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.overlaps)
}

// snapshot returns the counts so far.
func (a *apiCounts) snapshot() (map[call]int, map[string]int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.calls), maps.Clone(a.failed)
}

// callers returns the pod requests so far by the executor's function that
// made them (for the logs).
func (a *apiCounts) callers() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.by)
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// classify names r's call from its method and path:
// /api/v1[/namespaces/NS]/RESOURCE[/NAME[/SUB]] or the same under
// /apis/GROUP/VERSION.
func classify(r *http.Request) call {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return call{verb: strings.ToLower(r.Method), resource: r.URL.Path}
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	var c call
	if len(parts) > 0 {
		c.resource = parts[0]
	}
	if len(parts) > 2 {
		c.sub = parts[2]
	}
	named := len(parts) > 1
	switch r.Method {
	case http.MethodGet:
		switch {
		case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
			c.verb = "watch"
		case named:
			c.verb = "get"
		default:
			c.verb = "list"
		}
	case http.MethodPost:
		c.verb = "create"
	case http.MethodPut:
		c.verb = "update"
	case http.MethodPatch:
		c.verb = "patch"
	case http.MethodDelete:
		c.verb = "delete"
		if !named {
			c.verb = "deletecollection"
		}
	default:
		c.verb = strings.ToLower(r.Method)
	}
	return c
}

// countingStore counts the calls of a store.Store by method; an Update that
// failed also counts as "Update error". For the logs it also counts each
// call by the executor's function that made it (by), and each Update by
// the phase and reason it writes.
type countingStore struct {
	store.Store
	mu sync.Mutex
	n  map[string]int
	by map[string]int
}

var _ store.Store = (*countingStore)(nil)

func newCountingStore(s store.Store) *countingStore {
	return &countingStore{Store: s, n: map[string]int{}, by: map[string]int{}}
}

func (s *countingStore) note(method string, err error) {
	caller := executorCaller()
	s.mu.Lock()
	s.n[method]++
	if err != nil {
		s.n[method+" error"]++
	}
	s.by[method+" from "+caller]++
	s.mu.Unlock()
}

// executorCaller names the innermost function of pkg/executor on the
// stack (the caller of a store method, or of a request), or "other".
func executorCaller() string {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		// The executor's own transport wrapper (client.go) is not a caller.
		if name, ok := strings.CutPrefix(f.Function, "github.com/kubetask/kubetask/pkg/executor."); ok &&
			!strings.HasPrefix(name, "countingConfig") && !strings.HasPrefix(name, "roundTripperFunc") {
			return name
		}
		if !more {
			return "other"
		}
	}
}

func (s *countingStore) Create(ctx context.Context, rec store.Record) (store.Record, bool, error) {
	r, created, err := s.Store.Create(ctx, rec)
	s.note("Create", err)
	return r, created, err
}

func (s *countingStore) Get(ctx context.Context, id string) (store.Record, error) {
	r, err := s.Store.Get(ctx, id)
	s.note("Get", nil) // ErrNotFound is an answer, not a failure
	return r, err
}

func (s *countingStore) Update(ctx context.Context, rec store.Record) (store.Record, error) {
	r, err := s.Store.Update(ctx, rec)
	s.note("Update", err)
	s.mu.Lock()
	s.by["Update writing "+rec.Phase+"/"+rec.Reason]++
	s.mu.Unlock()
	return r, err
}

func (s *countingStore) BeginTerm(ctx context.Context, instance string) (int64, error) {
	e, err := s.Store.BeginTerm(ctx, instance)
	s.note("BeginTerm", err)
	return e, err
}

func (s *countingStore) Epoch(ctx context.Context, instance string) (int64, error) {
	e, err := s.Store.Epoch(ctx, instance)
	s.note("Epoch", err)
	return e, err
}

func (s *countingStore) List(ctx context.Context, opts store.ListOptions) ([]store.Record, error) {
	r, err := s.Store.List(ctx, opts)
	s.note("List", err)
	return r, err
}

func (s *countingStore) snapshot() (map[string]int, map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.n), maps.Clone(s.by)
}

// format lists m sorted by key, "key=value" each.
func format[K comparable](m map[K]int) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b K) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%v=%d", k, m[k])
	}
	return b.String()
}
