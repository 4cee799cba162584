package client

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubetask/kubetask/pkg/api"
)

// SubmitOptions are the options of Submit.
type SubmitOptions struct {
	// ID is the task ID (the id query parameter): a submission with the ID
	// of an existing task and the same document returns that task instead of
	// creating another. Default: one the server makes.
	ID string
	// IdempotencyKey is the task ID as the Idempotency-Key header (give ID
	// or IdempotencyKey, or both equal).
	IdempotencyKey string
	// ContentType of doc: application/json, application/yaml or text/yaml.
	// Default: application/json when doc is valid JSON, else
	// application/yaml.
	ContentType string
}

// Submit submits doc, a task (kind Task) or a plain pod (kind Pod) as JSON or
// YAML, to run in namespace. created is true when the task is new (201) and
// false when a task with the same ID and the same document existed already
// (200): a retried submission with an ID never runs the task twice. Another
// document under a taken ID is an *Error with IsConflict; an invalid task one
// with IsInvalid, each problem in its Problem's Errors.
func (c *Client) Submit(ctx context.Context, namespace string, doc []byte, opts SubmitOptions) (*api.Task, bool, error) {
	ct := opts.ContentType
	if ct == "" {
		ct = "application/yaml"
		if json.Valid(doc) {
			ct = "application/json"
		}
	}
	r := request{method: http.MethodPost, path: pathOf("namespaces", namespace, "tasks"), body: doc, header: http.Header{"Content-Type": {ct}},
		repeatable: opts.ID != "" || opts.IdempotencyKey != ""}
	if opts.ID != "" {
		r.query = url.Values{"id": {opts.ID}}
	}
	if opts.IdempotencyKey != "" {
		r.header.Set(api.HeaderIdempotencyKey, opts.IdempotencyKey)
	}
	var t api.Task
	a, err := c.call(ctx, r, &t)
	if err != nil {
		return nil, false, fmt.Errorf("submitting a task to namespace %s: %w", namespace, err)
	}
	return &t, a.status == http.StatusCreated, nil
}

// Get returns task id with its attempts, its document and, while it is
// Pending, its pod's recent events. An unknown ID (or one the caller may not
// see) is an *Error with IsNotFound.
func (c *Client) Get(ctx context.Context, id string) (*api.Task, error) {
	t, _, err := c.GetWithCursor(ctx, id)
	return t, err
}

// GetWithCursor is Get that also returns the watch cursor taken before the
// task was read: a Watch from it misses no change made after the read.
func (c *Client) GetWithCursor(ctx context.Context, id string) (*api.Task, string, error) {
	var t api.Task
	a, err := c.call(ctx, request{method: http.MethodGet, path: pathOf("tasks", id)}, &t)
	if err != nil {
		return nil, "", fmt.Errorf("getting task %s: %w", id, err)
	}
	return &t, a.header.Get(api.HeaderCursor), nil
}

// ListOptions are the filters and the page of List. Filters combine: a task
// is listed when it passes all of them.
type ListOptions struct {
	// Namespace lists the tasks of one namespace. Default: every namespace
	// the caller may list.
	Namespace string
	// Phase is Pending, Running, Succeeded or Failed.
	Phase string
	// Reason is a reason such as Unschedulable or ExitCode (docs/states.md).
	Reason string
	// NamePrefix lists the tasks whose name starts with it.
	NamePrefix string
	// Labels and LabelSelector (key=value pairs separated by commas) list
	// the tasks that have all these labels; both may be given. Labels match
	// by equality only.
	Labels        map[string]string
	LabelSelector string
	// CreatedAfter (inclusive) and CreatedBefore (exclusive) bound the
	// creation time when set.
	CreatedAfter, CreatedBefore time.Time
	// Terminal, when set, lists only finished (true) or unfinished (false)
	// tasks.
	Terminal *bool
	// Cluster lists the tasks placed on one cluster (a service with
	// several clusters).
	Cluster string
	// Limit is the page size, 1 to 1000. Default 100 (the server's).
	Limit int
	// Continue is the Continue token of the previous page (with the same
	// filters).
	Continue string
}

// selector joins a label map and a selector into the labels parameter.
func selector(labels map[string]string, sel string) string {
	var terms []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		terms = append(terms, k+"="+labels[k])
	}
	if s := strings.TrimSpace(sel); s != "" {
		terms = append(terms, s)
	}
	return strings.Join(terms, ",")
}

