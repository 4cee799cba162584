package podlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// stopAt runs a follower on node until it delivered k Lines and returns the
// bytes of those k Lines and the Cursor taken in the k-th OnLine (the cursor
// of the beginning for k = 0). The follower is stopped there (its context is
// canceled); what it delivers afterwards is not counted. after is the
// follower's Cursor after Run returned and all bytes it delivered.
func stopAt(t *testing.T, node *fakeNode, resume []byte, k int, tweak func(*Config)) (got, cur, all, after []byte) {
	t.Helper()
	col := &collector{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var f *Follower
	cfg := Config{
		Client: fake.NewClientset(), Namespace: "ns", Pod: "p", Container: "c",
		Progress: node.getProgress, Changed: node.changed, Clock: clocktesting.NewFakeClock(t0),
		Resume: resume,
		OnLine: func(l Line) {
			col.add(l)
			if len(col.lines) == k {
				got, cur = col.bytes(), f.Cursor()
				cancel()
			}
		},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.open = node.open
	if k == 0 {
		got, cur = nil, f.Cursor()
		cancel()
	}
	err = f.Run(ctx)
	if cur == nil {
		// It ended before its k-th Line: stopped at its end.
		if err != nil {
			t.Fatalf("follower ended early: %v", err)
		}
		got, cur = col.bytes(), f.Cursor()
	}
	return got, cur, col.bytes(), f.Cursor()
}

// finish runs a follower resumed from cur on node to its end.
func finish(t *testing.T, node *fakeNode, cur []byte, tweak func(*Config)) []byte {
	t.Helper()
	col := &collector{}
	cfg := Config{
		Client: fake.NewClientset(), Namespace: "ns", Pod: "p", Container: "c",
		Progress: node.getProgress, Changed: node.changed, Clock: clocktesting.NewFakeClock(t0),
		OnLine: col.add, Resume: cur,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatalf("resume from %x: %v", cur, err)
	}
	f.open = node.open
	if err := runFollower(t, f); err != nil {
		t.Fatal(err)
	}
	return col.bytes()
}

// countLines is how many Lines an uninterrupted follower delivers on node.
func countLines(t *testing.T, node *fakeNode, tweak func(*Config)) (int, []byte) {
	t.Helper()
	n := 0
	var out bytes.Buffer
	cfg := Config{
		Client: fake.NewClientset(), Namespace: "ns", Pod: "p", Container: "c",
		Progress: node.getProgress, Changed: node.changed, Clock: clocktesting.NewFakeClock(t0),
		OnLine: func(l Line) {
			n++
			out.WriteString(l.Text)
			if l.Newline {
				out.WriteByte('\n')
			}
		},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.open = node.open
	if err := runFollower(t, f); err != nil {
		t.Fatal(err)
	}
	return n, out.Bytes()
}

// A follower stopped after any Line, and one resumed from the Cursor taken
// right after that Line, deliver together exactly the log: with broken
// streams before and after the stop, lines in pieces (MaxLineBytes, partial
// lines), and records sharing seconds and nanoseconds.
func TestResumeAfterEveryLine(t *testing.T) {
	out := output("R")
	for _, stamps := range []struct {
		name string
		at   func(int) time.Time
	}{
		{"each record its own second", every(time.Second, 1)},
		{"three records per nanosecond", every(333*time.Millisecond, 3)},
		{"all in one nanosecond", every(0, 1)},
	} {
		recs := toRecords(out, 16<<10, stamps.at)
		full := serve(recs, nil)
		for _, mode := range []struct {
			name  string
			tweak func(*Config)
		}{
			{"whole lines", nil},
			{"MaxLineBytes 5000", func(c *Config) { c.MaxLineBytes = 5000 }},
			{"partial lines", func(c *Config) { c.PartialLines = true; c.MaxLineBytes = 7000 }},
		} {
			for _, cutAt := range []int{len(full) / 3, len(full) - 10} {
				name := fmt.Sprintf("%s/%s/cut at %d", stamps.name, mode.name, cutAt)
				newNode := func() *fakeNode {
					node := newFakeNode(recs)
					node.progress.Terminated = true
					node.cuts[0] = cut{at: cutAt}
					node.cuts[3] = cut{at: len(full) / 2, clean: true}
					return node
				}
				n, whole := countLines(t, newNode(), mode.tweak)
				checkBytes(t, name+"/uninterrupted", out, whole)
				for k := range n + 1 {
					node := newNode()
					got, cur, all, after := stopAt(t, node, nil, k, mode.tweak)
					rest := finish(t, node, cur, mode.tweak)
					checkBytes(t, fmt.Sprintf("%s/stopped after line %d", name, k), out, append(got, rest...))
					// The Cursor after Run returned covers what the stopped follower
					// delivered after the stop (the rest of its stream, its held
					// fragment).
					rest = finish(t, newNode(), after, mode.tweak)
					checkBytes(t, fmt.Sprintf("%s/stopped after line %d, resumed after Run", name, k), out, append(all, rest...))
					if t.Failed() {
						return
					}
				}
			}
		}
	}
}

// A follower stopped in the first instance, resumed after the container
// restarted: the rest of the first instance, then the second, also when the
// resumed follower's view does not show the restart yet.
func TestResumeAcrossRestart(t *testing.T) {
	a, b := output("first"), output("second")
	recA := toRecords(a, 16<<10, every(100*time.Millisecond, 1))
	start := recA[len(recA)-1].Time.Add(time.Second)
	recB := toRecords(b, 16<<10, func(i int) time.Time { return start.Add(time.Duration(i) * 100 * time.Millisecond) })
	onlyA := newFakeNode(recA)
	onlyA.progress.Terminated = true
	nA, _ := countLines(t, onlyA, nil)
	for name, lag := range map[string]int{"view shows the restart": 0, "view lags": 4} {
		for k := 1; k < nA; k++ {
			// The first follower runs while the first instance runs.
			node := newFakeNode(recA, recB)
			node.cuts[0] = cut{at: len(serve(recA, nil)) / 2}
			got, cur, _, _ := stopAt(t, node, nil, k, nil)
			// The container restarts and terminates while nobody follows.
			node.mu.Lock()
			node.current = 1
			from := node.opens + lag
			node.onOpen = func(n int) {
				if n >= from {
					node.progress = Progress{Started: true, Terminated: true, RestartCount: 1}
				}
			}
			node.mu.Unlock()
			rest := finish(t, node, cur, nil)
			checkBytes(t, fmt.Sprintf("%s/stopped after line %d", name, k), append(append([]byte(nil), a...), b...), append(got, rest...))
			if t.Failed() {
				t.Logf("requests: %v", node.requests)
				return
			}
		}
	}
}

// After a rotation the resumed follower continues with the oldest line the
// node still has. That is exact when the rotation kept the line the cursor is
// in (the line in progress, or else the last line delivered) from its start.
// Otherwise what the node no longer has is lost, and when the rotation split
// the cursor's line (a line over the runtime's record size), the part of it
// the node still has comes as a line of its own: the node serves it stamped
// like a new line.
func TestResumeAfterRotation(t *testing.T) {
	out := output("rot")
	recs := toRecords(out, 16<<10, every(time.Second, 1))
	starts := make([]int, len(recs)+1) // byte offset of each record in out
	for i, r := range recs {
		starts[i+1] = starts[i] + len(r.Text)
		if !r.Partial {
			starts[i+1]++
		}
	}
	recordAt := func(off int) int {
		for i, s := range starts {
			if s >= off {
				return i
			}
		}
		return len(recs)
	}
	tweak := func(c *Config) { c.MaxLineBytes = 5000 }
	n, _ := countLines(t, func() *fakeNode { n := newFakeNode(recs); n.progress.Terminated = true; return n }(), tweak)
	for k := 1; k <= n; k++ {
		node := newFakeNode(recs)
		node.progress.Terminated = true
		got, cur, _, _ := stopAt(t, node, nil, k, tweak)
		p := len(got)
		// The record where the cursor's line starts: the line in progress, or
		// the last line delivered.
		lc := recordAt(bytes.LastIndexByte(out[:p-1], '\n') + 1)
		for _, r := range []int{lc - 1, lc, lc + 1, lc + 2, lc + 3, len(recs)} {
			if r < 0 || r > len(recs) {
				continue
			}
			rotated := newFakeNode(recs[r:])
			rotated.progress.Terminated = true
			rest := finish(t, rotated, cur, tweak)
			want := out
			if r > lc {
				want = append(append([]byte(nil), got...), out[starts[r]:]...)
			}
			checkBytes(t, fmt.Sprintf("stopped after line %d (byte %d), rotated %d records (cursor's line starts at %d)", k, p, r, lc), want, append(got, rest...))
			if t.Failed() {
				return
			}
		}
	}
}

// The last instance of a container that restarted wrote nothing: the log ends
// with the previous instance (the follower used to wait for a line of the
// current log forever).
func TestFollowerEmptyLastInstance(t *testing.T) {
	node := newFakeNode(toRecords([]byte("one\ntwo"), 16<<10, every(time.Second, 1)), nil)
	node.current = 1
	node.progress = Progress{Started: true, Terminated: true, RestartCount: 1}
	col := &collector{}
	if err := runFollower(t, newTestFollower(t, node, col, 0)); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "log", []byte("one\ntwo"), col.bytes())
	if len(node.requests) > 8 {
		t.Errorf("%d requests to see the end: %v", len(node.requests), node.requests)
	}
}

// With PartialLines, the bytes of a line in progress are delivered when the
// stream pauses, not when the newline comes.
func TestPartialLinesDeliveredWhenTheStreamPauses(t *testing.T) {
	pr, pw := io.Pipe()
	lines := make(chan Line, 10)
	c := cursor{container: "c", maxLine: DefaultMaxLineBytes, partial: true, emit: func(l Line) { lines <- l }}
	done := make(chan error, 1)
	go func() {
		_, err := c.read(pr, false)
		done <- err
	}()
	next := func() string {
		select {
		case l := <-lines:
			return piece(l)
		case <-time.After(10 * time.Second):
			t.Fatal("no line delivered while the stream pauses")
			return ""
		}
	}
	go func() { _, _ = pw.Write([]byte(ts(1, 0) + " a\n" + ts(1, 1) + " progress 50%")) }()
	if got := next(); got != "a+nl" {
		t.Fatalf("got %q", got)
	}
	if got := next(); got != "progress 50%" {
		t.Fatalf("got %q, want the piece before the pause", got)
	}
	go func() { _, _ = pw.Write([]byte(" 100%\n")); pw.Close() }()
	if got := next(); got != " 100%+nl" {
		t.Fatalf("got %q", got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestCursorEncoding(t *testing.T) {
	var got [][]byte
	c := cursor{container: "c", maxLine: 4, emit: func(Line) {}}
	got = append(got, c.appendPosition(nil))
	if _, err := c.read(strings.NewReader(ts(7, 42)+" a\n"+ts(7, 42)+" 0123456"), false); err != nil {
		t.Fatal(err)
	}
	got = append(got, c.appendPosition(nil))
	want := [][]byte{{1, 0}, {1, 3}}
	for i := range want {
		if !bytes.HasPrefix(got[i], want[i]) {
			t.Errorf("cursor %d: %x, want prefix %x", i, got[i], want[i])
		}
	}
	// Round trip: a follower resumed from a cursor returns it unchanged.
	for _, b := range got {
		var d cursor
		if err := d.decodePosition(b); err != nil {
			t.Fatalf("%x: %v", b, err)
		}
		if back := d.appendPosition(nil); !bytes.Equal(back, b) {
			t.Errorf("%x comes back as %x", b, back)
		}
	}
	valid := got[1]
	for name, b := range map[string][]byte{
		"version 0":          {0, 0},
		"version 2":          {2, 0},
		"no flags":           {1},
		"unknown flag":       {1, 4},
		"open, not begun":    {1, 2},
		"truncated":          valid[:len(valid)-1],
		"trailing bytes":     append(append([]byte(nil), valid...), 0),
		"overlong varint":    {1, 1, 0x80, 0x00, 0, 1},
		"nanoseconds 1e9":    append([]byte{1, 1, 2}, 0x80, 0x94, 0xeb, 0xdc, 0x03, 1),
		"begun, no line":     {1, 1, 2, 0, 0},
		"timestamp overflow": {1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 1},
	} {
		_, err := New(Config{Client: fake.NewClientset(), Namespace: "n", Pod: "p", Container: "c",
			Progress: func() Progress { return Progress{} }, OnLine: func(Line) {}, Resume: b})
		if !errors.Is(err, ErrBadCursor) {
			t.Errorf("%s (%x): err %v, want ErrBadCursor", name, b, err)
		}
	}
}

// Any bytes as Config.Resume: an error or a follower, never a panic; an
// accepted cursor is exactly the follower's Cursor.
func FuzzResume(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0})
	f.Add([]byte{1, 1, 0xd2, 0x85, 0xd8, 0xcc, 0x0c, 0x2a, 0x01})
	f.Add([]byte{1, 3, 0xd2, 0x85, 0xd8, 0xcc, 0x0c, 0x2a, 0x00, 0x07})
	f.Add([]byte{1, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, err := New(Config{Client: fake.NewClientset(), Namespace: "n", Pod: "p", Container: "c",
			Progress: func() Progress { return Progress{} }, OnLine: func(Line) {}, Resume: b})
		if err != nil {
			if !errors.Is(err, ErrBadCursor) {
				t.Fatalf("%x: err %v is not ErrBadCursor", b, err)
			}
			return
		}
		if got := fl.Cursor(); len(b) > 0 && !bytes.Equal(got, b) {
			t.Fatalf("accepted %x, Cursor %x", b, got)
		}
		if since := fl.cur.since(); since != nil {
			_ = since.UTC().Format(time.RFC3339) // as the request encodes it
		}
	})
}
