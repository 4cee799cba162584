package podlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// output is what a test container writes: lines from 1 byte to 40 KiB (over
// the 16 KiB record limit), empty lines, CR characters, UTF-8 and invalid
// UTF-8, and an unterminated last line.
func output(tag string) []byte {
	var b bytes.Buffer
	for i, n := range []int{1, 0, 7, 16 << 10, 16<<10 + 1, 40 << 10, 3, 0, 100} {
		fmt.Fprintf(&b, "%s%d:", tag, i)
		for j := range n {
			b.WriteByte("abcdefghij\r"[j%11])
		}
		b.WriteByte('\n')
	}
	b.WriteString("\rcarriage\r\n")
	b.WriteString("étoile ✓ \xff\xfe\n")
	b.WriteString(tag + " no newline at the end\r")
	return b.Bytes()
}

// newTestFollower returns a follower reading from node, collecting into col.
func newTestFollower(t *testing.T, node *fakeNode, col *collector, maxLine int) *Follower {
	t.Helper()
	f, err := New(Config{
		Client: fake.NewClientset(), Namespace: "ns", Pod: "p", Container: "c",
		Progress: node.getProgress, Changed: node.changed, OnLine: col.add,
		Clock: clocktesting.NewFakeClock(t0), MaxLineBytes: maxLine,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.open = node.open
	return f
}

// runFollower runs f to its end (bounded: a follower that never ends fails).
func runFollower(t *testing.T, f *Follower) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := f.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the follower did not finish: %v", err)
	}
	return err
}

func checkBytes(t *testing.T, what string, want, got []byte) {
	t.Helper()
	if i := firstDiff(want, got); i >= 0 {
		lo := max(i-20, 0)
		t.Fatalf("%s: output differs at byte %d (got %d bytes, want %d): got %q..., want %q...", what, i, len(got), len(want),
			got[lo:min(i+20, len(got))], want[lo:min(i+20, len(want))])
	}
}

// Every byte once, in order, whatever byte the first stream is cut at, cleanly
// or not, and with records sharing seconds and nanoseconds.
func TestFollowerExactBytesAcrossCuts(t *testing.T) {
	out := output("A")
	for _, stamps := range []struct {
		name string
		at   func(int) time.Time
	}{
		{"each record its own second", every(time.Second, 1)},
		{"three records per nanosecond, three per second", every(333*time.Millisecond, 3)},
		{"all in one nanosecond", every(0, 1)},
	} {
		recs := toRecords(out, 16<<10, stamps.at)
		full := serve(recs, nil)
		// Cut points: around every newline and in the next line's timestamp, and 1
		// in 499 elsewhere.
		set := map[int]bool{len(full) - 1: true}
		for i, b := range full {
			if i%499 == 0 {
				set[i] = true
			}
			if b == '\n' {
				for _, d := range []int{-2, -1, 0, 1, 2, 6, 20, 35, 36, 37} {
					set[min(max(i+d, 0), len(full)-1)] = true
				}
			}
		}
		points := slices.Sorted(maps.Keys(set))
		served := map[string][]byte{} // the same log in every run: serve it once
		for _, clean := range []bool{true, false} {
			for _, at := range points {
				name := fmt.Sprintf("%s/clean=%v/cut at %d", stamps.name, clean, at)
				node := newFakeNode(recs)
				node.served = served
				node.progress.Terminated = true
				node.cuts[0] = cut{at: at, clean: clean}
				// A second cut in the resumed stream, in the middle.
				node.cuts[2] = cut{at: (len(full) - at) / 2, clean: !clean}
				col := &collector{}
				if err := runFollower(t, newTestFollower(t, node, col, 0)); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				checkBytes(t, name, out, col.bytes())
				if t.Failed() {
					return
				}
			}
		}
	}
}

