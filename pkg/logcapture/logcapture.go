// Package logcapture archives one container's log into a store.Logs archive
// while the container runs, so that the log outlives the pod.
//
// # Guarantees
//
// Run follows the log with a podlog.Follower (PartialLines: no byte waits for
// its newline) and appends what it read to the archive in chunks, each chunk
// together with the follower's cursor taken right after its last byte, in one
// durable write. So the archive always holds a prefix of the log and the
// position right after it, and a capture started again after anything (the
// service killed, the API server restarted, a stream broken, the capture's
// context ended) resumes exactly there: together the captures archive every
// byte the container wrote, once and in order, as far as the node keeps it
// (see podlog's Limits).
//
// Run returns nil only once the whole log is archived and the log is marked
// complete, which is what an executor waits for before it releases the pod's
// finalizer: a pod deleted, evicted or force-deleted keeps its log readable
// until then. When the pod vanished anyway before its log was read to the
// end (its finalizer removed by someone else), the archive keeps what was
// read, a marker line says that the rest is lost, and the log is complete.
//
// A log the node does not serve (its kubelet unreachable, the node gone)
// would hold the pod's finalizer for ever. So once the container has
// terminated for good, or its pod is being deleted or gone, a capture that
// archives nothing new for GiveUpAfter ends the log with a marker line
// saying that the rest is lost (UnreadableMarker). When the API server says
// that it has no address for the pod's node (a node that never had one, as a
// simulated kwok node), it gives up after a few such answers in a row
// instead.
//
// Chunks are written when ChunkSize bytes are pending and at least every
// FlushInterval while bytes are pending, so a reader of the archive (a
// `kubetask logs -f`) lags the container by about FlushInterval, and one
// capture holds at most about ChunkSize bytes (plus one read) in memory.
package logcapture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/pkg/podlog"
	"github.com/kubetask/kubetask/pkg/store"
)

// Defaults of Config.
const (
	DefaultChunkSize     = 128 << 10
	DefaultFlushInterval = 250 * time.Millisecond
	DefaultGiveUpAfter   = 5 * time.Minute
	// finalWriteTimeout bounds the write of the pending bytes after the
	// capture's context ended (a shutdown), which uses a context of its own.
	finalWriteTimeout = 10 * time.Second
)

// PodGoneMarker is the line appended to a log whose pod vanished before the
// log was read to its end. It starts a line of its own.
const PodGoneMarker = "[kubetask: the pod was deleted before its log was read completely; the rest of the log is lost]\n"

// UnreadableMarker is the line appended to a log whose container ended but
// whose rest the node did not serve for Config.GiveUpAfter.
func UnreadableMarker(after time.Duration) string {
	return fmt.Sprintf("[kubetask: the node did not serve the rest of this log for %s after the container ended; the rest of the log is lost]\n", after)
}

// NoAddressMarker is the line appended to a log whose node has no address
// the API server could read it from (a simulated node, say).
const NoAddressMarker = "[kubetask: the pod's node has no address to read logs from; the rest of the log is not archived]\n"

// NodeGoneMarker is the line appended to a log whose pod's node object was
// deleted once its container ended, when the rest was still unread: nobody
// can serve it any more.
const NodeGoneMarker = "[kubetask: the pod's node is gone; the rest of the log is not archived]\n"

// BadCursorMarker is the line appended to a log whose saved resume position
// this version cannot read (an archive written by an incompatible version):
// the capture cannot continue it without duplicating or losing bytes, so it
// ends the log.
const BadCursorMarker = "[kubetask: the log capture could not resume this log; the rest of the log is not archived]\n"

