package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/utils/clock"
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
	// Namespaces, when not empty, confines the page to records in one of
	// these namespaces (with Namespace as well: to Namespace if it is one of
	// them, else to nothing). The records of other namespaces are never
	// read into a page, so neither a page nor its continue token (which
	// carries the page's last record) says anything about them: this is how
	// `kubetask serve` lists for a caller that may see some namespaces only.
	Namespaces []string
	// NamePrefix matches the start of the task's name.
	NamePrefix string
	// Cluster matches the cluster the task is placed on (Record.Cluster)
	// exactly.
	Cluster string
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
// shifts the later pages: no record is skipped or returned twice. (CreatedAt
// never changes, so an update does not move a record either.)
type Page struct {
	Records []Record
	// Continue fetches the next page; empty on the last page, so a page
	// with a token is never followed by an empty one. It is opaque
	// (base64url of the last record's key and a digest of the filters),
	// does not expire and survives the deletion of that record. It is not
	// a capability: a crafted token only moves where the page starts, the
	// filters still apply.
	Continue string
}

// ErrBadContinue reports a continue token that this store did not issue or
// that belongs to other filters.
var ErrBadContinue = errors.New("bad continue token")

// Pager lists records page by page. Every filter is served by an index; no
// call counts the whole table.
type Pager interface {
	// Page returns the page of matching records that follows
	// opts.Continue (the first page when it is empty). A Limit outside
	// 1..MaxPageSize is taken as DefaultPageSize (0 or less) or MaxPageSize.
	// A token that does not decode, or that was issued for other filters,
	// is ErrBadContinue; the limit may change from page to page.
	Page(ctx context.Context, opts PageOptions) (Page, error)
}

// LogKey names one container's log of one attempt of one task.
type LogKey struct {
	TaskID    string
	Attempt   int
	Container string
}

// LogAppend is one AppendLog write.
type LogAppend struct {
	// Offset is where Data goes: it must equal the archived size.
	Offset int64
	// Data is appended at Offset (none: only Cursor and Complete are saved).
	Data []byte
	// Cursor replaces the saved cursor (nil stays nil).
	Cursor []byte
	// Complete marks the log complete.
	Complete bool
	// Nonce, when set, is the nonce of the record the log belongs to
	// (Record.Nonce, which every pod of the record carries): the append is
	// ErrNotFound when the task's record is another one. A capture of an
	// earlier record's pod that outlived the record (deleted by retention,
	// its ID then used again) can then not write into the new record's log
	// (simulation seed 1100034445: such a capture's last write put the
	// earlier pod's lines at the start of the new attempt's log). "" skips
	// the check (a record from before nonces).
	Nonce string
}

// logOf reports whether an append with nonce belongs to the record whose
// nonce is recNonce (LogAppend.Nonce).
func logOf(recNonce, nonce string) bool { return nonce == "" || nonce == recNonce }

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
// (a chunk appended twice, or one missing), with the log's current info, so
// the caller can resume from its Size; and by ReadLog for an offset outside
// 0..Size.
var ErrLogOffset = errors.New("log chunk offset does not match the archived size")

// ErrLogComplete is returned by AppendLog for data appended to a log that
// is already complete, with the log's info; nothing is written.
var ErrLogComplete = errors.New("log already complete")

// DefaultMaxLogSize is the per-log size cap of a store whose
// Options.MaxLogSize is 0: 64 MiB.
const DefaultMaxLogSize int64 = 64 << 20

// LogTruncatedMarker is the line the archive appends once to a log that
// reached its cap of maxSize bytes. It starts a line of its own: when the kept
// bytes do not end with a newline, one is added before it (and counted in
// Size like the marker).
func LogTruncatedMarker(maxSize int64) string {
	return fmt.Sprintf("[kubetask: log truncated at %d bytes]\n", maxSize)
}

