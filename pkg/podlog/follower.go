package podlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// Line is a line of a container's log, or a piece of one.
//
// Writing Text, then a newline if Newline is set, for every Line in the order
// received reproduces the log. A Line without Newline is the last line of a
// log that ended without a newline, or a piece of a line longer than
// Config.MaxLineBytes (the next Line continues it, with the same Time).
type Line struct {
	// Container is the container's name.
	Container string
	// Time is the kubelet's timestamp of the line's start; zero for a line the
	// kubelet served without one (it does not, with timestamps=true).
	Time time.Time
	// Text is the line's content, without its newline. It is not necessarily
	// valid UTF-8: it holds the bytes the container wrote.
	Text string
	// Newline reports whether the line ended with a newline (after Text).
	Newline bool
}

// Progress is what the caller last saw of the container, typically in an
// informer's cache. It may lag behind the node; the follower relies on it only
// to know when to start reading and when a clean end of a stream may be the end
// of the log. ProgressOf computes it from a pod.
type Progress struct {
	// Started: an instance of the container has started, so it has a log.
	Started bool
	// Terminated: the container has terminated for good; no instance will write
	// more (the pod has a final phase, or the container exited and will not be
	// restarted).
	Terminated bool
	// RestartCount is the container's restart count.
	RestartCount int32
	// Gone: the pod is not in the caller's view (deleted, or not seen yet). The
	// follower confirms it with a GET before it gives up, and follows the pod it
	// finds meanwhile: a cache may lag behind a pod just created.
	Gone bool
	// NeverRestarts: the pod's spec says the container is never restarted,
	// whatever its exit (no restart rules, its restart policy or the pod's
	// Never), so it has one instance and no previous instance's log: the
	// follower does not ask for one. False (not known) is always safe.
	NeverRestarts bool
}

// ErrPodGone is returned by Run when the pod disappeared (Progress said Gone and
// the API server answered NotFound) before the container's log was known to be
// complete: what the follower had not read is lost.
var ErrPodGone = errors.New("pod gone before its log was read completely")

// DefaultMaxLineBytes is the default Config.MaxLineBytes.
const DefaultMaxLineBytes = 1 << 20

// Config configures a Follower. Client, Namespace, Pod, Container, Progress and
// OnLine are required.
type Config struct {
	// Client reads the log (pods/log).
	Client kubernetes.Interface
	// Namespace, Pod and Container name the container whose log is followed.
	Namespace, Pod, Container string
	// UID, when set, is the pod's: a pod of the name with another UID, read
	// live once Progress says Gone, is not this one, which is gone
	// (ErrPodGone). Optional.
	UID types.UID
	// Progress reports the container's progress as last seen; it is called
	// before each stream is opened and must not block.
	Progress func() Progress
	// Changed is signalled (never closed) when the pod changed, so the follower
	// re-reads Progress at once instead of after a delay. Optional.
	Changed <-chan struct{}
	// Clock times the waits between streams (default: the real clock).
	Clock clock.Clock
	// OnLine receives the log, one call at a time, from Run's goroutine.
	OnLine func(Line)
	// Logger receives debug messages about streams that end and resume
	// (default: slog.Default()).
	Logger *slog.Logger
	// MaxLineBytes bounds the bytes of one line held back while waiting for its
	// newline; a longer line is delivered in pieces (default DefaultMaxLineBytes).
	MaxLineBytes int
	// PartialLines delivers the bytes of a line in progress whenever the
	// follower has read all it received, instead of holding them until the
	// newline: Lines then come in pieces wherever the stream paused, and no
	// byte waits in the follower for the rest of its line. For archives;
	// printers want whole lines.
	PartialLines bool
	// OnStreamError, when set, is called (from Run's goroutine) with each
	// error of a log request or stream the follower retries: for callers
	// that tell a passing error from one that will not pass. Optional.
	OnStreamError func(error)
	// Resume is a Cursor of an earlier follower of the same container: this
	// follower delivers what comes after it (see Cursor). Empty: from the
	// beginning of the log. A cursor this version cannot read makes New fail
	// with ErrBadCursor.
	Resume []byte
}

// Follower follows the log of one container. Create it with New, run it once
// with Run.
type Follower struct {
	cfg Config
	cur cursor
	// open opens a log stream; the client's by default, replaced in tests.
	open func(ctx context.Context, opts *corev1.PodLogOptions) (io.ReadCloser, error)
	// opened: a stream of the current instance was opened before, or the
	// follower resumed from a position: the container may have restarted
	// since, so the previous instance's log is read first.
	opened bool
}

// confirmations is how many streams in a row must show the end of a log (end
// cleanly, nothing new) before the follower believes it: a stream the API server
// closed cleanly exactly there looks the same, and the request after such a
// close fails or brings the rest.
const confirmations = 2

