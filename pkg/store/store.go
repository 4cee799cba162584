// Package store keeps the durable records of the executor's tasks. The
// executor writes a task's terminal outcome here before it removes the pod's
// finalizer, so a record, not a pod, is the source of truth about how a task
// ended; that is what makes the terminal report exactly-once across executor
// restarts and crashes.
//
// Implementations: NewMemory (embedding, tests), OpenSQLite (durable,
// modernc.org/sqlite, no cgo, one process) and OpenPostgres (durable,
// PostgreSQL through pgx, shared by several processes). Every
// implementation passes the conformance suite in storetest. All three also
// implement the optional interfaces of `kubetask serve` (service.go): Pager,
// Logs and Retention. docs/store.md describes them.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrNotFound is returned for an ID that has no record.
var ErrNotFound = errors.New("task record not found")

// ErrConflict is returned by Update when the record changed since it was
// read: its version moved, or the stored record is another use of its ID
// (another Nonce).
var ErrConflict = errors.New("task record changed concurrently")

// ErrFenced is returned by Update when the write carries a fencing epoch
// (Record.Epoch) that is not the current term epoch of its executor instance:
// a newer term of the instance began (BeginTerm), so the writer no longer
// acts for it and must stop.
var ErrFenced = errors.New("task record write fenced: a newer term of its executor instance began")

// ErrUnavailable wraps a failure to reach the store: its database is down,
// restarting, refusing connections or lost the connection. The call may
// succeed when made again later; a write that failed so was not applied,
// unless the connection was lost during its commit (then its outcome is
// unknown: retry only what is idempotent, such as a Create).
var ErrUnavailable = errors.New("task store unavailable")

// AttemptOutcome is the recorded end of one attempt. There is at most one per
// attempt: Attempts[i] belongs to attempt i.
type AttemptOutcome struct {
	Attempt   int    `json:"attempt"`
	Pod       string `json:"pod"`
	Phase     string `json:"phase"`
	Reason    string `json:"reason"`
	Message   string `json:"message,omitempty"`
	ExitCode  *int32 `json:"exitCode,omitempty"`
	Retryable bool   `json:"retryable,omitempty"`
	// PodUID is the UID of the pod whose end this is ("" for a pod recorded
	// before the fence, or an attempt that had no pod).
	PodUID string `json:"podUID,omitempty"`
	// Cluster is the cluster the attempt ran on (Record.Cluster while it
	// was current); "" for the one cluster of a single-cluster service, or
	// an attempt recorded before clusters were kept.
	Cluster    string    `json:"cluster,omitempty"`
	FinishedAt time.Time `json:"finishedAt"`
	// ObservedAt is when the executor recorded the outcome (lag metric source).
	ObservedAt time.Time `json:"observedAt"`
	// PodStopped says no pod of this attempt runs any more on its
	// cluster: its executor saw the pod stopped (every container
	// terminated, or the pod gone) when it recorded this, or later, when
	// the next attempt began waiting for a slot; also true for an attempt
	// that had no pod. Until it is set, the task does not move to another
	// cluster unless this cluster is declared lost: its next attempt waits
	// for this pod there (the placer's rule, docs/multicluster.md).
	PodStopped bool `json:"podStopped,omitempty"`
	// Discarded is what the pod of an attempt declared lost with its
	// cluster (Reason ClusterLost) did, as that cluster's executor saw it
	// once the cluster answered again: kept for the user, never the
	// attempt's or the task's outcome. Nil until then, and for any other
	// attempt.
	Discarded *DiscardedEnd `json:"discarded,omitempty"`
}

// DiscardedEnd is how a lost attempt's pod ended: its main container's
// termination.
type DiscardedEnd struct {
	ExitCode   *int32    `json:"exitCode,omitempty"`
	Reason     string    `json:"reason,omitempty"` // the container's (Completed, Error, OOMKilled ...)
	FinishedAt time.Time `json:"finishedAt"`
	ObservedAt time.Time `json:"observedAt"`
}

// Actor is who did something to a task, as the service authenticated them.
type Actor struct {
	// Auth is how they were authenticated: "token" (the token mode's
	// file), "kubernetes" (a TokenReview) or "none".
	Auth string `json:"auth,omitempty"`
	// User is the token's subject, or the Kubernetes user name.
	User string `json:"user"`
	// UID and Groups are the Kubernetes user's (kubernetes mode).
	UID    string   `json:"uid,omitempty"`
	Groups []string `json:"groups,omitempty"`
}

// IsZero reports whether a is unknown.
func (a Actor) IsZero() bool {
	return a.Auth == "" && a.User == "" && a.UID == "" && len(a.Groups) == 0
}

// String is a as compact JSON ("" when zero): the stores' column value and
// the kubetask.dev/submitted-by annotation of the task's pods.
func (a Actor) String() string {
	if a.IsZero() {
		return ""
	}
	b, _ := json.Marshal(a) // strings only: never fails
	return string(b)
}

// ParseActor decodes what String returns.
func ParseActor(s string) (Actor, error) {
	var a Actor
	if s == "" {
		return a, nil
	}
	if err := json.Unmarshal([]byte(s), &a); err != nil {
		return Actor{}, fmt.Errorf("decoding an actor: %w", err)
	}
	return a, nil
}

// parseActors decodes the stored actors of rec.
func parseActors(rec *Record, submittedBy, cancelledBy string) error {
	var err error
	if rec.SubmittedBy, err = ParseActor(submittedBy); err != nil {
		return fmt.Errorf("task record %s submitter: %w", rec.ID, err)
	}
	if rec.CancelledBy, err = ParseActor(cancelledBy); err != nil {
		return fmt.Errorf("task record %s canceller: %w", rec.ID, err)
	}
	return nil
}