// filters adds the filters that lists and watches share to q.
func filters(q url.Values, namespace, phase, reason, namePrefix, labels string) {
	for k, v := range map[string]string{"namespace": namespace, "phase": phase, "reason": reason, "namePrefix": namePrefix, "labels": labels} {
		if v != "" {
			q.Set(k, v)
		}
	}
}

func (o *ListOptions) query() url.Values {
	q := url.Values{}
	filters(q, o.Namespace, o.Phase, o.Reason, o.NamePrefix, selector(o.Labels, o.LabelSelector))
	if !o.CreatedAfter.IsZero() {
		q.Set("createdAfter", o.CreatedAfter.Format(time.RFC3339Nano))
	}
	if !o.CreatedBefore.IsZero() {
		q.Set("createdBefore", o.CreatedBefore.Format(time.RFC3339Nano))
	}
	if o.Terminal != nil {
		q.Set("terminal", strconv.FormatBool(*o.Terminal))
	}
	if o.Cluster != "" {
		q.Set("cluster", o.Cluster)
	}
	if o.Limit != 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Continue != "" {
		q.Set("continue", o.Continue)
	}
	return q
}

// List returns one page of tasks, newest first. Its Continue, when not
// empty, fetches the next page (give it in opts.Continue with the same
// filters); a page may hold fewer tasks than the limit, even none, and still
// have a next one. Its Cursor starts a Watch that misses no change made after
// the page was read.
func (c *Client) List(ctx context.Context, opts ListOptions) (*api.TaskList, error) {
	var l api.TaskList
	if _, err := c.call(ctx, request{method: http.MethodGet, path: "/tasks", query: opts.query()}, &l); err != nil {
		return nil, fmt.Errorf("listing tasks: %w", err)
	}
	return &l, nil
}

// ListAll yields every task that passes the filters of opts, page after page
// (of opts.Limit tasks) from opts.Continue to the last page, newest first.
// It stops at the first error, which it yields.
func (c *Client) ListAll(ctx context.Context, opts ListOptions) iter.Seq2[api.Task, error] {
	return func(yield func(api.Task, error) bool) {
		for {
			page, err := c.List(ctx, opts)
			if err != nil {
				yield(api.Task{}, err)
				return
			}
			for _, t := range page.Items {
				if !yield(t, nil) {
					return
				}
			}
			if page.Continue == "" {
				return
			}
			opts.Continue = page.Continue
		}
	}
}

// Cancel asks task id to stop and returns it: it ends Failed/Cancelled unless
// its main container finished already. Cancelling a finished task, or one
// cancelled already, changes nothing.
func (c *Client) Cancel(ctx context.Context, id string) (*api.Task, error) {
	var t api.Task
	if _, err := c.call(ctx, request{method: http.MethodPost, path: pathOf("tasks", id, "cancel"), repeatable: true}, &t); err != nil {
		return nil, fmt.Errorf("cancelling task %s: %w", id, err)
	}
	return &t, nil
}

// RerunOptions are the options of Rerun.
type RerunOptions struct {
	// ID is the new task's ID: a retried rerun with the same ID returns
	// the task it created. Default: one the server makes.
	ID string
	// IdempotencyKey is the new task's ID as the Idempotency-Key header.
	IdempotencyKey string
}

// Rerun submits the document of finished task id again as a new task whose
// Origin is id, and returns the new task; created is false when a rerun with
// the same new ID existed already. A task that is not finished is an *Error
// with IsConflict.
func (c *Client) Rerun(ctx context.Context, id string, opts RerunOptions) (*api.Task, bool, error) {
	r := request{method: http.MethodPost, path: pathOf("tasks", id, "rerun"), header: http.Header{}, repeatable: opts.ID != "" || opts.IdempotencyKey != ""}
	if opts.ID != "" {
		r.query = url.Values{"id": {opts.ID}}
	}
	if opts.IdempotencyKey != "" {
		r.header.Set(api.HeaderIdempotencyKey, opts.IdempotencyKey)
	}
	var t api.Task
	a, err := c.call(ctx, r, &t)
	if err != nil {
		return nil, false, fmt.Errorf("rerunning task %s: %w", id, err)
	}
	return &t, a.status == http.StatusCreated, nil
}

// Version returns the server's version (GET /api/v1/version, which needs no
// token).
func (c *Client) Version(ctx context.Context) (*api.Version, error) {
	var v api.Version
	if _, err := c.call(ctx, request{method: http.MethodGet, path: "/version", repeatable: true}, &v); err != nil {
		return nil, fmt.Errorf("getting the server's version: %w", err)
	}
	return &v, nil
}
