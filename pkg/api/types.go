package api

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Prefix is the path under which every endpoint of version 1 lives.
const Prefix = "/api/v1"

// Request and response headers of the API.
const (
	// HeaderIdempotencyKey gives a submission's task ID (like the id query
	// parameter): a retried submission then returns the task it created.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderCursor, on a task read, is the watch cursor taken before the
	// read: a watch from it misses no change made after the read.
	HeaderCursor = "X-Kubetask-Cursor"
	// HeaderLogSize, HeaderLogComplete and HeaderLogTruncated describe an
	// archived log when its response starts (and, as trailers, when it ends).
	HeaderLogSize      = "X-Kubetask-Log-Size"
	HeaderLogComplete  = "X-Kubetask-Log-Complete"
	HeaderLogTruncated = "X-Kubetask-Log-Truncated"
	// HeaderLogResume, a log response's trailer, is "true" when the server
	// ended the response early (shutdown, stream timeout) although the log
	// goes on: request it again from the offset reached.
	HeaderLogResume = "X-Kubetask-Log-Resume"
	// HeaderLastEventID resumes a watch (Server-Sent Events' own header).
	HeaderLastEventID = "Last-Event-ID"
)

// Task is a task as the API reports it: its state, its attempts and, while it
// is Pending, the recent Kubernetes events of its pod.
type Task struct {
	ID        string            `json:"id" doc:"The task ID: given by the client (id or Idempotency-Key) or made by the server (sorts by creation time)."`
	Namespace string            `json:"namespace" doc:"Namespace the task's pods run in."`
	Name      string            `json:"name" doc:"The task's name (metadata.name)."`
	Labels    map[string]string `json:"labels,omitempty" doc:"The task's labels (metadata.labels)."`
	Origin    string            `json:"origin,omitempty" doc:"ID of the task this one reruns."`
	// Phase, Reason, Message and ExitCode are the task's state: the current
	// attempt's while it runs, the outcome once Terminal.
	Phase    string `json:"phase" doc:"Pending, Running, Succeeded or Failed." example:"Running"`
	Reason   string `json:"reason" doc:"Machine-readable cause of the phase (docs/states.md)." example:"Running"`
	Message  string `json:"message,omitempty" doc:"Human-readable detail."`
	ExitCode *int32 `json:"exitCode,omitempty" doc:"The main container's exit code, once it exited."`
	Terminal bool   `json:"terminal" doc:"True once the outcome is final: no further attempt."`
	// Result is the task's result when it is valid UTF-8, ResultBase64 when
	// it is not; at most one of them is set.
	Result       string `json:"result,omitempty" doc:"The task's result, when it has one and it is valid UTF-8."`
	ResultBase64 []byte `json:"resultBase64,omitempty" doc:"The task's result, base64, when it is not valid UTF-8."`
	Attempt      int    `json:"attempt" doc:"The current (or last) attempt, 0 for the first."`
	Cluster      string `json:"cluster,omitempty" doc:"The cluster the task is placed on (its current attempt's), for a service with several clusters."`
	// Attempts lists every attempt: the finished ones with their outcome,
	// then the current one while the task runs (FinishedAt unset).
	Attempts    []Attempt  `json:"attempts,omitempty" doc:"Every attempt, oldest first; the current one (unfinished) last."`
	CancelledAt *time.Time `json:"cancelledAt,omitempty" doc:"When cancellation was requested."`
	// SubmittedBy is who submitted the task (for a rerun: who asked for
	// it, Origin naming the task it reruns); CancelledBy who cancelled it.
	// Unset when unknown (tasks of a library caller, or recorded before
	// kubetask kept them).
	SubmittedBy *Actor    `json:"submittedBy,omitempty" doc:"Who submitted the task (of a rerun: who reran it). Every pod of the task carries it in its kubetask.dev/submitted-by annotation."`
	CancelledBy *Actor    `json:"cancelledBy,omitempty" doc:"Who cancelled the task."`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
	// Events are the recent Kubernetes events of the current attempt's pod,
	// reported (by Get only) while the task is Pending: why it does not start.
	Events []PodEvent `json:"events,omitempty" doc:"While Pending (get only): the recent Kubernetes events of the current attempt's pod, oldest first."`
	// Document is the task as submitted, defaulted (get only).
	Document json.RawMessage `json:"document,omitempty" doc:"The task document as stored, defaulted (get only)."`
}

// Actor is who did something to a task, as the server authenticated them.
type Actor struct {
	Auth   string   `json:"auth,omitempty" doc:"How they were authenticated: token (the token file), kubernetes (a TokenReview) or none."`
	User   string   `json:"user" doc:"The token's subject, or the Kubernetes user name." example:"system:serviceaccount:ci:runner"`
	UID    string   `json:"uid,omitempty" doc:"The Kubernetes user's UID (kubernetes mode)."`
	Groups []string `json:"groups,omitempty" doc:"The Kubernetes user's groups (kubernetes mode)."`
}

// ResultBytes returns the task's result bytes (from Result or ResultBase64), nil
// when it has none.
func (t *Task) ResultBytes() []byte {
	if t.ResultBase64 != nil {
		return t.ResultBase64
	}
	if t.Result != "" {
		return []byte(t.Result)
	}
	return nil
}

