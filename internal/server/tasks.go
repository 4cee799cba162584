package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/danielgtaylor/huma/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Inputs and outputs of the JSON endpoints. Query parameters are strings
// parsed by the handlers, so that every bad value is a 400 that names the
// parameter and says what it takes.

type taskOutput struct {
	Status   int
	Location string `header:"Location" doc:"The task's URL (submit and rerun)."`
	Cursor   string `header:"X-Kubetask-Cursor" doc:"Watch cursor taken before the task was read: watch from it to miss no later change."`
	Body     *api.Task
}

type idInput struct {
	ID string `path:"id" doc:"The task ID." example:"t01j9z3k4m5n6p7q8r9s0t1v2w3"`
}

type listInput struct {
	Namespace     string `query:"namespace" doc:"Only tasks in this namespace."`
	Phase         string `query:"phase" doc:"Only tasks in this phase: Pending, Running, Succeeded or Failed."`
	Reason        string `query:"reason" doc:"Only tasks with this reason (docs/states.md)." example:"Unschedulable"`
	NamePrefix    string `query:"namePrefix" doc:"Only tasks whose name starts with this."`
	Labels        string `query:"labels" doc:"Only tasks with these labels, key=value pairs separated by commas (equality only)." example:"team=data,env=prod"`
	CreatedAfter  string `query:"createdAfter" doc:"Only tasks created at or after this time (RFC 3339)." example:"2026-01-02T15:04:05Z"`
	CreatedBefore string `query:"createdBefore" doc:"Only tasks created before this time (RFC 3339)."`
	Terminal      string `query:"terminal" doc:"true: only finished tasks; false: only unfinished ones."`
	Cluster       string `query:"cluster" doc:"Only tasks placed on this cluster (a service with several clusters)." example:"east"`
	Limit         string `query:"limit" doc:"Page size, 1 to 1000 (default 100)." example:"100"`
	Continue      string `query:"continue" doc:"The continue token of the previous page; give the same filters."`
}

var listParams = []string{"namespace", "phase", "reason", "namePrefix", "labels", "createdAfter", "createdBefore", "terminal", "cluster", "limit", "continue"}

type listOutput struct {
	Body *api.TaskList
}

func (s *Server) register() {
	tags := []string{"tasks"}
	huma.Register(s.api, huma.Operation{
		OperationID: "submitTask", Method: http.MethodPost, Path: api.Prefix + "/namespaces/{ns}/tasks", Tags: tags,
		Summary: "Submit a task",
		Description: "Submits a task (kind Task, apiVersion kubetask.dev/v1alpha1) or a plain Pod (kind Pod, apiVersion v1), " +
			"as JSON or YAML, to run in the namespace. Idempotent by task ID: the same ID with the same document (compared after " +
			"defaults) returns the existing task (200), with another document 409. Without an ID the server makes one that sorts by " +
			"creation time. A new task is 201.",
		DefaultStatus: http.StatusCreated,
		MaxBodyBytes:  s.cfg.MaxBodyBytes + 1, // limitBody answers 413 first
		// decodeSubmit decodes and validates the body (JSON or YAML).
		SkipValidateBody: true,
		Errors:           []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity},
	}, s.submit)
	s.describeSubmit()
	huma.Register(s.api, huma.Operation{
		OperationID: "getTask", Method: http.MethodGet, Path: api.Prefix + "/tasks/{id}", Tags: tags,
		Summary:     "Get a task",
		Description: "The task's state, result, every attempt and, while it is Pending, its pod's recent Kubernetes events.",
		Errors:      []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusNotFound},
	}, s.get)
	huma.Register(s.api, huma.Operation{
		OperationID: "listTasks", Method: http.MethodGet, Path: api.Prefix + "/tasks", Tags: tags,
		Summary: "List tasks",
		Description: "A page of tasks, newest first, with filters. Follow continue (with the same filters) for the next page; " +
			"pages are keyset-based, so tasks created meanwhile never shift them. A page may hold fewer tasks than the limit.",
		Errors: []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden},
	}, s.list)
	huma.Register(s.api, huma.Operation{
		OperationID: "cancelTask", Method: http.MethodPost, Path: api.Prefix + "/tasks/{id}/cancel", Tags: tags,
		Summary: "Cancel a task",
		Description: "Asks the task to stop: it ends Failed/Cancelled unless its main container already finished. " +
			"Idempotent; cancelling a finished task changes nothing. Returns the task.",
		Errors: []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound},
	}, s.cancel)
	huma.Register(s.api, huma.Operation{
		OperationID: "rerunTask", Method: http.MethodPost, Path: api.Prefix + "/tasks/{id}/rerun", Tags: tags,
		Summary: "Rerun a finished task",
		Description: "Submits the finished task's document again as a new task (a new ID, or the Idempotency-Key) " +
			"whose origin is the task. 409 while the task is not finished.",
		DefaultStatus: http.StatusCreated,
		Errors:        []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusConflict, http.StatusUnprocessableEntity},
	}, s.rerun)
	s.registerStreams()
	s.registerClusters()
	s.tidyOpenAPI()
}

