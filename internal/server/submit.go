package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

type submitInput struct {
	Namespace      string `path:"ns" doc:"The namespace the task runs in." example:"default"`
	ID             string `query:"id" doc:"The task ID: printable text of at most 512 bytes of UTF-8, without '/', control characters or white space at either end, and neither '.' nor '..' (an Airflow task-instance key will do); default: one the server makes."`
	IdempotencyKey string `header:"Idempotency-Key" doc:"The task ID, as a header (like id; give one of them, or both equal). Non-ASCII IDs are safer in id."`
	ContentType    string `header:"Content-Type" doc:"application/json, application/yaml or text/yaml."`
	RawBody        []byte `contentType:"application/json"`
}

type rerunInput struct {
	ID             string `path:"id" doc:"The finished task to run again."`
	NewID          string `query:"id" doc:"The new task's ID; default: one the server makes."`
	IdempotencyKey string `header:"Idempotency-Key" doc:"The new task's ID, as a header: a retried rerun with the same key returns the task it created."`
}

// dryRunClient is the client of the cluster whose API server checks a
// new task: the one its spec.placement names, when the service has it;
// otherwise Config.Client (the first cluster's, for a service with
// several: clusters usually differ in capacity, not in what they accept).
func (s *Server) dryRunClient(t *task.Task) kubernetes.Interface {
	if s.cfg.Clusters != nil && t.Spec.Placement != nil && t.Spec.Placement.Cluster != "" {
		if c := s.cfg.Clusters.Client(t.Spec.Placement.Cluster); c != nil {
			return c
		}
	}
	return s.cfg.Client
}

// Content types a submission may have.
var submitTypes = []string{"application/json", "application/yaml", "text/yaml"}

// documentSchema describes a submission in the OpenAPI document. The task
// format is documented in docs/task-format.md; its pod template is a
// Kubernetes PodTemplateSpec.
var documentSchema = &huma.Schema{
	Type: "object",
	Description: "A task (apiVersion kubetask.dev/v1alpha1, kind Task: metadata, spec.template and the task's own fields, " +
		"see docs/task-format.md) or a plain pod (apiVersion v1, kind Pod). Unknown fields are errors.",
	Required: []string{"apiVersion", "kind"},
	Properties: map[string]*huma.Schema{
		"apiVersion": {Type: "string", Enum: []any{task.APIVersion, "v1"}},
		"kind":       {Type: "string", Enum: []any{task.Kind, "Pod"}},
		"metadata":   {Type: "object", Description: "name, labels; namespace, when given, must be the path's."},
		"spec":       {Type: "object"},
	},
}

// describeSubmit documents the submission body once huma registered it.
func (s *Server) describeSubmit() {
	op := s.api.OpenAPI().Paths[api.Prefix+"/namespaces/{ns}/tasks"].Post
	op.RequestBody.Required = true
	op.RequestBody.Description = "The task document, JSON or YAML."
	op.RequestBody.Content = map[string]*huma.MediaType{}
	for _, ct := range submitTypes {
		op.RequestBody.Content[ct] = &huma.MediaType{Schema: documentSchema}
	}
}