// Attempt is one attempt of a task: one pod.
type Attempt struct {
	Attempt    int        `json:"attempt" doc:"Attempt number, 0 for the first."`
	Pod        string     `json:"pod,omitempty" doc:"The attempt's pod name (in the task's namespace), once created."`
	Cluster    string     `json:"cluster,omitempty" doc:"The cluster the attempt ran on, for a service with several clusters."`
	Phase      string     `json:"phase"`
	Reason     string     `json:"reason"`
	Message    string     `json:"message,omitempty"`
	ExitCode   *int32     `json:"exitCode,omitempty"`
	Retryable  bool       `json:"retryable,omitempty" doc:"The failure is one that a retry may overcome."`
	FinishedAt *time.Time `json:"finishedAt,omitempty" doc:"When the attempt ended; unset for the current, unfinished attempt."`
	ObservedAt *time.Time `json:"observedAt,omitempty" doc:"When kubetask recorded the outcome."`
}

// PodEvent is a Kubernetes event of a task's pod.
type PodEvent struct {
	Type     string    `json:"type" doc:"Normal or Warning."`
	Reason   string    `json:"reason" example:"FailedScheduling"`
	Message  string    `json:"message"`
	Count    int32     `json:"count,omitempty"`
	LastSeen time.Time `json:"lastSeen"`
}

// TaskList is one page of tasks, newest first.
type TaskList struct {
	Items []Task `json:"items" doc:"The page's tasks, newest first (by creation time, then ID)."`
	// Continue fetches the next page with the same filters; empty on the
	// last page. A page may hold fewer items than the limit (even none) and
	// still have a next page.
	Continue string `json:"continue,omitempty" doc:"Token for the next page (same filters); empty on the last page."`
	// Cursor is the watch cursor taken before the page was read: a watch
	// from it misses no change made after the read.
	Cursor string `json:"cursor,omitempty" doc:"Watch cursor taken before the read: watch from it to miss nothing."`
}

// Event types of a watch. Task events carry the executor's event type
// (Submitted, PodCreated, State, ...); these two are the watch's own.
const (
	// EventExpired: the cursor the watch resumed from is older than what
	// the server keeps (or from an earlier server process). Events were
	// missed: list again; the stream goes on with every event after this one.
	EventExpired = "Expired"
	// EventBookmark: sent when a stream starts, with the cursor the stream
	// starts from, so that a client that sees no event still has a cursor.
	EventBookmark = "Bookmark"
)

// Event is one change of one task, as a watch delivers it. The SSE event's
// id and name are Cursor and Type.
type Event struct {
	Cursor    string    `json:"cursor" doc:"Resume a watch after this event with Last-Event-ID or ?cursor=."`
	Type      string    `json:"type" doc:"Submitted, PodCreated, PodAdopted, State, AttemptFinished, PodStopping, PodDeleting, PodReleased; or Expired, Bookmark." example:"State"`
	TaskID    string    `json:"taskId,omitempty"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name,omitempty"`
	Attempt   int       `json:"attempt"`
	Pod       string    `json:"pod,omitempty" doc:"The attempt's pod, namespace/name."`
	Cluster   string    `json:"cluster,omitempty" doc:"The cluster the attempt runs on, for a service with several clusters."`
	Phase     string    `json:"phase,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Message   string    `json:"message,omitempty"`
	ExitCode  *int32    `json:"exitCode,omitempty"`
	Terminal  bool      `json:"terminal,omitempty" doc:"Set on the AttemptFinished event that records the task's outcome."`
	Time      time.Time `json:"time"`
}

// Problem is an error response: RFC 9457 problem details
// (application/problem+json) with the list of individual errors. It is the
// error the client returns for every non-2xx answer.
type Problem struct {
	Type     string          `json:"type,omitempty"`
	Title    string          `json:"title,omitempty"`
	Status   int             `json:"status,omitempty"`
	Detail   string          `json:"detail,omitempty"`
	Instance string          `json:"instance,omitempty"`
	Errors   []ProblemDetail `json:"errors,omitempty"`
}

// ProblemDetail is one problem of a request: what is wrong, where (body.<field
// path>, query.<name>, header.<name>, path.<name>) and the value found there.
type ProblemDetail struct {
	Message  string `json:"message,omitempty"`
	Location string `json:"location,omitempty"`
	Value    any    `json:"value,omitempty"`
}

// Error renders the status, the detail and every individual error.
func (p *Problem) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d", p.Status)
	if p.Title != "" {
		fmt.Fprintf(&b, " %s", p.Title)
	}
	if p.Detail != "" {
		fmt.Fprintf(&b, ": %s", p.Detail)
	}
	for _, e := range p.Errors {
		b.WriteString("\n  ")
		if e.Location != "" {
			b.WriteString(e.Location)
			b.WriteString(": ")
		}
		b.WriteString(e.Message)
	}
	return b.String()
}

// Cluster is one cluster of a service with several (kubetask serve's
// clusters): where tasks are placed, and whether they may be now.
type Cluster struct {
	Name    string            `json:"name" doc:"The cluster's name, as tasks' spec.placement.cluster names it." example:"east"`
	State   string            `json:"state" doc:"Ready (tasks are placed on it), Unreachable, Draining (no new placement; running tasks finish), Lost or Returning (docs/multicluster.md)." example:"Ready"`
	Since   time.Time         `json:"since" doc:"When the cluster entered its state."`
	Reason  string            `json:"reason,omitempty" doc:"Why the cluster is in its state, one word."`
	Message string            `json:"message,omitempty" doc:"Why, for people."`
	Labels  map[string]string `json:"labels,omitempty" doc:"The cluster's labels, which tasks' spec.placement.clusterSelector match."`
	Mode    string            `json:"mode,omitempty" doc:"push (the service runs its executors) or agent (kubetask serve --agent in that cluster does)." example:"push"`
}

// ClusterList is the clusters of a service, by name; empty for a service
// that runs tasks on one cluster (no clusters in its configuration).
type ClusterList struct {
	Items []Cluster `json:"items" doc:"The clusters, by name."`
}