// tidyOpenAPI documents what huma cannot infer: the 200 of an idempotent
// submission or rerun, no 422 where the handlers answer 400 for every bad
// parameter (422 is for invalid tasks only), and the 503 with Retry-After of
// every operation that needs the store.
func (s *Server) tidyOpenAPI() {
	for _, item := range s.api.OpenAPI().Paths {
		for _, op := range []*huma.Operation{item.Get, item.Post} {
			if op == nil {
				continue
			}
			if p, ok := op.Responses["400"]; ok {
				unavailable := *p
				unavailable.Description = "The task store (or the authorizer) cannot be reached now: try again after Retry-After."
				unavailable.Headers = map[string]*huma.Param{"Retry-After": {
					Description: "Seconds to wait before trying again.",
					Schema:      &huma.Schema{Type: "integer"},
				}}
				op.Responses["503"] = &unavailable
			}
			if op.OperationID != "submitTask" && op.OperationID != "rerunTask" {
				delete(op.Responses, "422") // huma adds it to every operation with parameters
			}
			if created, ok := op.Responses["201"]; ok {
				existing := *created
				existing.Description = "The task exists already with the same document (an idempotent retry)."
				op.Responses["200"] = &existing
				created.Description = "The task was created."
			}
		}
	}
}

// --- get, list, cancel ---

func (s *Server) get(ctx context.Context, in *idInput) (*taskOutput, error) {
	if err := noQuery(ctx); err != nil {
		return nil, err
	}
	cursor := s.ring.headCursor()
	rec, err := s.record(ctx, in.ID, ActionGet)
	if err != nil {
		return nil, err
	}
	t := s.toAPI(rec, true)
	if rec.Phase == "Pending" && !rec.Terminal && rec.PodCreated {
		if client := s.clusterClient(rec.Cluster); client != nil {
			t.Events = s.podEvents(ctx, client, rec.Cluster, rec.Namespace, podName(rec, rec.Attempt))
		}
	}
	return &taskOutput{Status: http.StatusOK, Cursor: cursor, Body: &t}, nil
}

func (s *Server) list(ctx context.Context, in *listInput) (*listOutput, error) {
	if err := knownQuery(ctx, listParams...); err != nil {
		return nil, err
	}
	opts, err := in.pageOptions()
	if err != nil {
		return nil, err
	}
	sc, err := s.scope(ctx, ActionList, opts.Namespace)
	if err != nil {
		return nil, err
	}
	// The store reads the caller's namespaces only: a page, and the
	// continue token that carries its last task, holds nothing of the others.
	opts.Namespace, opts.Namespaces = sc.namespace, sc.only
	cursor := s.ring.headCursor()
	page, err := s.cfg.Pager.Page(ctx, opts)
	if errors.Is(err, store.ErrBadContinue) {
		return nil, huma.Error400BadRequest("bad continue token: use the continue token of the previous page with the same filters, or start again without one",
			&huma.ErrorDetail{Location: "query.continue", Value: opts.Continue, Message: err.Error()})
	}
	if err != nil {
		return nil, s.internal("listing tasks", err)
	}
	out := &api.TaskList{Items: []api.Task{}, Continue: page.Continue, Cursor: cursor}
	for _, rec := range page.Records {
		if !sc.allows(rec.Namespace) || (sc.namespace != "" && rec.Namespace != sc.namespace) {
			// A Pager that ignored the scope: answer nothing rather than
			// a page or token of another namespace.
			s.log.Error("the store's page holds a task outside the caller's namespaces", "task", rec.ID, "namespace", rec.Namespace)
			return nil, s.internal("listing tasks", errors.New("page outside the requested namespaces"))
		}
		if s.cfg.Clusters != nil {
			rec = s.cfg.Clusters.Shown(rec)
		}
		out.Items = append(out.Items, s.toAPI(rec, false))
	}
	return &listOutput{Body: out}, nil
}