// Backoff between failed attempts to open or read a stream.
const (
	minBackoff = 200 * time.Millisecond
	maxBackoff = 2 * time.Second
	// notStartedPoll is how often Progress is re-read while the container has not
	// started (Changed wakes the follower earlier).
	notStartedPoll = time.Second
	// endedPoll is the wait after a stream ended cleanly while the container
	// runs: it exited and its status is on its way, or the stream was closed.
	endedPoll = 500 * time.Millisecond
	// unreachedEnds is how many streams in a row, opened after the container
	// terminated for good, may end cleanly without anything new and without
	// repeating the last line delivered before the follower concludes that
	// the node no longer has that line (rotated away, or in an instance older
	// than the previous one) and that the log has nothing after it.
	unreachedEnds = 10
)

// New validates cfg, applies its defaults and returns a Follower. It fails
// with ErrBadCursor (wrapped) when cfg.Resume is not a valid cursor.
func New(cfg Config) (*Follower, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("podlog: Config.Client is required")
	case cfg.Namespace == "" || cfg.Pod == "" || cfg.Container == "":
		return nil, errors.New("podlog: Config.Namespace, Pod and Container are required")
	case cfg.Progress == nil:
		return nil, errors.New("podlog: Config.Progress is required")
	case cfg.OnLine == nil:
		return nil, errors.New("podlog: Config.OnLine is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxLineBytes <= 0 {
		cfg.MaxLineBytes = DefaultMaxLineBytes
	}
	f := &Follower{cfg: cfg}
	f.cur = cursor{container: cfg.Container, maxLine: cfg.MaxLineBytes, partial: cfg.PartialLines, emit: cfg.OnLine}
	if err := f.cur.decodePosition(cfg.Resume); err != nil {
		return nil, err
	}
	f.opened = !f.cur.last.IsZero()
	f.open = func(ctx context.Context, opts *corev1.PodLogOptions) (io.ReadCloser, error) {
		return cfg.Client.CoreV1().Pods(cfg.Namespace).GetLogs(cfg.Pod, opts).Stream(ctx)
	}
	return f, nil
}

// Cursor returns the follower's resume cursor: the position right after the
// last byte delivered to OnLine. A follower created with it as Config.Resume
// delivers exactly the bytes that this one would deliver after that point
// (see the package documentation). Call it from OnLine or after Run
// returned, not concurrently with Run otherwise.
func (f *Follower) Cursor() []byte { return f.cur.appendPosition(nil) }

// AppendCursor appends the resume cursor (as Cursor returns it) to b and
// returns the extended slice: for callers that keep the cursor of every
// line without allocating. The same calling rules as Cursor apply.
func (f *Follower) AppendCursor(b []byte) []byte { return f.cur.appendPosition(b) }

// Run follows the log until it is complete, and returns nil then: the container
// terminated for good, and two streams opened afterwards ended cleanly with
// nothing new after repeating the last line delivered (or, when the node no
// longer has that line, several such streams in a row: see Limits in the
// package documentation). It returns ErrPodGone
// when the pod disappeared first, and ctx's error when ctx ended first. A line
// held back waiting for its newline is delivered (without Newline) before Run
// returns, so a caller that prints the log waits for Run to return. Run may be
// called once.
func (f *Follower) Run(ctx context.Context) error {
	defer f.cur.flush()
	log := f.cfg.Logger.With("pod", f.cfg.Namespace+"/"+f.cfg.Pod, "container", f.cfg.Container)
	backoff := minBackoff
	ends := 0      // passes in a row that showed the end of the log
	unreached := 0 // clean passes in a row, after the end, that did not find the cursor
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		p := f.cfg.Progress()
		if p.Gone {
			live, err := f.cfg.Client.CoreV1().Pods(f.cfg.Namespace).Get(ctx, f.cfg.Pod, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err), err == nil && f.cfg.UID != "" && live.UID != f.cfg.UID:
				return ErrPodGone
			case err != nil:
				if ctx.Err() != nil {
					return ctx.Err()
				}
				log.Debug("pod not in the cache and not readable; retrying", "err", err)
				if !f.wait(ctx, backoff) {
					return ctx.Err()
				}
				backoff = min(2*backoff, maxBackoff)
				continue
			}
			p = ProgressOf(live, f.cfg.Container)
		}
		if !p.Started {
			if p.Terminated {
				return nil // it never ran and never will: an empty log
			}
			if !f.wait(ctx, notStartedPoll) {
				return ctx.Err()
			}
			continue
		}
		end, fresh, err := f.pass(ctx, p)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if end {
			ends++
		} else {
			ends = 0
		}
		if err == nil && p.Terminated && !end && !fresh {
			unreached++
		} else {
			unreached = 0
		}
		switch {
		case end && ends >= confirmations:
			return nil
		case unreached >= unreachedEnds:
			log.Debug("log streams end without the last line delivered; the node no longer has it", "since", f.cur.last)
			return nil
		case err == nil:
			backoff = minBackoff
			if p.Terminated && (end || fresh) {
				// Read again, at once: to the end of the log, or to confirm it.
				continue
			}
			if p.Terminated {
				// Closed before it repeated the last line delivered.
				log.Debug("log stream ended early; resuming", "since", f.cur.last)
				if !f.wait(ctx, backoff) {
					return ctx.Err()
				}
				continue
			}
			log.Debug("log stream ended before the container terminated; resuming", "since", f.cur.last)
			if !f.wait(ctx, endedPoll) {
				return ctx.Err()
			}
		case apierrors.IsNotFound(err):
			f.streamError(err)
			log.Debug("log stream: pod or container not found", "err", err)
			if !f.wait(ctx, backoff) {
				return ctx.Err()
			}
		default:
			f.streamError(err)
			log.Debug("log stream broke; resuming", "since", f.cur.last, "err", err)
			if !f.wait(ctx, backoff) {
				return ctx.Err()
			}
			backoff = min(2*backoff, maxBackoff)
		}
	}
}

