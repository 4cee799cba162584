package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
)

// sseEvent is one dispatched Server-Sent Event.
type sseEvent struct {
	// ID is the stream's last event ID when the event was dispatched: the
	// event's own id field, or the last one before it.
	ID   string
	Type string // "message" when the event named none
	Data string
}

// maxSSELine bounds a line of an event stream (an event is one JSON line).
const maxSSELine = 4 << 20

// sseReader parses an event stream as the HTML standard's EventSource does
// (https://html.spec.whatwg.org/multipage/server-sent-events.html): lines end
// with LF, CRLF or CR; a leading BOM is skipped; comments are skipped; data
// lines join with LF; an id field sets the last event ID, which takes effect
// when the event is dispatched (at its blank line), so that an event cut
// before its end changes nothing; an event without data is not dispatched
// (but its id counts). retry fields are ignored: the client has its own
// backoff.
type sseReader struct {
	r       *bufio.Reader
	started bool // the BOM check was done
	skipLF  bool // the last line ended with CR: an LF next belongs to it
	line    []byte

	lastID string // the stream's last event ID (dispatched)
	idBuf  string
	event  string
	data   strings.Builder
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 32<<10)}
}

// LastEventID returns the id in effect after the last dispatch (the cursor to
// resume from).
func (s *sseReader) LastEventID() string { return s.lastID }

// Next returns the next event. At the end of the stream it returns the
// reader's error (io.EOF for a clean end); a partly read event is dropped.
func (s *sseReader) Next() (sseEvent, error) {
	for {
		line, err := s.readLine()
		if err != nil {
			return sseEvent{}, err
		}
		if len(line) == 0 {
			s.lastID = s.idBuf
			if s.data.Len() == 0 {
				s.event = ""
				continue
			}
			ev := sseEvent{ID: s.lastID, Type: s.event, Data: strings.TrimSuffix(s.data.String(), "\n")}
			if ev.Type == "" {
				ev.Type = "message"
			}
			s.event = ""
			s.data.Reset()
			return ev, nil
		}
		if line[0] == ':' {
			continue // a comment: a heartbeat
		}
		name, value, found := bytes.Cut(line, []byte(":"))
		if found {
			value = bytes.TrimPrefix(value, []byte(" "))
		}
		switch string(name) {
		case "event":
			s.event = string(value)
		case "data":
			s.data.Write(value)
			s.data.WriteByte('\n')
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				s.idBuf = string(value)
			}
		}
	}
}

var errLineTooLong = errors.New("event stream line too long")

// readLine returns the next line without its end. A line cut by the end of
// the stream is an error (the event it belongs to is incomplete).
func (s *sseReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		b, err := s.r.ReadByte()
		if err != nil {
			return nil, err
		}
		if !s.started {
			s.started = true
			// A UTF-8 BOM at the start of the stream is skipped.
			if b == 0xEF {
				if bom, err := s.r.Peek(2); err == nil && bom[0] == 0xBB && bom[1] == 0xBF {
					_, _ = s.r.Discard(2)
					continue
				}
			}
		}
		if s.skipLF {
			s.skipLF = false
			if b == '\n' {
				continue
			}
		}
		switch b {
		case '\n':
			return s.line, nil
		case '\r':
			s.skipLF = true
			return s.line, nil
		}
		if len(s.line) >= maxSSELine {
			return nil, fmt.Errorf("%w (over %d bytes)", errLineTooLong, maxSSELine)
		}
		s.line = append(s.line, b)
	}
}
