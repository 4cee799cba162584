package container

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// records returns the records of a log file as "stream tag text" (text quoted).
func records(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.SplitAfter(string(raw), "\n") {
		if line == "" {
			continue
		}
		f := strings.SplitN(strings.TrimSuffix(line, "\n"), " ", 4)
		if len(f) != 4 || !strings.HasSuffix(line, "\n") {
			t.Fatalf("not a CRI record: %q", line)
		}
		if _, err := time.Parse(time.RFC3339Nano, f[0]); err != nil {
			t.Fatalf("bad timestamp in %q: %v", line, err)
		}
		text := f[3]
		if len(text) > 40 {
			text = fmt.Sprintf("%d bytes ending %q", len(text), text[len(text)-3:])
		} else {
			text = fmt.Sprintf("%q", text)
		}
		out = append(out, f[1]+" "+f[2]+" "+text)
	}
	return out
}

// The writer makes records as containerd does: one per line without its
// newline, the CR of a CRLF dropped, lines over 16 KiB in partial records (a
// CRLF never split), the unterminated last line a partial record.
func TestLogWriterRecords(t *testing.T) {
	x := func(n int) string { return strings.Repeat("x", n) }
	for name, tc := range map[string]struct {
		out  string
		want []string
	}{
		"lines":             {"a\n\nb c\n", []string{`stdout F "a"`, `stdout F ""`, `stdout F "b c"`}},
		"unterminated last": {"a\nend", []string{`stdout F "a"`, `stdout P "end"`}},
		"CR kept, CRLF cut": {"\ra\rb\r\r\nc\r", []string{`stdout F "\ra\rb\r"`, `stdout P "c\r"`}},
		"16 KiB exactly":    {x(16<<10) + "\n", []string{`stdout F 16384 bytes ending "xxx"`}},
		"over 16 KiB": {x(40000) + "\n", []string{`stdout P 16384 bytes ending "xxx"`, `stdout P 16384 bytes ending "xxx"`,
			`stdout F 7232 bytes ending "xxx"`}},
		"CRLF at the record limit":   {x(16<<10) + "\r\n", []string{`stdout F 16384 bytes ending "xxx"`}},
		"CRLF past the record limit": {x(16<<10+1) + "\r\n", []string{`stdout P 16384 bytes ending "xxx"`, `stdout F "x"`}},
		"CR at a read boundary":      {x(4095) + "\r" + "y\n", []string{`stdout F 4097 bytes ending "x\ry"`}},
		"unterminated long":          {x(20000), []string{`stdout P 16384 bytes ending "xxx"`, `stdout P 3616 bytes ending "xxx"`}},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "0.log")
			lw, err := createLog(path)
			if err != nil {
				t.Fatal(err)
			}
			lw.copy("stdout", strings.NewReader(tc.out))
			lw.close()
			if d := cmp.Diff(tc.want, records(t, path)); d != "" {
				t.Errorf("records (-want +got):\n%s", d)
			}
		})
	}
}

// The server writes the kubelet's output for records: one timestamp per line
// (the first record's, fixed width), records skipped one by one before
// sinceTime, partial records without a newline.
func TestReadLogLikeTheKubelet(t *testing.T) {
	at := func(ms int) time.Time {
		return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).Add(time.Duration(ms) * time.Millisecond)
	}
	file := strings.Join([]string{
		at(0).Format(time.RFC3339Nano) + " stdout F a",
		at(100).Format(time.RFC3339Nano) + " stdout P " + "long-1,",
		at(1200).Format(time.RFC3339Nano) + " stdout P " + "long-2,",
		at(1300).Format(time.RFC3339Nano) + " stdout F " + "long-3",
		at(1400).Format(time.RFC3339Nano) + " stderr F b",
		at(2000).Format(time.RFC3339Nano) + " stdout P end",
	}, "\n") + "\n"
	path := filepath.Join(t.TempDir(), "0.log")
	lw, err := createLog(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lw.f.WriteString(file); err != nil {
		t.Fatal(err)
	}
	lw.close()
	stamp := func(ms int) string { return at(ms).Format("2006-01-02T15:04:05.000000000Z07:00") + " " }
	for name, tc := range map[string]struct {
		opts LogOptions
		want string
	}{
		"plain": {LogOptions{TailLines: -1}, "a\nlong-1,long-2,long-3\nb\nend"},
		"timestamps": {LogOptions{TailLines: -1, Timestamps: true},
			stamp(0) + "a\n" + stamp(100) + "long-1,long-2,long-3\n" + stamp(1400) + "b\n" + stamp(2000) + "end"},
		"since within a long line: its rest without a timestamp": {LogOptions{TailLines: -1, Timestamps: true, SinceTime: at(1000)},
			"long-2,long-3\n" + stamp(1400) + "b\n" + stamp(2000) + "end"},
		"follow of an exited container": {LogOptions{TailLines: -1, Timestamps: true, Follow: true, SinceTime: at(2000)},
			stamp(2000) + "end"},
		"tail counts records": {LogOptions{TailLines: 2, Timestamps: true}, stamp(1400) + "b\n" + stamp(2000) + "end"},
	} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := readLog(context.Background(), path, lw, tc.opts, &b); err != nil {
				t.Fatal(err)
			}
			if b.String() != tc.want {
				t.Errorf("got  %q\nwant %q", b.String(), tc.want)
			}
		})
	}
}

// A 256 KiB line from a running process comes out whole, with one timestamp.
func TestLongLineHasOneTimestamp(t *testing.T) {
	p := start(t, Spec{Command: sh(`head -c 262144 /dev/zero | tr '\0' x; echo; printf 'last'`)})
	waitDone(t, p)
	got := readAll(t, p, LogOptions{TailLines: -1, Timestamps: true})
	lines := strings.Split(got, "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2", len(lines))
	}
	for i, want := range []string{strings.Repeat("x", 262144), "last"} {
		ts, text, ok := strings.Cut(lines[i], " ")
		if _, err := time.Parse(time.RFC3339Nano, ts); !ok || err != nil {
			t.Fatalf("line %d: no timestamp: %.60q", i, lines[i])
		}
		if text != want {
			t.Errorf("line %d: %d bytes, %d timestamps inside; want %d bytes", i, len(text), strings.Count(text, "T"), len(want))
		}
	}
}
