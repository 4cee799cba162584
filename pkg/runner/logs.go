package runner

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// LogLine is one line a container wrote, without its trailing newline.
type LogLine struct {
	// Container is the container's name.
	Container string
	// Time is the kubelet's timestamp for the line (zero when it had none).
	Time time.Time
	// Text is the line.
	Text string
}

// cursor is the resume point of one container's log: the timestamp of the last
// line delivered and how many delivered lines carried exactly that timestamp.
//
// The API's sinceTime has one-second resolution, so a resumed stream repeats
// lines from the second of the last delivered line; cursor drops exactly those
// it already delivered: every line stamped before the last one, and the first
// atLast lines stamped equal to it (lines written in the same nanosecond keep
// their order in the log file).
type cursor struct {
	last   time.Time
	atLast int
	skip   int // lines stamped == last still to drop in the current stream
}

// restart is called when a new stream (from since()) begins.
func (c *cursor) restart() { c.skip = c.atLast }

// accept reports whether a line stamped ts in the current stream is new, and
// records it as delivered if so.
func (c *cursor) accept(ts time.Time) bool {
	switch {
	case ts.IsZero():
		return true
	case ts.Before(c.last):
		return false
	case ts.Equal(c.last):
		if c.skip > 0 {
			c.skip--
			return false
		}
		c.atLast++
		return true
	default:
		c.last, c.atLast, c.skip = ts, 1, 0
		return true
	}
}

// since is the sinceTime for the next stream; nil for the first.
func (c *cursor) since() *metav1.Time {
	if c.last.IsZero() {
		return nil
	}
	t := metav1.NewTime(c.last)
	return &t
}

// splitTimestamp splits a line of a log read with timestamps=true into the
// kubelet's RFC3339Nano timestamp and the text. A line without a parsable
// timestamp is returned whole with a zero time.
func splitTimestamp(line string) (time.Time, string) {
	i := indexByte(line, ' ')
	if i <= 0 {
		return time.Time{}, line
	}
	ts, err := time.Parse(time.RFC3339Nano, line[:i])
	if err != nil {
		return time.Time{}, line
	}
	return ts, line[i+1:]
}

func indexByte(s string, b byte) int {
	for i := 0; i < len(s) && i < 64; i++ {
		if s[i] == b {
			return i
		}
	}
	return -1
}

// readLines reads one stream, passing every new line (per c) to emit. A final
// line without a newline is emitted only when the stream ended cleanly (io.EOF);
// after a broken stream it is dropped and read again on resume.
func readLines(r io.Reader, c *cursor, emit func(ts time.Time, text string)) error {
	c.restart()
	br := bufio.NewReaderSize(r, 64<<10)
	process := func(text string) {
		ts, body := splitTimestamp(text)
		if c.accept(ts) {
			emit(ts, body)
		}
	}
	for {
		line, err := br.ReadString('\n')
		switch {
		case err == nil:
			process(line[:len(line)-1])
		case errors.Is(err, io.EOF):
			if line != "" {
				process(line)
			}
			return nil
		default:
			return err
		}
	}
}

// follower streams the log of one container of a pod, resuming broken streams.
type follower struct {
	client    kubernetes.Interface
	namespace string
	pod       string
	container string
	// state reports what the runner last saw of the container: started (its log
	// exists) and terminated (it will not write more), and whether the pod is gone.
	state func() (started, terminated, gone bool)
	// changed is signalled (never closed) when the pod changed.
	changed <-chan struct{}
	after   func(time.Duration) <-chan time.Time
	emit    func(LogLine)
	debug   func(msg string, args ...any)

	cur cursor
}

// run streams until the container terminated and its whole log was read, the
// pod is gone, or ctx ends.
func (f *follower) run(ctx context.Context) {
	backoff := 200 * time.Millisecond
	for {
		started, terminated, gone := f.state()
		if gone {
			return
		}
		if !started {
			if !f.wait(ctx, time.Second) {
				return
			}
			continue
		}
		// A stream opened after the container terminated reads its log to the end:
		// when it ends cleanly, nothing is left.
		complete := terminated
		err := f.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil && complete:
			return
		case err == nil:
			// The stream ended: the container exited (the pod status may lag) or
			// the connection was closed cleanly. Read again from the cursor.
			f.debug("log stream ended before the container terminated; resuming", "container", f.container, "since", f.cur.last)
			backoff = 200 * time.Millisecond
			if !f.wait(ctx, 500*time.Millisecond) {
				return
			}
		case apierrors.IsNotFound(err):
			f.debug("log stream: pod or container not found", "container", f.container, "err", err)
			if !f.wait(ctx, backoff) {
				return
			}
		default:
			f.debug("log stream broke; resuming", "container", f.container, "since", f.cur.last, "err", err)
			if !f.wait(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// wait waits for a pod change or d; false when ctx ended.
func (f *follower) wait(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-f.changed:
	case <-f.after(d):
	}
	return true
}

func (f *follower) stream(ctx context.Context) error {
	req := f.client.CoreV1().Pods(f.namespace).GetLogs(f.pod, &corev1.PodLogOptions{
		Container:  f.container,
		Follow:     true,
		Timestamps: true,
		SinceTime:  f.cur.since(),
	})
	rc, err := req.Stream(ctx)
	if err != nil {
		return fmt.Errorf("opening log of %s/%s[%s]: %w", f.namespace, f.pod, f.container, err)
	}
	defer rc.Close()
	return readLines(rc, &f.cur, func(ts time.Time, text string) {
		f.emit(LogLine{Container: f.container, Time: ts, Text: text})
	})
}

// tail keeps the last n lines written.
type tail struct {
	mu    sync.Mutex
	n     int
	lines []string
}

func (t *tail) add(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, s)
	if len(t.lines) > t.n {
		t.lines = t.lines[len(t.lines)-t.n:]
	}
}

func (t *tail) get() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.lines...)
}

// lastLines fetches the last n lines of a container's log (for failures when the
// log was not streamed).
func lastLines(ctx context.Context, client kubernetes.Interface, ns, pod, container string, n int64) ([]string, error) {
	b, err := client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, TailLines: &n}).DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimRight(b, "\n")
	if len(b) == 0 {
		return nil, nil
	}
	var out []string
	for _, l := range bytes.Split(b, []byte("\n")) {
		out = append(out, string(l))
	}
	return out, nil
}
