package store

import (
	"context"
	"errors"
	"time"
)

// The interfaces below are what `kubetask serve` needs beyond Store: pages of
// records with filters, the log archive and retention. They are optional
// (found by type assertion, as kueue does), so that an embedding's own Store
// keeps working with the executor. The memory and SQLite stores implement all
// of them and pass the conformance suite in storetest.

// PageOptions select and page task records. Every filter is optional; a
// record matches when it matches all of them.
type PageOptions struct {
	// Namespace, Phase and Reason match exactly.
	Namespace, Phase, Reason string
	// NamePrefix matches the start of the task's name.
	NamePrefix string
	// Labels match the task's labels (metadata.labels) exactly, each of them.
	Labels map[string]string
	// CreatedAfter and CreatedBefore bound CreatedAt (after: inclusive,
	// before: exclusive); zero means unbounded.
	CreatedAfter, CreatedBefore time.Time
	// Terminal, when set, selects finished (true) or unfinished (false) tasks.
	Terminal *bool
	// Limit is the page size: default DefaultPageSize, at most MaxPageSize.
	Limit int
	// Continue is the token of the previous page (Page.Continue), given
	// with the same filters.
	Continue string
}

// DefaultPageSize and MaxPageSize bound PageOptions.Limit.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Page is one page of records, newest first: by CreatedAt descending, then by
// ID descending. Pages follow each other by keyset (the last record's
// CreatedAt and ID), so a record created while a client pages through never
// shifts the later pages: no record is skipped or returned twice.
type Page struct {
	Records []Record
	// Continue fetches the next page; empty on the last page.
	Continue string
}

// ErrBadContinue reports a continue token that this store did not issue or
// that belongs to other filters.
var ErrBadContinue = errors.New("bad continue token")

// Pager lists records page by page. Every filter is served by an index; no
// call counts the whole table.
type Pager interface {
	Page(ctx context.Context, opts PageOptions) (Page, error)
}

// LogKey names one container's log of one attempt of one task.
type LogKey struct {
	TaskID    string
	Attempt   int
	Container string
}

// LogInfo describes an archived log.
type LogInfo struct {
	// Size is the number of bytes archived (after truncation).
	Size int64
	// Complete is set once the whole log is archived (the container's log
	// ended, or the archive gave up on it and said so in the log).
	Complete bool
	// Truncated is set when the log reached the archive's size cap: bytes
	// after the cap were dropped and a marker line says so.
	Truncated bool
	// Cursor is the capturing follower's resume state (opaque to the store),
	// saved with the chunk it belongs to.
	Cursor []byte
}

// ErrLogOffset is returned by AppendLog when offset is not the archived size
// (a chunk appended twice, or one missing).
var ErrLogOffset = errors.New("log chunk offset does not match the archived size")

// Logs is the log archive: each container's log of each attempt, appended in
// chunks as it is captured, readable by byte offset while it grows and after
// the pod is gone.
type Logs interface {
	// AppendLog appends data at offset, which must equal the archived size,
	// saves cursor with it and, when complete is set, marks the log
	// complete, all in one durable write. Bytes beyond the store's cap are
	// dropped and the log marked truncated, with a marker line appended
	// once. It returns the log's info after the write.
	AppendLog(ctx context.Context, key LogKey, offset int64, data []byte, cursor []byte, complete bool) (LogInfo, error)
	// ReadLog returns up to limit bytes of the log from offset (fewer at the
	// end) and the log's info; ErrNotFound when nothing was archived.
	ReadLog(ctx context.Context, key LogKey, offset int64, limit int) ([]byte, LogInfo, error)
	// LogKeys lists the archived logs of a task, by attempt then container.
	LogKeys(ctx context.Context, taskID string) ([]LogKey, error)
}

// Retention deletes finished tasks and their logs.
type Retention interface {
	// DeleteFinishedBefore deletes up to batch terminal tasks whose last
	// update is before t, with their logs, and returns how many it deleted.
	DeleteFinishedBefore(ctx context.Context, t time.Time, batch int) (int, error)
}