func (s *Server) cancel(ctx context.Context, in *idInput) (*taskOutput, error) {
	if err := noQuery(ctx); err != nil {
		return nil, err
	}
	noteAudit(ctx, ActionCancel, "", in.ID)
	rec, err := s.record(ctx, in.ID, ActionCancel)
	if err != nil {
		return nil, err
	}
	noteAudit(ctx, ActionCancel, rec.Namespace, "")
	if err := s.cfg.Executor.Cancel(ctx, in.ID, executor.CancelledBy(actorOf(CallerFrom(ctx)))); err != nil {
		return nil, s.internal("cancelling task "+in.ID, err)
	}
	cursor := s.ring.headCursor()
	rec, err = s.cfg.Executor.Get(ctx, in.ID)
	if err != nil {
		return nil, s.internal("reading task "+in.ID, err)
	}
	t := s.toAPI(rec, false)
	return &taskOutput{Status: http.StatusOK, Cursor: cursor, Body: &t}, nil
}

// record reads task id for an action of the caller: 404 for an unknown task
// and for one the caller may not even read (task IDs in namespaces the caller
// cannot see stay invisible), 403 for one it may read but not act on.
func (s *Server) record(ctx context.Context, id string, action Action) (store.Record, error) {
	rec, err := s.cfg.Executor.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Record{}, notFound(id)
	}
	if err != nil {
		return store.Record{}, s.internal("reading task "+id, err)
	}
	c := CallerFrom(ctx)
	ok, err := s.allowed(ctx, c, action, rec.Namespace)
	if err != nil || ok {
		return rec, err
	}
	if action != ActionGet {
		if sees, err := s.allowed(ctx, c, ActionGet, rec.Namespace); err != nil {
			return store.Record{}, err
		} else if sees {
			return store.Record{}, forbidden(c, action, rec.Namespace)
		}
	}
	return store.Record{}, notFound(id)
}

func (s *Server) allowed(ctx context.Context, c Caller, action Action, ns string) (bool, error) {
	ok, err := c.Allowed(ctx, action, ns)
	if err != nil {
		s.log.Error("cannot authorize", "subject", c.Subject(), "action", action, "namespace", ns, "err", err)
		return false, unavailable("cannot check permissions now; try again")
	}
	return ok, nil
}

// scope is the namespaces a list or watch covers: one (namespace), all, or
// those of a caller that lists its namespaces (then allows filters).
type scope struct {
	namespace string
	only      []string // when set, only these namespaces
}

func (sc scope) allows(ns string) bool { return sc.only == nil || slices.Contains(sc.only, ns) }

// scope decides what a list or watch by the caller covers. A namespace
// filter must be allowed (403 otherwise). Without one: every namespace when
// the caller is allowed all of them; else the caller's own namespaces when it
// lists them (token mode); else 403: name a namespace.
func (s *Server) scope(ctx context.Context, action Action, ns string) (scope, error) {
	c := CallerFrom(ctx)
	if ns != "" {
		ok, err := s.allowed(ctx, c, action, ns)
		if err != nil {
			return scope{}, err
		}
		if !ok {
			return scope{}, forbidden(c, action, ns)
		}
		return scope{namespace: ns}, nil
	}
	ok, err := s.allowed(ctx, c, action, AllNamespaces)
	if err != nil {
		return scope{}, err
	}
	if ok {
		return scope{}, nil
	}
	if nl, isLister := c.(NamespaceLister); isLister {
		switch nss := nl.Namespaces(); len(nss) {
		case 0:
		case 1:
			return scope{namespace: nss[0]}, nil
		default:
			return scope{only: nss}, nil
		}
	}
	return scope{}, huma.NewError(http.StatusForbidden, fmt.Sprintf(
		"%s may not %s in all namespaces: give the namespace parameter", c.Subject(), action.phrase()),
		&huma.ErrorDetail{Location: "query.namespace", Message: "required for this caller: name a namespace it may " + string(action) + " in"})
}