func (f *Follower) streamError(err error) {
	if f.cfg.OnStreamError != nil {
		f.cfg.OnStreamError(err)
	}
}

// pass reads what the previous instance wrote after the cursor, then streams
// the current instance from the cursor. end: the container had terminated for
// good before the stream was opened (p), and the stream ended cleanly without
// anything new after repeating the cursor's line: the end of the log, unless
// the stream was closed exactly there.
func (f *Follower) pass(ctx context.Context, p Progress) (end, fresh bool, err error) {
	// A container may have restarted since the last stream, also when p does
	// not say so yet: the rest of its previous instance comes first. One
	// that is never restarted has no previous instance.
	inPrevious := false
	if f.opened && !p.NeverRestarts || p.RestartCount > 0 {
		if inPrevious, err = f.readPrevious(ctx); err != nil {
			return false, false, err
		}
	}
	since := f.cur.since()
	rc, err := f.open(ctx, &corev1.PodLogOptions{Container: f.cfg.Container, Follow: true, Timestamps: true, SinceTime: since})
	if err != nil {
		return false, false, fmt.Errorf("opening log of %s/%s[%s]: %w", f.cfg.Namespace, f.cfg.Pod, f.cfg.Container, err)
	}
	f.opened = true
	defer rc.Close()
	res, err := f.cur.read(rc, since != nil)
	if err != nil {
		return false, res.fresh, fmt.Errorf("reading log of %s/%s[%s]: %w", f.cfg.Namespace, f.cfg.Pod, f.cfg.Container, err)
	}
	// A stream cut cleanly before it repeated the cursor's line proves nothing
	// (when nothing was ever read, there is no line to repeat; when the
	// cursor's line is in the previous instance's log, this log never repeats
	// it).
	return p.Terminated && !res.fresh && (res.reached || inPrevious || f.cur.last.IsZero()), res.fresh, nil
}

// readPrevious reads the previous instance's log from the cursor until reads
// end cleanly with nothing new (confirmations in a row): then that log is
// complete, and its unterminated last line, if the cursor holds it, is
// delivered. holds: the last read repeated the cursor's line, so the cursor
// is in that log. No previous instance is not an error.
func (f *Follower) readPrevious(ctx context.Context) (holds bool, err error) {
	for ends := 0; ; {
		since := f.cur.since()
		rc, err := f.open(ctx, &corev1.PodLogOptions{Container: f.cfg.Container, Previous: true, Timestamps: true, SinceTime: since})
		if apierrors.IsBadRequest(err) {
			// "previous terminated container ... not found": it never restarted.
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("opening previous log of %s/%s[%s]: %w", f.cfg.Namespace, f.cfg.Pod, f.cfg.Container, err)
		}
		res, err := f.cur.read(rc, since != nil)
		rc.Close()
		if err != nil {
			return false, fmt.Errorf("reading previous log of %s/%s[%s]: %w", f.cfg.Namespace, f.cfg.Pod, f.cfg.Container, err)
		}
		if res.fresh {
			ends = 0
			continue
		}
		if ends++; ends < confirmations {
			continue
		}
		if res.openSeen {
			f.cur.flush()
		}
		return res.reached, nil
	}
}

// wait waits for a pod change or d; false when ctx ended.
func (f *Follower) wait(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-f.cfg.Changed:
	case <-f.cfg.Clock.After(d):
	}
	return true
}