// Lines come whole: a line over 16 KiB is one Line, without the kubelet's
// timestamps inside, and only the unterminated last line lacks Newline.
func TestFollowerWholeLines(t *testing.T) {
	out := output("W")
	node := newFakeNode(toRecords(out, 16<<10, every(time.Millisecond, 1)))
	node.progress.Terminated = true
	node.cuts[0] = cut{at: 30 << 10, clean: true} // in the middle of the 16 KiB+1 line
	col := &collector{}
	if err := runFollower(t, newTestFollower(t, node, col, 0)); err != nil {
		t.Fatal(err)
	}
	want := strings.SplitAfter(string(out), "\n")
	if len(col.lines) != len(want) {
		t.Fatalf("%d lines, want %d", len(col.lines), len(want))
	}
	for i, l := range col.lines {
		last := i == len(col.lines)-1
		if l.Newline == last || l.Text+map[bool]string{true: "\n"}[l.Newline] != want[i] {
			t.Errorf("line %d: %d bytes, newline %v; want %d bytes", i, len(l.Text), l.Newline, len(want[i]))
		}
		if l.Time.IsZero() {
			t.Errorf("line %d has no time", i)
		}
	}
}

// The container restarts while the stream is broken: the rest of the previous
// instance comes before the new instance, whether the informer already saw the
// restart or not.
func TestFollowerRestartWhileBroken(t *testing.T) {
	a, b := output("first"), output("second")
	recA := toRecords(a, 16<<10, every(100*time.Millisecond, 1))
	// The second instance starts after the first one ended.
	start := recA[len(recA)-1].Time.Add(time.Second)
	recB := toRecords(b, 16<<10, func(i int) time.Time { return start.Add(time.Duration(i) * 100 * time.Millisecond) })
	fullA := serve(recA, nil)
	for name, tc := range map[string]struct {
		cutAt int
		// seen: the informer reports the restart (and the end) from this open on.
		seen int
	}{
		"informer saw the restart":                  {cutAt: len(fullA) / 3, seen: 1},
		"informer lags: restart seen later":         {cutAt: len(fullA) / 3, seen: 6},
		"cut in the first instance's last line":     {cutAt: len(fullA) - 5, seen: 1},
		"cut before the first instance's last line": {cutAt: len(fullA) - len("first no newline at the end\r") - 2, seen: 3},
	} {
		t.Run(name, func(t *testing.T) {
			node := newFakeNode(recA, recB)
			node.cuts[0] = cut{at: tc.cutAt}
			node.onOpen = func(n int) {
				if n == 1 {
					node.current = 1 // restarted while the first stream was broken
				}
				if n >= tc.seen && node.current == 1 {
					node.progress = Progress{Started: true, Terminated: true, RestartCount: 1}
				}
			}
			col := &collector{}
			if err := runFollower(t, newTestFollower(t, node, col, 0)); err != nil {
				t.Fatal(err)
			}
			checkBytes(t, name, append(append([]byte(nil), a...), b...), col.bytes())
			t.Logf("requests: %v", node.requests)
		})
	}
}

// A follower started after a restart reads the previous instance first.
func TestFollowerStartsAfterRestart(t *testing.T) {
	a, b := []byte("one\ntwo\n"), []byte("three\n")
	recA := toRecords(a, 16<<10, every(time.Second, 1))
	recB := toRecords(b, 16<<10, func(i int) time.Time { return t0.Add(time.Minute) })
	node := newFakeNode(recA, recB)
	node.current = 1
	node.progress = Progress{Started: true, Terminated: true, RestartCount: 1}
	col := &collector{}
	if err := runFollower(t, newTestFollower(t, node, col, 0)); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "log", []byte("one\ntwo\nthree\n"), col.bytes())
}

// A container that is never restarted has no previous instance: the
// follower reads its log to the end, the unterminated last line and the
// streams cut cleanly or not included, without asking for one. Otherwise it
// asks before every stream after the first.
func TestFollowerPreviousLogOnlyWhenItMayExist(t *testing.T) {
	out := output("x")
	for name, never := range map[string]bool{"may restart": false, "never restarts": true} {
		t.Run(name, func(t *testing.T) {
			node := newFakeNode(toRecords(out, 16<<10, every(time.Millisecond, 3)))
			node.cuts = map[int]cut{0: {at: 5000, clean: false}, 1: {at: 30000, clean: true}}
			node.onOpen = func(n int) {
				if n == 2 {
					node.progress.Terminated = true
				}
			}
			node.progress.NeverRestarts = never
			col := &collector{}
			if err := runFollower(t, newTestFollower(t, node, col, 0)); err != nil {
				t.Fatal(err)
			}
			checkBytes(t, "log", out, col.bytes())
			prev := 0
			for _, r := range node.requests {
				if strings.HasPrefix(r, "prev") {
					prev++
				}
			}
			if never && prev > 0 || !never && prev == 0 {
				t.Errorf("%d requests for the previous instance's log; requests: %v", prev, node.requests)
			}
		})
	}
}