// Record is the durable state of one task.
type Record struct {
	// ID is the caller's task ID, unique per store: any text
	// task.ValidateID accepts (printable UTF-8, up to 512 bytes), kept
	// exact.
	ID string
	// Namespace and Name are where and as what the task's pods run.
	Namespace, Name string
	// Executor is the instance that owns the task.
	Executor string
	// Cluster is the cluster the task's current attempt is placed on, by
	// name: "" for the one cluster of a single-cluster service, or a task
	// not placed yet. It names the cluster of Executor's instance, in words
	// for lists and filters (ListOptions.Cluster, PageOptions.Cluster).
	// Clusters.Move changes it with Executor, only while the current
	// attempt has no pod; Update writes it as given, like every field.
	Cluster string
	// Labels are the task's labels (its metadata.labels), for Page's filter.
	Labels map[string]string
	// Origin is the ID of the task this one reruns; empty otherwise.
	Origin string
	// Task is the task document as submitted (JSON).
	Task []byte
	// Attempt is the current attempt, 0 for the first.
	Attempt int
	// Phase, Reason, Message, ExitCode and Retryable are the latest derived
	// state of the current attempt (podstate), or the final outcome once
	// Terminal.
	Phase, Reason, Message string
	ExitCode               *int32
	Retryable              bool
	// Result is the task's result, when it has one and it was read.
	Result []byte
	// Terminal is true once the task's outcome is final (no further attempt).
	Terminal bool
	// CancelledAt is when cancellation was requested; zero if never.
	CancelledAt time.Time
	// NextAttemptAt delays the creation of the current attempt's pod (retry backoff).
	NextAttemptAt time.Time
	// PodCreated is true once the current attempt's pod was created (so a
	// missing pod means it is gone, not that it is yet to be made).
	PodCreated bool
	// PodUID and PodEpoch identify the current attempt's pod once
	// PodCreated is set: its UID and the fencing epoch of the term that
	// created it (the pod's kubetask.dev/epoch annotation). A pod is the
	// attempt's only when both match; empty and 0 for a pod recorded before
	// the fence existed.
	PodUID   string
	PodEpoch int64
	// Nonce is chosen at random when the record is created (the executor's
	// Submit) and carried by every pod of the task, so that a pod of an
	// earlier record with the same ID (deleted by retention, lost with a
	// memory store) is never taken for one of this record's. Every
	// version-checked write (Update, Clusters.Move) requires it to be the
	// stored record's nonce, so that a copy of an earlier record of the ID
	// never overwrites a later one at the same version; a stored record
	// without a nonce (written before nonces) accepts any, and so may be
	// given one.
	Nonce string
	// Epoch fences a write: when it is not 0, Update applies the write only
	// while Epoch is the current term epoch of the instance named by
	// Executor (BeginTerm), and fails with ErrFenced otherwise. It is stored
	// as the epoch of the term that last wrote the record (0 for an
	// unfenced write: a submission, a cancellation).
	Epoch int64
	// Attempts holds the recorded outcome of every finished attempt, in order.
	Attempts []AttemptOutcome
	// SubmittedBy is who submitted the task (for a rerun: who asked for
	// it); CancelledBy who asked for its cancellation. Zero when unknown (a
	// library caller, a record written before they were kept).
	SubmittedBy, CancelledBy Actor
	// CreatedAt and UpdatedAt are set by the store from its clock (Create
	// sets both, Update sets UpdatedAt); the caller's values are ignored.
	CreatedAt, UpdatedAt time.Time
	// Version increases with every write; Update requires the caller's copy
	// to carry the stored one.
	Version int64
}

// ListOptions filter List.
type ListOptions struct {
	// Executor, when set, selects one instance's tasks.
	Executor string
	// Cluster, when set, selects the tasks placed on that cluster
	// (Record.Cluster).
	Cluster string
	// NonTerminal selects only tasks whose outcome is not final.
	NonTerminal bool
}

// Store persists task records. Implementations are safe for concurrent use.
//
// A Create or Update whose context ends before it completes returns the
// context's error only if its write was not applied; a store may instead
// finish the write and return its result. Get and List see every write whose
// call has returned.
type Store interface {
	// Create stores rec (Version is set to 1) unless a record with rec.ID
	// exists. It returns the stored record and whether this call created it,
	// which makes submission idempotent by ID.
	Create(ctx context.Context, rec Record) (Record, bool, error)
	// Get returns the record of id, or ErrNotFound.
	Get(ctx context.Context, id string) (Record, error)
	// Update writes rec if rec.Version equals the stored version and the
	// stored record is the same use of the ID (its Nonce is rec.Nonce, or
	// it has none), and returns it with the new version; ErrConflict
	// otherwise, ErrNotFound if absent.
	// Once Update returns nil the write is durable (for durable stores).
	Update(ctx context.Context, rec Record) (Record, error)
	// BeginTerm starts a new term of executor instance: it raises the
	// instance's fencing epoch by one (the first term's is 1) and returns it.
	// Once it has returned, every Update fenced with an older epoch of the
	// instance fails with ErrFenced, and every fenced Update applied before
	// it is visible to Get and List.
	BeginTerm(ctx context.Context, instance string) (int64, error)
	// Epoch returns the current fencing epoch of instance (0 before its
	// first term).
	Epoch(ctx context.Context, instance string) (int64, error)
	// List returns the matching records ordered by ID.
	List(ctx context.Context, opts ListOptions) ([]Record, error)
	// Close releases the store's resources.
	Close() error
}
