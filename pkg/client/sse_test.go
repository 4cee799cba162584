package client

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSSEReader(t *testing.T) {
	for name, tc := range map[string]struct {
		stream string
		want   []sseEvent
		// lastID is the last event ID once the stream is read.
		lastID string
	}{
		"the server's format": {
			stream: "id: c-1\nevent: Bookmark\ndata: {}\n\n: heartbeat\n\nid: c-2\nevent: State\ndata: {\"a\":1}\n\n",
			want:   []sseEvent{{ID: "c-1", Type: "Bookmark", Data: "{}"}, {ID: "c-2", Type: "State", Data: `{"a":1}`}},
			lastID: "c-2",
		},
		"CRLF and lone CR line ends": {
			stream: "id: 1\r\ndata: a\r\n\r\nid: 2\rdata: b\r\r",
			want:   []sseEvent{{ID: "1", Type: "message", Data: "a"}, {ID: "2", Type: "message", Data: "b"}},
			lastID: "2",
		},
		"data lines join with LF; no space after the colon": {
			stream: "data:one\ndata: two\ndata\n\n",
			want:   []sseEvent{{Type: "message", Data: "one\ntwo\n"}},
		},
		"an id without data moves the last ID but dispatches nothing": {
			stream: "id: 7\n\ndata: x\n\n",
			want:   []sseEvent{{ID: "7", Type: "message", Data: "x"}},
			lastID: "7",
		},
		"an event without id keeps the previous one": {
			stream: "id: 7\ndata: a\n\ndata: b\n\n",
			want:   []sseEvent{{ID: "7", Type: "message", Data: "a"}, {ID: "7", Type: "message", Data: "b"}},
			lastID: "7",
		},
		"an empty id resets it": {
			stream: "id: 7\ndata: a\n\nid\ndata: b\n\n",
			want:   []sseEvent{{ID: "7", Type: "message", Data: "a"}, {ID: "", Type: "message", Data: "b"}},
		},
		"an id with NUL is ignored": {
			stream: "id: 7\ndata: a\n\nid: 8\x00\ndata: b\n\n",
			want:   []sseEvent{{ID: "7", Type: "message", Data: "a"}, {ID: "7", Type: "message", Data: "b"}},
			lastID: "7",
		},
		"unknown fields and retry are ignored": {
			stream: "retry: 10\nfoo: bar\nevent: E\ndata: d\n\n",
			want:   []sseEvent{{Type: "E", Data: "d"}},
		},
		"a leading BOM is skipped": {
			stream: "\xEF\xBB\xBFdata: d\n\n",
			want:   []sseEvent{{Type: "message", Data: "d"}},
		},
		"an event cut before its blank line is dropped, its id too": {
			stream: "id: 1\ndata: a\n\nid: 2\nevent: State\ndata: b\n",
			want:   []sseEvent{{ID: "1", Type: "message", Data: "a"}},
			lastID: "1",
		},
		"a line cut in the middle is dropped": {
			stream: "id: 1\ndata: a\n\nid: 2",
			want:   []sseEvent{{ID: "1", Type: "message", Data: "a"}},
			lastID: "1",
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := newSSEReader(strings.NewReader(tc.stream))
			var got []sseEvent
			var err error
			for {
				var ev sseEvent
				if ev, err = r.Next(); err != nil {
					break
				}
				got = append(got, ev)
			}
			if !errors.Is(err, io.EOF) {
				t.Fatalf("end: %v, want EOF", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			if r.LastEventID() != tc.lastID {
				t.Errorf("last event ID %q, want %q", r.LastEventID(), tc.lastID)
			}
		})
	}
}

func TestSSEReaderRefusesHugeLines(t *testing.T) {
	r := newSSEReader(strings.NewReader("data: " + strings.Repeat("x", maxSSELine+1) + "\n\n"))
	if _, err := r.Next(); !errors.Is(err, errLineTooLong) {
		t.Fatalf("got %v, want %v", err, errLineTooLong)
	}
}
