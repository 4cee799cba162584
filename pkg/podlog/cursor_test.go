package podlog

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// ts gives the kubelet's timestamp of second s, nanosecond ns.
func ts(s, ns int) string {
	return time.Date(2026, 1, 2, 3, 4, s, ns, time.UTC).Format("2006-01-02T15:04:05.000000000Z07:00")
}

// brokenReader returns data, then a non-EOF error (a connection that broke).
type brokenReader struct{ r io.Reader }

func (b *brokenReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

// piece is an expected Line: its text, and "+nl" when it ended with a newline.
func piece(l Line) string {
	if l.Newline {
		return l.Text + "+nl"
	}
	return l.Text
}

// TestCursorRead feeds successive streams, as the kubelet serves them after a
// resume from the cursor's sinceTime (whole seconds), and checks what comes out:
// every line once, in order, whole, and whether it ended with a newline.
func TestCursorRead(t *testing.T) {
	long := strings.Repeat("x", 300<<10)
	for name, tc := range map[string]struct {
		// streams: the raw text of each stream; broken ones end with an error.
		streams []string
		broken  []bool
		// flush: the log is complete after the last stream.
		flush   bool
		maxLine int
		want    []string
		// fresh: what the last stream reported.
		fresh bool
	}{
		"one clean stream": {
			streams: []string{ts(1, 0) + " a\n" + ts(1, 5) + " b\n"},
			want:    []string{"a+nl", "b+nl"},
			fresh:   true,
		},
		"resume repeats the second of the last line": {
			streams: []string{
				ts(1, 100) + " a\n" + ts(2, 100) + " b\n",
				ts(2, 100) + " b\n" + ts(2, 200) + " c\n" + ts(3, 0) + " d\n",
			},
			broken: []bool{true, false},
			want:   []string{"a+nl", "b+nl", "c+nl", "d+nl"},
			fresh:  true,
		},
		"duplicates in the same second and the same nanosecond are counted, not merged": {
			streams: []string{
				ts(1, 7) + " x\n" + ts(1, 7) + " x\n",
				ts(1, 7) + " x\n" + ts(1, 7) + " x\n" + ts(1, 7) + " x\n" + ts(2, 0) + " y\n",
			},
			broken: []bool{true, false},
			want:   []string{"x+nl", "x+nl", "x+nl", "y+nl"},
			fresh:  true,
		},
		"a stream closed cleanly in the middle of a line: the line comes once, whole": {
			streams: []string{
				ts(1, 0) + " a\n" + ts(1, 9) + " hal",
				ts(1, 0) + " a\n" + ts(1, 9) + " half\n" + ts(1, 10) + " next\n",
			},
			want:  []string{"a+nl", "half+nl", "next+nl"},
			fresh: true,
		},
		"a broken stream in the middle of a line": {
			streams: []string{
				ts(1, 0) + " a\n" + ts(1, 9) + " hal",
				ts(1, 0) + " a\n" + ts(1, 9) + " half\n",
			},
			broken: []bool{true, false},
			want:   []string{"a+nl", "half+nl"},
			fresh:  true,
		},
		"cut right before the newline": {
			streams: []string{
				ts(1, 9) + " half",
				ts(1, 9) + " half\n",
			},
			want:  []string{"half+nl"},
			fresh: true, // the newline was new
		},
		"cut in the middle of the timestamp": {
			streams: []string{
				ts(1, 9) + " a\n" + ts(1, 10)[:12],
				ts(1, 9) + " a\n" + ts(1, 10) + " b\n",
			},
			broken: []bool{true, false},
			want:   []string{"a+nl", "b+nl"},
			fresh:  true,
		},
		"the unterminated last line of a complete log": {
			streams: []string{ts(1, 0) + " a\n" + ts(1, 5) + " no newline"},
			flush:   true,
			want:    []string{"a+nl", "no newline"},
			fresh:   true,
		},
		"a repeated stream brings nothing new": {
			streams: []string{
				ts(1, 0) + " a\n" + ts(1, 5) + " end",
				ts(1, 0) + " a\n" + ts(1, 5) + " end",
			},
			flush: true,
			want:  []string{"a+nl", "end"},
			fresh: false,
		},
		"a line over 16 KiB comes whole": {
			streams: []string{ts(1, 0) + " " + long + "\n"},
			want:    []string{long + "+nl"},
			fresh:   true,
		},
		"a line over MaxLineBytes comes in pieces, across a break": {
			streams: []string{
				ts(1, 0) + " 0123456",
				ts(1, 0) + " 0123456789\n" + ts(2, 0) + " z\n",
			},
			broken:  []bool{true, false},
			maxLine: 4,
			// Pieces are cut where the reader's chunks end, at least maxLine bytes.
			want:  []string{"0123456", "789+nl", "z+nl"},
			fresh: true,
		},
		"the rest of a line begun before sinceTime is dropped": {
			// The first stream delivered b (second 2); the resumed stream starts at
			// second 2, within line a, which the kubelet serves without timestamp.
			streams: []string{
				ts(1, 900) + " aaaa\n" + ts(2, 100) + " b\n",
				"aa\n" + ts(2, 100) + " b\n" + ts(2, 200) + " c\n",
			},
			broken: []bool{true, false},
			want:   []string{"aaaa+nl", "b+nl", "c+nl"},
			fresh:  true,
		},
		"earlier lines of a resumed stream are dropped": {
			streams: []string{
				ts(5, 500) + " e\n",
				ts(5, 100) + " d\n" + ts(5, 500) + " e\n" + ts(6, 0) + " f\n",
			},
			broken: []bool{true, false},
			want:   []string{"e+nl", "f+nl"},
			fresh:  true,
		},
		"several breaks": {
			streams: []string{
				ts(1, 1) + " 1\n",
				ts(1, 1) + " 1\n" + ts(1, 2) + " 2\n",
				ts(1, 1) + " 1\n" + ts(1, 2) + " 2\n" + ts(1, 2) + " 2b\n",
				ts(1, 1) + " 1\n" + ts(1, 2) + " 2\n" + ts(1, 2) + " 2b\n" + ts(2, 0) + " 3\n",
			},
			broken: []bool{true, true, true, false},
			want:   []string{"1+nl", "2+nl", "2b+nl", "3+nl"},
			fresh:  true,
		},
		"text keeps its bytes: spaces, CR, UTF-8, invalid UTF-8, empty lines": {
			streams: []string{ts(1, 0) + "   indented \r text \n" + ts(1, 1) + " \n" + ts(1, 2) + " \rétoile ✓ \xff\r\n"},
			want:    []string{"  indented \r text +nl", "+nl", "\rétoile ✓ \xff\r+nl"},
			fresh:   true,
		},
		"a line without a timestamp in a first stream passes through": {
			streams: []string{"garbage line\n"},
			want:    []string{"garbage line+nl"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var got []Line
			c := cursor{container: "c", maxLine: DefaultMaxLineBytes, emit: func(l Line) { got = append(got, l) }}
			if tc.maxLine > 0 {
				c.maxLine = tc.maxLine
			}
			var res readResult
			for i, s := range tc.streams {
				var r io.Reader = strings.NewReader(s)
				broken := i < len(tc.broken) && tc.broken[i]
				if broken {
					r = &brokenReader{r}
				}
				var err error
				res, err = c.read(r, c.since() != nil)
				if broken != (err != nil) {
					t.Fatalf("stream %d: err %v, broken %v", i, err, broken)
				}
			}
			if tc.flush && res.openSeen {
				c.flush()
			}
			var pieces []string
			for _, l := range got {
				pieces = append(pieces, piece(l))
			}
			if d := cmp.Diff(tc.want, pieces); d != "" {
				t.Errorf("lines (-want +got):\n%s", d)
			}
			if res.fresh != tc.fresh {
				t.Errorf("last stream fresh = %v, want %v", res.fresh, tc.fresh)
			}
		})
	}
}

func TestCursorSince(t *testing.T) {
	var c cursor
	c.emit = func(Line) {}
	c.maxLine = DefaultMaxLineBytes
	if c.since() != nil {
		t.Fatal("the first stream must start without sinceTime")
	}
	if _, err := c.read(strings.NewReader(ts(5, 999)+" a\n"), false); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 999, time.UTC)
	if got := c.since(); got == nil || !got.Time.Equal(at) {
		t.Fatalf("since %v, want %v", got, at)
	}
}

func TestLineTime(t *testing.T) {
	var got []Line
	c := cursor{container: "c", maxLine: DefaultMaxLineBytes, emit: func(l Line) { got = append(got, l) }}
	if _, err := c.read(strings.NewReader(ts(7, 42)+" a\n"), false); err != nil {
		t.Fatal(err)
	}
	want := []Line{{Container: "c", Time: time.Date(2026, 1, 2, 3, 4, 7, 42, time.UTC), Text: "a", Newline: true}}
	if d := cmp.Diff(want, got); d != "" {
		t.Error(d)
	}
}