func (in *listInput) pageOptions() (store.PageOptions, error) {
	var details []error
	bad := func(param, value, msg string) {
		details = append(details, &huma.ErrorDetail{Location: "query." + param, Value: value, Message: msg})
	}
	f := filterFields{Namespace: in.Namespace, Phase: in.Phase, Reason: in.Reason, NamePrefix: in.NamePrefix, Labels: in.Labels}
	opts := store.PageOptions{Continue: in.Continue}
	f.parse(&opts, bad)
	if in.Cluster != "" {
		if err := store.ValidateClusterName(in.Cluster); err != nil {
			bad("cluster", in.Cluster, "must be a cluster name: 1 to 40 characters of a-z, 0-9 and '-', starting and ending with a letter or digit")
		}
		opts.Cluster = in.Cluster
	}
	for _, tp := range []struct {
		param, v string
		into     *time.Time
	}{{"createdAfter", in.CreatedAfter, &opts.CreatedAfter}, {"createdBefore", in.CreatedBefore, &opts.CreatedBefore}} {
		if tp.v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, tp.v)
		if err != nil {
			bad(tp.param, tp.v, "must be an RFC 3339 time such as 2026-01-02T15:04:05Z")
			continue
		}
		*tp.into = t
	}
	switch in.Terminal {
	case "":
	case "true":
		opts.Terminal = new(true)
	case "false":
		opts.Terminal = new(false)
	default:
		bad("terminal", in.Terminal, "must be true or false")
	}
	if in.Limit != "" {
		n, ok := parseInt(in.Limit)
		if !ok || n < 1 || n > store.MaxPageSize {
			bad("limit", in.Limit, fmt.Sprintf("must be a whole number from 1 to %d", store.MaxPageSize))
		} else {
			opts.Limit = int(n)
		}
	}
	if len(details) > 0 {
		return opts, badRequest(details)
	}
	return opts, nil
}

// --- conversions ---

func podName(rec store.Record, attempt int) string {
	return task.PodName(task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Executor: rec.Executor, Nonce: rec.Nonce}, attempt)
}

// toAPI is the API's view of a record; full adds the document (get).
func (s *Server) toAPI(rec store.Record, full bool) api.Task {
	t := api.Task{
		ID: rec.ID, Namespace: rec.Namespace, Name: rec.Name, Labels: rec.Labels, Origin: rec.Origin,
		Phase: rec.Phase, Reason: rec.Reason, Message: rec.Message, ExitCode: rec.ExitCode, Terminal: rec.Terminal,
		Attempt: rec.Attempt, Cluster: rec.Cluster, CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt,
	}
	if rec.Result != nil {
		if utf8.Valid(rec.Result) {
			t.Result = string(rec.Result)
		} else {
			t.ResultBase64 = rec.Result
		}
	}
	if !rec.CancelledAt.IsZero() {
		t.CancelledAt = new(rec.CancelledAt)
	}
	t.SubmittedBy, t.CancelledBy = apiActor(rec.SubmittedBy), apiActor(rec.CancelledBy)
	current := false
	for _, a := range rec.Attempts {
		current = current || a.Attempt == rec.Attempt
		t.Attempts = append(t.Attempts, api.Attempt{
			Attempt: a.Attempt, Pod: a.Pod, Cluster: a.Cluster, Phase: a.Phase, Reason: a.Reason, Message: a.Message, ExitCode: a.ExitCode,
			Retryable: a.Retryable, FinishedAt: timePtr(a.FinishedAt), ObservedAt: timePtr(a.ObservedAt),
		})
	}
	if !current && !rec.Terminal {
		a := api.Attempt{Attempt: rec.Attempt, Cluster: rec.Cluster, Phase: rec.Phase, Reason: rec.Reason, Message: rec.Message, ExitCode: rec.ExitCode}
		if rec.PodCreated {
			a.Pod = podName(rec, rec.Attempt)
		}
		t.Attempts = append(t.Attempts, a)
	}
	if full {
		t.Document = json.RawMessage(rec.Task)
	}
	return t
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// podEvents lists the recent Kubernetes events of a pod, oldest first. A
// failure costs only the events: the task is reported without them. A
// pod's list is kept for PodEventsTTL, so that callers polling a Pending
// task cost the API server one events LIST per pod per TTL, not one per
// GET, on the client the service shares with its other calls.
func (s *Server) podEvents(ctx context.Context, client kubernetes.Interface, cluster, ns, pod string) []api.PodEvent {
	key := cluster + "/" + ns + "/" + pod
	if v, ok := s.podEventsCache.get(key); ok {
		return v.([]api.PodEvent)
	}
	evs, ok := s.listPodEvents(ctx, client, ns, pod)
	if ok {
		s.podEventsCache.put(key, evs)
	}
	return evs
}

// clusterClient is the client of the cluster a task is placed on (""
// and a service on one cluster: Config.Client), nil when the service has
// none for it (a cluster no longer configured).
func (s *Server) clusterClient(cluster string) kubernetes.Interface {
	if s.cfg.Clusters == nil || cluster == "" {
		if s.cfg.Client == nil {
			return nil // a nil *Clientset is not a nil interface
		}
		return s.cfg.Client
	}
	return s.cfg.Clusters.Client(cluster)
}

// listPodEvents is podEvents without the cache; false when the list failed.
func (s *Server) listPodEvents(ctx context.Context, client kubernetes.Interface, ns, pod string) ([]api.PodEvent, bool) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	list, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", pod).String(),
	})
	if err != nil {
		s.log.Warn("cannot list the events of a pending task's pod", "pod", ns+"/"+pod, "err", err)
		return nil, false
	}
	var evs []api.PodEvent
	for i := range list.Items {
		e := &list.Items[i]
		if e.InvolvedObject.Name != pod || (e.InvolvedObject.Kind != "" && e.InvolvedObject.Kind != "Pod") {
			continue
		}
		count := e.Count
		if e.Series != nil {
			count = e.Series.Count
		}
		evs = append(evs, api.PodEvent{Type: e.Type, Reason: e.Reason, Message: e.Message, Count: count, LastSeen: lastSeen(e)})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].LastSeen.Before(evs[j].LastSeen) })
	if n := s.cfg.PendingEvents; len(evs) > n {
		evs = evs[len(evs)-n:]
	}
	return evs, true
}