func (s *Server) submit(ctx context.Context, in *submitInput) (*taskOutput, error) {
	if err := knownQuery(ctx, "id"); err != nil {
		return nil, err
	}
	if msgs := validation.IsDNS1123Label(in.Namespace); len(msgs) > 0 {
		return nil, huma.Error400BadRequest("bad namespace in the path: "+strings.Join(msgs, "; "),
			&huma.ErrorDetail{Location: "path.ns", Value: in.Namespace, Message: "must be a namespace name"})
	}
	ctx = s.beginTrace(ctx)
	c := CallerFrom(ctx)
	noteAudit(ctx, ActionSubmit, in.Namespace, "")
	if ok, err := s.allowed(ctx, c, ActionSubmit, in.Namespace); err != nil {
		return nil, err
	} else if !ok {
		return nil, forbidden(c, ActionSubmit, in.Namespace)
	}
	if len(s.cfg.Namespaces) > 0 && !slices.Contains(s.cfg.Namespaces, in.Namespace) {
		return nil, huma.Error422UnprocessableEntity(
			fmt.Sprintf("namespace %q is not one this kubetask serve runs tasks in (%s): submit to one of those, or ask the operator to add it to the task namespaces (deploy/namespaced/task-namespaces.yaml: the list given to kubetask serve --namespaces, and a RoleBinding of the ClusterRole kubetask-tasks there; docs/deploy.md)",
				in.Namespace, strings.Join(s.cfg.Namespaces, ", ")),
			&huma.ErrorDetail{Location: "path.ns", Value: in.Namespace, Message: "must be one of " + strings.Join(s.cfg.Namespaces, ", ")})
	}
	id, err := requestedID(in.ID, in.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	t, err := decodeSubmit(in.ContentType, in.RawBody, in.Namespace)
	if err != nil {
		return nil, err
	}
	if err := s.pods.check(ctx, t, in.Namespace, s.log.Warn); err != nil {
		return nil, err
	}
	if s.cfg.ValidateOnServer {
		var inv *task.InvalidError
		dryStart := time.Now()
		source, err := s.valid.validateOn(ctx, s.dryRunClient(t), t, in.Namespace)
		s.cfg.Tracer.NoteDryRun(ctx, dryStart, time.Now(), err)
		s.metrics.validations.WithLabelValues(source).Inc()
		var status apierrors.APIStatus
		switch {
		case errors.As(err, &inv):
			return nil, invalid(inv)
		case apierrors.IsNotFound(err) && errors.As(err, &status) && status.Status().Details != nil && status.Status().Details.Kind == "namespaces":
			return nil, huma.Error422UnprocessableEntity(fmt.Sprintf("namespace %q does not exist: create it, or submit the task to another namespace", in.Namespace),
				&huma.ErrorDetail{Location: "path.ns", Value: in.Namespace, Message: "no such namespace"})
		case err != nil:
			// Not a verdict on the task (quota, a webhook, a
			// timeout): the executor reports what happens when it runs.
			s.log.Warn("cannot check a task on the API server; accepting it", "namespace", in.Namespace, "err", err)
		}
	}
	return s.submitTask(ctx, id, t, "")
}

func (s *Server) rerun(ctx context.Context, in *rerunInput) (*taskOutput, error) {
	if err := knownQuery(ctx, "id"); err != nil {
		return nil, err
	}
	ctx = s.beginTrace(ctx)
	noteAudit(ctx, ActionRerun, "", in.ID)
	newID, err := requestedID(in.NewID, in.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	rec, err := s.record(ctx, in.ID, ActionRerun)
	if err != nil {
		return nil, err
	}
	if !rec.Terminal {
		return nil, huma.Error409Conflict(fmt.Sprintf("task %q is not finished (%s/%s): wait for its outcome or cancel it, then rerun it", rec.ID, rec.Phase, rec.Reason))
	}
	var t task.Task
	if err := json.Unmarshal(rec.Task, &t); err != nil {
		return nil, s.internal("decoding the document of task "+rec.ID, err)
	}
	t.Default()
	// The policy may have changed since the task was submitted.
	if err := s.pods.check(ctx, &t, rec.Namespace, s.log.Warn); err != nil {
		return nil, err
	}
	return s.submitTask(ctx, newID, &t, rec.ID)
}

// requestedID is the task ID a client gave in the id query parameter or the
// Idempotency-Key header (the same, if both), "" if none.
func requestedID(query, header string) (string, error) {
	if query != "" && header != "" && query != header {
		return "", huma.Error400BadRequest("the id parameter and the Idempotency-Key header differ: give the task ID once",
			&huma.ErrorDetail{Location: "query.id", Value: query}, &huma.ErrorDetail{Location: "header.Idempotency-Key", Value: header})
	}
	id, loc := query, "query.id"
	if id == "" {
		id, loc = header, "header.Idempotency-Key"
	}
	if id == "" {
		return "", nil
	}
	if err := task.ValidateID(id); err != nil {
		return "", huma.Error400BadRequest(fmt.Sprintf("bad task ID: %v (an ID is printable text of at most %d bytes, without '/')", err, task.MaxIDLength),
			&huma.ErrorDetail{Location: loc, Value: id, Message: err.Error()})
	}
	return id, nil
}

// decodeSubmit turns a submission's body into a defaulted, valid task that
// runs in namespace ns, or a status error: 415 for a content type other than
// JSON or YAML, 400 for a document that cannot be decoded, 422 with every
// problem and its field path for an invalid one.
func decodeSubmit(contentType string, body []byte, ns string) (*task.Task, error) {
	mt, _, err := mime.ParseMediaType(contentType)
	if contentType == "" || err != nil || !slices.Contains(submitTypes, mt) {
		return nil, huma.Error415UnsupportedMediaType(fmt.Sprintf("Content-Type %q is not a task document's: send %s", contentType, strings.Join(submitTypes, ", ")),
			&huma.ErrorDetail{Location: "header.Content-Type", Value: contentType, Message: "must be one of " + strings.Join(submitTypes, ", ")})
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, huma.Error400BadRequest("empty request body: send the task document",
			&huma.ErrorDetail{Location: "body", Message: "the document is empty"})
	}
	if mt == "application/json" {
		// Syntax only: a number no Go type holds (1e400) is the task
		// decoder's to report, with its field.
		if err := json.Unmarshal(body, new(json.RawMessage)); err != nil {
			msg := err.Error()
			var se *json.SyntaxError
			if errors.As(err, &se) {
				msg = fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
			}
			return nil, huma.Error400BadRequest("malformed JSON: "+msg+" (YAML needs Content-Type application/yaml)",
				&huma.ErrorDetail{Location: "body", Message: msg})
		}
	}
	t, err := task.Parse(body)
	var inv *task.InvalidError
	if errors.As(err, &inv) {
		return nil, invalid(inv)
	}
	if err != nil {
		return nil, huma.Error400BadRequest("malformed document: "+strings.TrimPrefix(err.Error(), "decoding task: "),
			&huma.ErrorDetail{Location: "body", Message: err.Error()})
	}
	if t.Namespace != "" && t.Namespace != ns {
		return nil, huma.Error422UnprocessableEntity(fmt.Sprintf("the document's namespace %q is not the path's %q: omit metadata.namespace or submit to its namespace", t.Namespace, ns),
			&huma.ErrorDetail{Location: "body.metadata.namespace", Value: t.Namespace, Message: fmt.Sprintf("must be %q (the path's) or omitted", ns)})
	}
	t.Namespace = ns
	return t, nil
}

// invalid is the 422 for an invalid task: every problem with its field path.
func invalid(inv *task.InvalidError) error {
	msg := fmt.Sprintf("invalid task: %d problem(s), each with its field path in errors: fix them and submit again", len(inv.Errs))
	if len(inv.Errs) == 1 {
		msg = "invalid task: " + inv.Errs[0].Error()
	}
	details := make([]error, 0, len(inv.Errs))
	for _, e := range inv.Errs {
		d := &huma.ErrorDetail{Location: "body", Message: e.ErrorBody()}
		if e.Field != "" && e.Field != "<nil>" {
			d.Location = "body." + e.Field
		}
		switch e.Type {
		case field.ErrorTypeInvalid, field.ErrorTypeNotSupported, field.ErrorTypeTypeInvalid, field.ErrorTypeTooLong, field.ErrorTypeTooMany:
		default:
			e.BadValue = nil // no value to show: a missing, forbidden or duplicate field
		}
		if e.BadValue != nil {
			if _, omit := e.BadValue.(field.OmitValueType); !omit {
				d.Value = e.BadValue
			}
		}
		details = append(details, d)
	}
	return huma.Error422UnprocessableEntity(msg, details...)
}

// normalized is a task document as the executor stores it, for comparing a
// submission with a stored one: decoded, defaulted and encoded again.
func normalized(doc []byte) ([]byte, error) {
	var t task.Task
	if err := json.Unmarshal(doc, &t); err != nil {
		return nil, err
	}
	// The executor writes the task's trace context on the document it
	// stores: a retry of the submission is the same document without it.
	task.WithoutTraceContext(&t)
	t.Default()
	return json.Marshal(&t)
}

// submitTask submits t under id (a new server ID when empty), idempotently:
// the call that creates the task answers 201; one that finds it (a retry,
// or a concurrent submission that lost the store's race) answers 200 for
// the same document (and origin), 409 for another.
func (s *Server) submitTask(ctx context.Context, id string, t *task.Task, origin string) (*taskOutput, error) {
	doc, err := json.Marshal(t)
	if err != nil {
		return nil, s.internal("encoding the task", err)
	}
	if doc, err = normalized(doc); err != nil {
		return nil, s.internal("encoding the task", err)
	}
	generated := id == ""
	if generated {
		id = s.cfg.NewID()
	}
	noteCreated(ctx, id)
	if !generated {
		// A retry finds its task with a read, and the store is not asked
		// to write.
		rec, err := s.cfg.Executor.Get(ctx, id)
		switch {
		case err == nil:
			return s.existing(ctx, rec, doc, origin)
		case !errors.Is(err, store.ErrNotFound):
			return nil, s.internal("reading task "+id, err)
		}
	}
	opts := []executor.SubmitOption{executor.SubmittedBy(actorOf(CallerFrom(ctx)))}
	if origin != "" {
		opts = append(opts, executor.Origin(origin))
	}
	giveBack, err := s.quotas.take(ctx, t.Namespace)
	if err != nil {
		return nil, err
	}
	cursor := s.ring.headCursor()
	start := time.Now()
	rec, created, err := s.cfg.Executor.SubmitCreated(ctx, id, t, opts...)
	if err != nil || !created {
		giveBack()
	}
	s.metrics.submitSteps.WithLabelValues("store").Observe(time.Since(start).Seconds())
	if errors.Is(err, executor.ErrInvalidTask) {
		var inv *task.InvalidError
		if errors.As(err, &inv) {
			return nil, invalid(inv)
		}
		return nil, huma.Error422UnprocessableEntity(strings.TrimPrefix(err.Error(), executor.ErrInvalidTask.Error()+": "),
			&huma.ErrorDetail{Location: "path.ns", Value: t.Namespace, Message: err.Error()})
	}
	if err != nil {
		return nil, s.internal("submitting task "+id, err)
	}
	if !created {
		// A concurrent submission of the ID created it first.
		return s.existing(ctx, rec, doc, origin)
	}
	out := s.toAPI(rec, false)
	return &taskOutput{Status: http.StatusCreated, Location: taskURL(id), Cursor: cursor, Body: &out}, nil
}

// existing answers a submission whose ID exists: 409 for another document;
// for the same one 200 with the task as it is now, to a caller who may read
// it (get in its namespace), and otherwise with the task's identity only
// (what the caller sent: ID, namespace, name, labels, origin), so that
// submitting is no way to read a task's state, result or attempts.
func (s *Server) existing(ctx context.Context, rec store.Record, doc []byte, origin string) (*taskOutput, error) {
	if !s.same(rec, doc, origin) {
		return nil, conflict(rec.ID)
	}
	reads, err := s.allowed(ctx, CallerFrom(ctx), ActionGet, rec.Namespace)
	if err != nil {
		return nil, err
	}
	if !reads {
		out := api.Task{ID: rec.ID, Namespace: rec.Namespace, Name: rec.Name, Labels: rec.Labels, Origin: rec.Origin}
		return &taskOutput{Status: http.StatusOK, Location: taskURL(rec.ID), Body: &out}, nil
	}
	cursor := s.ring.headCursor()
	if cur, err := s.cfg.Executor.Get(ctx, rec.ID); err == nil {
		rec = cur
	}
	out := s.toAPI(rec, false)
	return &taskOutput{Status: http.StatusOK, Location: taskURL(rec.ID), Cursor: cursor, Body: &out}, nil
}

func (s *Server) same(rec store.Record, doc []byte, origin string) bool {
	stored, err := normalized(rec.Task)
	if err != nil {
		s.log.Error("cannot decode a stored task document", "task", rec.ID, "err", err)
		return false
	}
	return bytes.Equal(stored, doc) && (origin == "" || rec.Origin == origin)
}

func conflict(id string) error {
	return huma.Error409Conflict(fmt.Sprintf("task ID %q is taken by a different document: choose another ID, or send the same document to get the existing task", id),
		&huma.ErrorDetail{Location: "query.id", Value: id, Message: "exists with another document"})
}

// taskURL is the path of task id, the ID escaped as a path segment.
func taskURL(id string) string { return api.Prefix + "/tasks/" + url.PathEscape(id) }
