package runner

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// ts gives the timestamp of second s, nanosecond ns.
func ts(s, ns int) string {
	return time.Date(2026, 1, 2, 3, 4, s, ns, time.UTC).Format(time.RFC3339Nano)
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

// TestResume feeds successive streams (as the API returns them after a resume
// from the cursor's sinceTime, floored to the second) and checks that exactly
// the lines of the log, in order and once each, come out.
func TestResume(t *testing.T) {
	for name, tc := range map[string]struct {
		// streams: each is the raw text of one stream; broken streams end without EOF.
		streams []string
		broken  []bool
		want    []string
	}{
		"one clean stream": {
			streams: []string{ts(1, 0) + " a\n" + ts(1, 5) + " b\n"},
			want:    []string{"a", "b"},
		},
		"resume repeats the second of the last line": {
			streams: []string{
				ts(1, 100) + " a\n" + ts(2, 100) + " b\n",
				ts(2, 100) + " b\n" + ts(2, 200) + " c\n" + ts(3, 0) + " d\n",
			},
			broken: []bool{true, false},
			want:   []string{"a", "b", "c", "d"},
		},
		"lines with the same timestamp are counted, not merged": {
			streams: []string{
				ts(1, 7) + " x\n" + ts(1, 7) + " x\n",
				ts(1, 7) + " x\n" + ts(1, 7) + " x\n" + ts(1, 7) + " x\n" + ts(2, 0) + " y\n",
			},
			broken: []bool{true, false},
			want:   []string{"x", "x", "x", "y"},
		},
		"a partial last line of a broken stream is read again": {
			streams: []string{
				ts(1, 0) + " a\n" + ts(1, 9) + " hal",
				ts(1, 0) + " a\n" + ts(1, 9) + " half\n",
			},
			broken: []bool{true, false},
			want:   []string{"a", "half"},
		},
		"a partial last line of a clean stream is kept": {
			streams: []string{ts(1, 0) + " no newline"},
			want:    []string{"no newline"},
		},
		"earlier lines of a resumed stream are dropped": {
			streams: []string{
				ts(5, 500) + " e\n",
				ts(5, 100) + " d\n" + ts(5, 500) + " e\n" + ts(6, 0) + " f\n",
			},
			broken: []bool{true, false},
			want:   []string{"e", "f"},
		},
		"several breaks": {
			streams: []string{
				ts(1, 1) + " 1\n",
				ts(1, 1) + " 1\n" + ts(1, 2) + " 2\n",
				ts(1, 1) + " 1\n" + ts(1, 2) + " 2\n" + ts(1, 2) + " 2b\n",
				ts(1, 1) + " 1\n" + ts(1, 2) + " 2\n" + ts(1, 2) + " 2b\n" + ts(2, 0) + " 3\n",
			},
			broken: []bool{true, true, true, false},
			want:   []string{"1", "2", "2b", "3"},
		},
		"text keeps its spaces": {
			streams: []string{ts(1, 0) + "   indented  text \n"},
			want:    []string{"  indented  text "},
		},
		"a line without a timestamp passes through": {
			streams: []string{"garbage line\n"},
			want:    []string{"garbage line"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var c cursor
			var got []string
			for i, s := range tc.streams {
				var r io.Reader = strings.NewReader(s)
				if i < len(tc.broken) && tc.broken[i] {
					r = &brokenReader{r}
				}
				err := readLines(r, &c, func(_ time.Time, text string) { got = append(got, text) })
				if broken := i < len(tc.broken) && tc.broken[i]; broken != (err != nil) {
					t.Fatalf("stream %d: err %v, broken %v", i, err, broken)
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("lines (-want +got):\n%s", d)
			}
		})
	}
}

func TestCursorSince(t *testing.T) {
	var c cursor
	if c.since() != nil {
		t.Fatal("first stream must start without sinceTime")
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 999, time.UTC)
	c.accept(at)
	if got := c.since(); got == nil || !got.Time.Equal(at) {
		t.Fatalf("since %v, want %v", got, at)
	}
}

func TestSplitTimestamp(t *testing.T) {
	for in, want := range map[string]string{
		ts(1, 5) + " hello world": "hello world",
		ts(1, 5) + " ":            "",
		"nots hello":              "nots hello",
		"":                        "",
	} {
		_, got := splitTimestamp(in)
		if got != want {
			t.Errorf("splitTimestamp(%q) text %q, want %q", in, got, want)
		}
	}
}

func TestTail(t *testing.T) {
	tl := &tail{n: 3}
	for i := range 5 {
		tl.add(fmt.Sprint(i))
	}
	if d := cmp.Diff([]string{"2", "3", "4"}, tl.get()); d != "" {
		t.Error(d)
	}
}
