package podlog

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxPrefix bounds the kubelet's timestamp prefix ("2006-01-02T15:04:05.000000000+07:00 ").
const maxPrefix = 40

// cursor is the position reached in a container's log, and the reader of the
// streams that continue from it.
//
// The position is the timestamp of the last line consumed (last), how many
// complete lines stamped exactly last were consumed (atLast), and, when the line
// after those is consumed only in part (open), how many of its bytes (offset).
// A stream opened with sinceTime = last repeats every line from last's second
// on; the cursor drops those it consumed: lines stamped before last, the first
// atLast lines stamped last, and the first offset bytes of the open line.
//
// Consumed bytes of the open line are held (not emitted) until its newline
// arrives, the log is known to be complete (flush), or maxLine bytes are held
// (or, with partial, until the stream has nothing more buffered).
//
// The position is updated before a Line is emitted, and the held bytes are
// cleared, so that during emit (and between two emits) the position minus the
// held bytes is exactly what was delivered: that is the resume cursor.
type cursor struct {
	container string
	maxLine   int
	partial   bool
	emit      func(Line)

	last   time.Time
	atLast int
	open   bool
	offset int
	held   []byte
}

// readResult says what one stream brought.
type readResult struct {
	// fresh: the stream carried something past the cursor (a byte or a newline).
	fresh bool
	// reached: the stream carried the cursor's position: the last line consumed
	// before it (repeated), or something fresh. A stream that ended cleanly
	// without reaching the cursor proves nothing about what follows it.
	reached bool
	// openSeen: the open line at the end of the stream is one this stream
	// carried (so the stream's log is the one whose last line it is).
	openSeen bool
}

// since is the sinceTime for the next stream; nil while nothing was consumed.
func (c *cursor) since() *metav1.Time {
	if c.last.IsZero() {
		return nil
	}
	t := metav1.NewTime(c.last)
	return &t
}

// emitHeld emits the held bytes of the open line; newline completes the line
// (the caller has already moved the position past it).
func (c *cursor) emitHeld(newline bool) {
	if len(c.held) == 0 && !newline {
		return
	}
	text := string(c.held)
	c.held = c.held[:0]
	c.emit(Line{Container: c.container, Time: c.last, Text: text, Newline: newline})
}

// idle emits the held bytes when partial lines are wanted and br has nothing
// more buffered: the next read may wait for the container.
func (c *cursor) idle(br *bufio.Reader) {
	if c.partial && br.Buffered() == 0 {
		c.emitHeld(false)
	}
}

// readChunk reads the next bytes of the current line: up to its newline
// (excluded; nl reports it), or as many as br holds (a full buffer, or with
// partial, what arrived so far). data is valid until the next read. err is
// the stream's end (io.EOF when clean); data may hold bytes before it.
func (c *cursor) readChunk(br *bufio.Reader) (data []byte, nl bool, err error) {
	if !c.partial {
		chunk, err := br.ReadSlice('\n')
		switch {
		case err == nil:
			return chunk[:len(chunk)-1], true, nil
		case errors.Is(err, bufio.ErrBufferFull):
			return chunk, false, nil
		}
		return chunk, false, err
	}
	// Deliver what is held before waiting for more, then take what arrived.
	c.idle(br)
	if _, err := br.Peek(1); err != nil {
		return nil, false, err
	}
	buf, _ := br.Peek(br.Buffered())
	if i := bytes.IndexByte(buf, '\n'); i >= 0 {
		_, _ = br.Discard(i + 1)
		return buf[:i], true, nil
	}
	_, _ = br.Discard(len(buf))
	return buf, false, nil
}

// flush emits the held bytes of the open line without a newline: the log it
// belongs to is complete, so the line ended without one. The line stays open:
// a stream that repeats it still skips its bytes.
func (c *cursor) flush() { c.emitHeld(false) }

// lineMode is what read does with the content of the current line.
type lineMode int

const (
	modeDrop    lineMode = iota // already consumed
	modeConsume                 // the open line (after skip bytes)
	modePass                    // an unstamped line: emitted whole, not tracked (so never fresh)
)