// The unterminated last line is delivered once the log is complete, without a
// newline, and not before (it might still continue).
func TestFollowerUnterminatedLastLine(t *testing.T) {
	recs := toRecords([]byte("a\npartial"), 16<<10, every(time.Second, 1))
	node := newFakeNode(recs)
	var atEnd []string
	node.onOpen = func(n int) {
		if n == 2 {
			node.progress.Terminated = true
		}
	}
	col := &collector{}
	f := newTestFollower(t, node, col, 0)
	f.cfg.OnLine = func(l Line) {
		atEnd = append(atEnd, fmt.Sprintf("%d:%s", node.opens, piece(l)))
		col.add(l)
	}
	f.cur.emit = f.cfg.OnLine
	if err := runFollower(t, f); err != nil {
		t.Fatal(err)
	}
	// "a" comes with the first stream; "partial" only after two streams opened
	// once the container had terminated brought nothing new (opens 4 and 6, each
	// after a request for the previous instance).
	want := []string{"1:a+nl", "7:partial"}
	if d := cmp.Diff(want, atEnd); d != "" {
		t.Errorf("lines (-want +got):\n%s\nrequests: %v", d, node.requests)
	}
}

func TestFollowerEnds(t *testing.T) {
	t.Run("pod gone", func(t *testing.T) {
		node := newFakeNode(toRecords([]byte("a\nhalf"), 16<<10, every(time.Second, 1)))
		node.onOpen = func(n int) { node.progress.Gone = true }
		col := &collector{}
		if err := runFollower(t, newTestFollower(t, node, col, 0)); !errors.Is(err, ErrPodGone) {
			t.Fatalf("err %v, want ErrPodGone", err)
		}
		// What was read is delivered, the fragment too.
		checkBytes(t, "log", []byte("a\nhalf"), col.bytes())
	})
	t.Run("not in the cache yet, but it exists", func(t *testing.T) {
		node := newFakeNode(toRecords([]byte("a\nb\n"), 16<<10, every(time.Second, 1)))
		node.progress = Progress{Gone: true} // the cache never sees it
		col := &collector{}
		f := newTestFollower(t, node, col, 0)
		exited := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}
		f.cfg.Client = fake.NewClientset(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c"}}},
			Status:     corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "c", State: exited}}},
		})
		if err := runFollower(t, f); err != nil {
			t.Fatal(err)
		}
		checkBytes(t, "log", []byte("a\nb\n"), col.bytes())
	})
	t.Run("not in the cache, and another pod of the name exists", func(t *testing.T) {
		node := newFakeNode(toRecords([]byte("a\nb\n"), 16<<10, every(time.Second, 1)))
		node.progress = Progress{Gone: true}
		col := &collector{}
		f := newTestFollower(t, node, col, 0)
		f.cfg.UID = "u-ours"
		exited := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}
		f.cfg.Client = fake.NewClientset(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u-later"},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c"}}},
			Status:     corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "c", State: exited}}},
		})
		if err := runFollower(t, f); !errors.Is(err, ErrPodGone) {
			t.Fatalf("err %v, want ErrPodGone: the pod of the name is another one", err)
		}
	})
	t.Run("never started, never will", func(t *testing.T) {
		node := newFakeNode()
		node.progress = Progress{Terminated: true}
		if err := runFollower(t, newTestFollower(t, node, &collector{}, 0)); err != nil {
			t.Fatal(err)
		}
		if node.opens != 0 {
			t.Errorf("%d streams opened for a container that never started", node.opens)
		}
	})
	t.Run("context ends", func(t *testing.T) {
		node := newFakeNode()
		node.progress = Progress{}
		f := newTestFollower(t, node, &collector{}, 0)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := f.Run(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
	})
}

func TestNewValidates(t *testing.T) {
	ok := Config{Client: fake.NewClientset(), Namespace: "n", Pod: "p", Container: "c",
		Progress: func() Progress { return Progress{} }, OnLine: func(Line) {}}
	if _, err := New(ok); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*Config){
		"no client":    func(c *Config) { c.Client = nil },
		"no container": func(c *Config) { c.Container = "" },
		"no progress":  func(c *Config) { c.Progress = nil },
		"no OnLine":    func(c *Config) { c.OnLine = nil },
	} {
		c := ok
		mutate(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