// Config configures Run. Client, Namespace, Pod, Container, Key, Logs and
// Progress are required.
type Config struct {
	// Client reads the log (pods/log).
	Client kubernetes.Interface
	// Namespace, Pod and Container name the container whose log is archived.
	Namespace, Pod, Container string
	// UID, when set, is the pod's (podlog.Config.UID). Optional.
	UID types.UID
	// Key is the log's key in the archive.
	Key store.LogKey
	// Nonce is the nonce of the record the log belongs to (the pod's
	// kubetask.dev/nonce annotation, store.LogAppend.Nonce): the archive
	// refuses the capture's writes once the task's record is another one,
	// and the capture then ends as it does for a record that is gone.
	// Optional ("" writes into whichever record has the ID).
	Nonce string
	// Logs is the archive.
	Logs store.Logs
	// Progress and Changed feed the follower (podlog.Config).
	Progress func() podlog.Progress
	Changed  <-chan struct{}
	// OnAppend is called after each chunk is durably archived (from Run's
	// goroutines, one call at a time) with the number of bytes the archive
	// grew by: to wake readers that follow the archive, and count. Optional;
	// it must not block.
	OnAppend func(n int64)
	// ChunkSize is the number of pending bytes that triggers a write
	// (default DefaultChunkSize).
	ChunkSize int
	// FlushInterval is the longest time read bytes wait before they are
	// written (default DefaultFlushInterval).
	FlushInterval time.Duration
	// GiveUpAfter is how long a capture goes on without archiving anything
	// new once the container has ended (or its pod is being deleted or gone)
	// before it ends the log as unreadable (default DefaultGiveUpAfter).
	GiveUpAfter time.Duration
	// Clock times flushes and the follower's waits (default: the real clock).
	Clock clock.Clock
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// chanMutex is a mutex made of a channel. The capture holds its lock
// across the archive's durable write (the flusher and a chunk's write), and
// a goroutine waiting for a channel is durably blocked where one waiting
// for a sync.Mutex is not: in a testing/synctest bubble (the simulator,
// whose store writes wait for the world's step), a reader waiting for the
// lock while the holder's write waits would keep the bubble from ever
// being idle.
type chanMutex struct {
	once sync.Once
	ch   chan struct{}
}

func (m *chanMutex) Lock() {
	m.once.Do(func() { m.ch = make(chan struct{}, 1) })
	m.ch <- struct{}{}
}

func (m *chanMutex) Unlock() { <-m.ch }

// capture is one Run.
type capture struct {
	cfg Config
	log *slog.Logger

	mu      chanMutex
	offset  int64     // the archived size: where the next chunk goes
	pending []byte    // read, not yet archived
	cursor  []byte    // the follower's cursor after pending's last byte
	moved   bool      // cursor differs from the archived one
	lastNew time.Time // when the follower last delivered bytes (or Run started)
	noAddr  int       // log requests in a row answered "no address for the node"
	gaveUp  string    // the marker of a log given up on (the follower was ended)
	err     error     // the first write error; the capture stops on it
	done    bool      // the archive said the log is complete
}

// Run archives the log until it is complete and returns nil then (also when
// it was complete already, or when its task record is gone). It returns
// ctx's error when ctx ended first, after archiving what it had read (with
// a bounded context of its own), and any other error when the archive failed:
// the caller runs it again, and the new run resumes where the archive ends.
func Run(ctx context.Context, cfg Config) error {
	switch {
	case cfg.Client == nil || cfg.Logs == nil || cfg.Progress == nil:
		return errors.New("logcapture: Config.Client, Logs and Progress are required")
	case cfg.Namespace == "" || cfg.Pod == "" || cfg.Container == "" || cfg.Key.TaskID == "":
		return errors.New("logcapture: Config.Namespace, Pod, Container and Key are required")
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = DefaultChunkSize
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = DefaultFlushInterval
	}
	if cfg.GiveUpAfter <= 0 {
		cfg.GiveUpAfter = DefaultGiveUpAfter
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &capture{cfg: cfg, log: cfg.Logger.With("task", cfg.Key.TaskID, "attempt", cfg.Key.Attempt, "container", cfg.Key.Container)}

	_, info, err := cfg.Logs.ReadLog(ctx, cfg.Key, 0, 0)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return fmt.Errorf("reading the archived log: %w", err)
	case info.Complete:
		return nil
	}
	c.offset = info.Size
	c.lastNew = cfg.Clock.Now()

	fctx, stop := context.WithCancel(ctx)
	defer stop()
	var f *podlog.Follower
	f, err = podlog.New(podlog.Config{
		Client: cfg.Client, Namespace: cfg.Namespace, Pod: cfg.Pod, Container: cfg.Container, UID: cfg.UID,
		Progress: cfg.Progress, Changed: cfg.Changed, Clock: cfg.Clock, Logger: cfg.Logger,
		PartialLines: true, Resume: info.Cursor,
		OnStreamError: func(err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			marker := nodeUnreachable(err)
			if marker == "" {
				c.noAddr = 0
				return
			}
			c.noAddr++
			if c.noAddr >= noAddressAnswers && ended(cfg.Progress()) && c.gaveUp == "" {
				c.gaveUp = marker
				stop()
			}
		},
		OnLine: func(l podlog.Line) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.pending = append(c.pending, l.Text...)
			if l.Newline {
				c.pending = append(c.pending, '\n')
			}
			c.cursor = f.AppendCursor(c.cursor[:0])
			c.moved = true
			c.lastNew = cfg.Clock.Now()
			c.noAddr = 0
			if len(c.pending) >= cfg.ChunkSize {
				c.writeLocked(fctx, false)
				if c.err != nil || c.done {
					stop()
				}
			}
		},
	})
	if errors.Is(err, podlog.ErrBadCursor) {
		c.log.Error("the archived log's resume position is unreadable; ending the log", "err", err)
		return c.finish(ctx, BadCursorMarker)
	}
	if err != nil {
		return err
	}

	// Flush what is pending at least every FlushInterval.
	flusherDone := make(chan struct{})
	go func() {
		defer close(flusherDone)
		for {
			timer := cfg.Clock.NewTimer(cfg.FlushInterval)
			select {
			case <-fctx.Done():
				timer.Stop()
				return
			case <-timer.C():
			}
			c.mu.Lock()
			if len(c.pending) > 0 {
				c.writeLocked(fctx, false)
				if c.err != nil || c.done {
					stop()
				}
			}
			if ended(cfg.Progress()) && cfg.Clock.Since(c.lastNew) >= cfg.GiveUpAfter && c.gaveUp == "" {
				c.gaveUp = UnreadableMarker(cfg.GiveUpAfter)
				stop()
			}
			c.mu.Unlock()
		}
	}()

	runErr := f.Run(fctx)
	stop()
	<-flusherDone

	c.mu.Lock()
	werr, done, gaveUp := c.err, c.done, c.gaveUp
	c.mu.Unlock()
	switch {
	case werr != nil:
		return werr
	case done:
		return nil
	case gaveUp != "" && ctx.Err() == nil:
		c.log.Warn("the node does not serve the rest of the log; ending it", "marker", strings.TrimSpace(gaveUp), "err", runErr)
		return c.finish(ctx, gaveUp)
	case runErr == nil:
		return c.finish(ctx, "")
	case errors.Is(runErr, podlog.ErrPodGone):
		c.log.Warn("the pod vanished before its log was read completely", "err", runErr)
		return c.finish(ctx, PodGoneMarker)
	}
	// ctx ended: archive what was read, with the cursor after it.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
	defer cancel()
	c.mu.Lock()
	if c.moved {
		c.writeLocked(wctx, false)
	}
	werr = c.err
	c.mu.Unlock()
	return errors.Join(runErr, werr)
}