// Logs is the log archive: each container's log of each attempt, appended in
// chunks as it is captured, readable by byte offset while it grows and after
// the pod is gone.
//
// A log belongs to a task record: AppendLog of a task that has no record,
// or whose record has another nonce than the append's, is ErrNotFound (the
// executor creates the record at submission, before any pod), and Retention
// deletes a task's logs with its record, so the archive holds no log that
// nothing would ever delete, and no record's log holds another record's
// lines.
type Logs interface {
	// AppendLog appends a.Data at a.Offset, which must equal the archived
	// size (else ErrLogOffset), saves a.Cursor with it (replacing the
	// previous one; nil stays nil) and, when a.Complete is set, marks the
	// log complete, all in one durable write: once it returns nil, a crash
	// loses none of it. Bytes beyond the store's cap (Options.MaxLogSize) are dropped and
	// the log marked truncated, with LogTruncatedMarker appended once; later
	// appends at Size drop their data but still save the cursor and the
	// complete flag. Complete stays set; data after it is ErrLogComplete.
	// The first append creates the log (an empty one with only a cursor or
	// the complete flag, too). It returns the log's info after the write.
	AppendLog(ctx context.Context, key LogKey, a LogAppend) (LogInfo, error)
	// ReadLog returns up to limit bytes of the log from offset (fewer at the
	// end, none when limit <= 0) and the log's info, from one consistent
	// view of the log; ErrNotFound when nothing was archived, ErrLogOffset
	// for an offset outside 0..Size.
	ReadLog(ctx context.Context, key LogKey, offset int64, limit int) ([]byte, LogInfo, error)
	// LogKeys lists the archived logs of a task, by attempt then container
	// (none, and no error, for a task without logs or without a record).
	LogKeys(ctx context.Context, taskID string) ([]LogKey, error)
}

// Retention deletes finished tasks and their logs.
type Retention interface {
	// DeleteFinishedBefore deletes up to batch terminal tasks whose last
	// update is before t, oldest first, with their labels and logs, in one
	// transaction, and returns how many it deleted. batch must be positive;
	// keep it small (say 100), since the store's writer waits for the
	// deletion. A store may delete fewer than batch to bound one call's work
	// (the SQLite store stops once the deleted logs exceed 64 MiB), so a
	// caller that wants everything deleted calls again until it returns 0.
	DeleteFinishedBefore(ctx context.Context, t time.Time, batch int) (int, error)
}

// Options configure a store (NewMemoryWithOptions, OpenSQLiteWithOptions,
// OpenPostgres); the zero value is the default.
type Options struct {
	// Clock sets CreatedAt and UpdatedAt; nil means the real clock.
	Clock clock.PassiveClock
	// MaxLogSize caps each archived log (one container of one attempt) in
	// bytes, the truncation marker not counted: 0 means DefaultMaxLogSize,
	// a negative value no cap.
	MaxLogSize int64
}

// maxLogSize returns the cap in effect, negative for none.
func (o Options) maxLogSize() int64 {
	if o.MaxLogSize == 0 {
		return DefaultMaxLogSize
	}
	return o.MaxLogSize
}

// clock returns the clock in effect.
func (o Options) clock() clock.PassiveClock {
	if o.Clock == nil {
		return clock.RealClock{}
	}
	return o.Clock
}

// clipLog decides what an append of data to a log of size bytes (truncated
// or not) stores under the cap maxSize (negative: none): the bytes to
// append and whether the log is truncated afterwards. lastByte returns the
// log's last archived byte; it is called only when the cap falls exactly at
// the current end of a non-empty log.
func clipLog(size int64, truncated bool, maxSize int64, data []byte, lastByte func() (byte, error)) ([]byte, bool, error) {
	if truncated {
		return nil, true, nil
	}
	if maxSize < 0 || int64(len(data)) <= maxSize-size {
		return data, false, nil
	}
	room := max(maxSize-size, 0)
	kept := append([]byte{}, data[:room]...)
	var last byte = '\n' // an empty log needs no newline before the marker
	switch {
	case room > 0:
		last = kept[room-1]
	case size > 0:
		b, err := lastByte()
		if err != nil {
			return nil, false, err
		}
		last = b
	}
	if last != '\n' {
		kept = append(kept, '\n')
	}
	return append(kept, LogTruncatedMarker(maxSize)...), true, nil
}

// String returns "<task>/<attempt>/<container>", for errors.
func (k LogKey) String() string {
	return fmt.Sprintf("%s/%d/%s", k.TaskID, k.Attempt, k.Container)
}

// copy returns i with its own Cursor.
func (i LogInfo) copy() LogInfo {
	i.Cursor = bytes.Clone(i.Cursor)
	return i
}

// compareLogKeys orders keys by task, attempt, then container.
func compareLogKeys(a, b LogKey) int {
	return cmp.Or(strings.Compare(a.TaskID, b.TaskID), cmp.Compare(a.Attempt, b.Attempt), strings.Compare(a.Container, b.Container))
}