// read consumes one stream, read with timestamps=true and opened with
// sinceTime = c.since() (resumed tells whether it had one). It returns what the
// stream brought and the read error: nil at a clean end (io.EOF). Bytes read
// before an error are valid and consumed; an incomplete timestamp is not.
func (c *cursor) read(r io.Reader, resumed bool) (readResult, error) {
	var res readResult
	br := bufio.NewReaderSize(r, 64<<10)
	first := true
	// The stream repeats what was consumed before it from last's second on: the
	// first dupLeft lines stamped dupAt, then the open line (reopen).
	dupAt, dupLeft, reopen := c.last, c.atLast, c.open
	var pass []byte // an unstamped line, emitted whole
	for {
		// The start of a line: the kubelet's timestamp, or (only for the first line
		// of a resumed stream) the end of a line that began before sinceTime.
		c.idle(br)
		ts, pre, err := readPrefix(br)
		if err != nil {
			return res, endErr(err)
		}
		// marks: this line ends at the cursor's position (when dropped to its
		// newline, or consumed past skip).
		mode, skip, marks := modeDrop, 0, false
		switch {
		case ts.IsZero() && first && resumed:
			// The rest of a line split into records, whose first record was
			// before sinceTime: the kubelet serves it without timestamp. It lies
			// before the cursor's line.
		case ts.IsZero():
			mode = modePass
		case ts.Before(c.last):
		case ts.Equal(dupAt) && dupLeft > 0:
			dupLeft--
			marks = dupLeft == 0 && !reopen
		case ts.Equal(c.last) && reopen:
			reopen = false
			mode, skip, marks = modeConsume, c.offset, true
			res.openSeen = true
		default:
			// A new line. An open line that this stream did not repeat ended,
			// without a newline, in another log (the previous instance's).
			reopen = false
			c.flush()
			if !ts.Equal(c.last) {
				c.last, c.atLast = ts, 0
			}
			c.open, c.offset = true, 0
			mode = modeConsume
			res.fresh, res.reached, res.openSeen = true, true, true
		}
		first = false

		data, nl := pre, false
		if len(pre) > 0 && pre[len(pre)-1] == '\n' {
			data, nl = pre[:len(pre)-1], true
		}
		for {
			if mode == modePass {
				pass = append(pass, data...)
				if nl {
					c.emit(Line{Container: c.container, Text: string(pass), Newline: true})
					pass = pass[:0]
				}
			} else {
				c.content(mode, &skip, marks, data, nl, &res)
			}
			if nl {
				break
			}
			data, nl, err = c.readChunk(br)
			if err != nil {
				if mode == modePass {
					pass = append(pass, data...)
					if len(pass) > 0 {
						c.emit(Line{Container: c.container, Text: string(pass)})
					}
				} else {
					c.content(mode, &skip, marks, data, false, &res)
				}
				return res, endErr(err)
			}
		}
	}
}

// content handles bytes of the current line; nl: they end it.
func (c *cursor) content(mode lineMode, skip *int, marks bool, data []byte, nl bool, res *readResult) {
	if mode == modeDrop {
		res.reached = res.reached || (marks && nl)
		return
	}
	n := min(*skip, len(data))
	*skip -= n
	data = data[n:]
	res.reached = res.reached || (marks && *skip == 0)
	if len(data) > 0 {
		c.held = append(c.held, data...)
		c.offset += len(data)
		res.fresh = true
		if len(c.held) >= c.maxLine {
			c.emitHeld(false)
		}
	}
	if nl {
		c.atLast++
		c.open, c.offset = false, 0
		c.emitHeld(true)
		res.fresh = true
	}
}

// readPrefix reads the start of a line. When it is a timestamp followed by a
// space, it returns the time and no bytes; otherwise a zero time and the bytes
// read, which belong to the line (they end with '\n' if the line ended there).
func readPrefix(br *bufio.Reader) (time.Time, []byte, error) {
	var buf []byte
	for len(buf) < maxPrefix {
		b, err := br.ReadByte()
		if err != nil {
			if len(buf) > 0 && errors.Is(err, io.EOF) {
				// An incomplete prefix: not consumed (the stream was cut).
				err = io.ErrUnexpectedEOF
			}
			return time.Time{}, nil, err
		}
		buf = append(buf, b)
		switch b {
		case ' ':
			if ts, err := time.Parse(time.RFC3339Nano, string(buf[:len(buf)-1])); err == nil {
				return ts, nil, nil
			}
			return time.Time{}, buf, nil
		case '\n':
			return time.Time{}, buf, nil
		}
	}
	return time.Time{}, buf, nil
}

// endErr maps the end of a stream: io.EOF is a clean end.
func endErr(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