func lastSeen(e *corev1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.UTC()
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.UTC()
	case !e.EventTime.IsZero():
		return e.EventTime.UTC()
	case !e.FirstTimestamp.IsZero():
		return e.FirstTimestamp.UTC()
	}
	return e.CreationTimestamp.UTC()
}

// --- errors ---

func notFound(id string) error {
	return huma.Error404NotFound(fmt.Sprintf("no task %q: check the ID (GET %s/tasks lists the tasks you may see)", id, api.Prefix))
}

func forbidden(c Caller, action Action, ns string) error {
	return huma.Error403Forbidden(fmt.Sprintf("%s may not %s in namespace %q: ask for access (token mode: the token's namespaces; kubernetes mode: RBAC on pods, see docs/api.md)", c.Subject(), action.phrase(), ns))
}

func badRequest(details []error) error {
	if len(details) == 1 {
		d := details[0].(*huma.ErrorDetail) //nolint:errorlint // built by this package, never wrapped
		return huma.Error400BadRequest(fmt.Sprintf("%s: %s", d.Location, d.Message), details...)
	}
	return huma.Error400BadRequest(fmt.Sprintf("%d bad request parameters: see errors", len(details)), details...)
}

// internal logs an unexpected failure and answers 500 without its details,
// or 503 with Retry-After when the store could not be reached.
func (s *Server) internal(what string, err error) error {
	if errors.Is(err, context.Canceled) {
		return huma.NewError(499, what+": request cancelled")
	}
	if errors.Is(err, store.ErrUnavailable) {
		s.log.Warn("store unavailable", "what", what, "err", err)
		return unavailable(what + " failed: the task store cannot be reached now; try again")
	}
	if errors.Is(err, ErrUnavailable) {
		s.log.Warn("unavailable", "what", what, "err", err)
		return unavailable(what + " failed: " + err.Error())
	}
	s.log.Error("request failed", "what", what, "err", err)
	return huma.Error500InternalServerError(what + " failed; the server logged why")
}

// retryAfter is the Retry-After of every 503 the server answers: how long a
// client waits before it tries again.
const retryAfter = 2 * time.Second

// unavailable is a 503 with Retry-After: the request may succeed later.
func unavailable(detail string) error {
	return huma.ErrorWithHeaders(huma.Error503ServiceUnavailable(detail), retryAfterHeader())
}

func retryAfterHeader() http.Header {
	return http.Header{"Retry-After": {strconv.Itoa(int(retryAfter / time.Second))}}
}

// noQuery and knownQuery refuse query parameters an endpoint does not take
// (a misspelled filter would otherwise silently match everything).
func noQuery(ctx context.Context) error { return knownQuery(ctx) }

func knownQuery(ctx context.Context, known ...string) error {
	r := requestFrom(ctx).req
	if r == nil {
		return nil
	}
	var details []error
	for k, v := range r.URL.Query() {
		if !slices.Contains(known, k) {
			msg := "unknown query parameter"
			if len(known) > 0 {
				msg += ": this endpoint takes " + strings.Join(known, ", ")
			} else {
				msg += ": this endpoint takes none"
			}
			details = append(details, &huma.ErrorDetail{Location: "query." + k, Value: strings.Join(v, ","), Message: msg})
		}
	}
	if len(details) == 0 {
		return nil
	}
	sort.Slice(details, func(i, j int) bool {
		return details[i].(*huma.ErrorDetail).Location < details[j].(*huma.ErrorDetail).Location //nolint:errorlint // built by this package, never wrapped
	})
	return badRequest(details)
}

func parseInt(s string) (int64, bool) {
	var n int64
	if s == "" || len(s) > 18 {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}