// noAddressAnswers is how many log requests in a row must be answered "no
// address for the node" (once the container ended) before a capture gives
// up on the log.
const noAddressAnswers = 3

// nodeUnreachable returns the marker to end a log with when err is the API
// server's answer for a pod whose node it cannot ask for the log, which no
// retry changes: the node has no address it can reach the kubelet at
// (nodeutil.NoMatchError: "no preferred addresses found; known addresses:
// ..."), or the node object is gone (the node getter's NotFound, details
// kind "nodes": a deleted node, whose pods the pod garbage collector
// deletes). "" for any other answer.
func nodeUnreachable(err error) string {
	if err == nil {
		return ""
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) && st.Status().Reason == metav1.StatusReasonNotFound &&
		st.Status().Details != nil && st.Status().Details.Kind == "nodes" {
		return NodeGoneMarker
	}
	if strings.Contains(err.Error(), "no preferred addresses found") {
		return NoAddressMarker
	}
	return ""
}

// ended reports whether no instance of the container will write more: it
// terminated for good, or its pod is gone.
func ended(p podlog.Progress) bool { return p.Terminated || p.Gone }

// finish writes what is pending, then marker (on a line of its own) when
// given, and marks the log complete.
func (c *capture) finish(ctx context.Context, marker string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if marker != "" {
		if n := len(c.pending); (n > 0 && c.pending[n-1] != '\n') || (n == 0 && c.offset > 0 && !c.endsWithNewline(ctx)) {
			c.pending = append(c.pending, '\n')
		}
		c.pending = append(c.pending, marker...)
	}
	c.writeLocked(ctx, true)
	return c.err
}

// endsWithNewline reports whether the archived log ends with a newline (an
// unreadable one counts as yes: the marker then joins its last line).
func (c *capture) endsWithNewline(ctx context.Context) bool {
	b, _, err := c.cfg.Logs.ReadLog(ctx, c.cfg.Key, c.offset-1, 1)
	return err != nil || len(b) != 1 || b[0] == '\n'
}

// writeLocked appends the pending bytes and the cursor after them at the
// archived offset, marking the log complete when complete is set. c.mu is
// held. A log already complete or without a task record ends the capture
// (done); any other failure is kept in c.err.
func (c *capture) writeLocked(ctx context.Context, complete bool) {
	if c.err != nil || c.done {
		return
	}
	info, err := c.cfg.Logs.AppendLog(ctx, c.cfg.Key, store.LogAppend{
		Offset: c.offset, Data: c.pending, Cursor: c.cursor, Complete: complete, Nonce: c.cfg.Nonce})
	switch {
	case errors.Is(err, store.ErrLogComplete):
		c.log.Warn("the archived log was completed by another capture; stopping")
		c.done = true
		return
	case errors.Is(err, store.ErrNotFound):
		c.log.Info("the task's record is gone (retention), or is a later one of its ID; the log is not archived", "err", err)
		c.done = true
		return
	case err != nil:
		c.err = fmt.Errorf("archiving %d bytes of the log at offset %d: %w", len(c.pending), c.offset, err)
		return
	}
	grew := info.Size - c.offset
	c.offset = info.Size
	c.pending = c.pending[:0]
	c.moved = false
	c.done = complete
	if c.cfg.OnAppend != nil {
		c.cfg.OnAppend(grew)
	}
}
