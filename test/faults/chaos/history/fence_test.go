package history

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadFenceEvents: the fence's refusals as a replica logs them, counted;
// nothing else is.
func TestReadFenceEvents(t *testing.T) {
	kept, err := os.ReadFile("testdata/replica.log")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		log  string
		want FenceEvents
	}{
		// r0 of a tiny run, from SIGCONT: its stale pod discarded (by its
		// sync and by its creator), a write fenced, two creations refused.
		"a resumed replica's log": {log: string(kept), want: FenceEvents{RefusedCreations: 2, FencedWrites: 1, Discarded: 2}},
		"other lines, and the messages named elsewhere than in msg": {
			log: `time=2026-12-06T03:23:58.978Z level=WARN msg="discarding a pod failed; the next term discards it" replica=r0 shard=4 err="context canceled"
time=2026-12-06T03:23:58.978Z level=INFO msg="reconcile failed, retrying" replica=r0 task=c00073 err="a store write was fenced"
time=2026-12-06T03:23:59.258Z level=WARN msg="stopped acting on pods: another process began a newer term of this instance (its store writes fence this one's); waiting for the instance lease" replica=r0
not a log line at all
`,
		},
		"nothing": {},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ReadFenceEvents(strings.NewReader(c.log))
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %s, want %s", got, c.want)
			}
			if (got.Total() > 0) != (c.want != FenceEvents{}) {
				t.Errorf("total %d", got.Total())
			}
		})
	}
}

// TestAuditFenced: the pods the fence kept from running, by creation time
// and creator.
func TestAuditFenced(t *testing.T) {
	hist := &h{tb: t}
	stale, later := gated(t, "a", 0, "u1"), gated(t, "b", 0, "u4")
	hist.create(stale, 1).discard(stale, 1.2)
	hist.run(gated(t, "a", 0, "u2"), 2, 0) // gated, and bound: it ran
	hist.run(pod(t, "c", 0, "u3"), 2, 0)
	hist.create(later, 10).discard(later, 10.5)
	a, err := ReadAudit(bytes.NewReader(hist.log()))
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		from, to  float64
		executors []string
		want      []string
	}{
		"the window of the first":  {from: 0, to: 5, want: []string{"u1"}},
		"both":                     {from: 0, to: 10, want: []string{"u1", "u4"}},
		"by their creator":         {from: 0, to: 20, executors: []string{"g-shard-1"}, want: []string{"u1", "u4"}},
		"by another creator":       {from: 0, to: 20, executors: []string{"g-shard-2"}},
		"a window with none":       {from: 1.5, to: 9},
		"a window ending at one":   {from: 0, to: 1, want: []string{"u1"}},
		"a window starting at one": {from: 10, to: 11, want: []string{"u4"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, p := range a.Fenced(at(c.from), at(c.to), c.executors...) {
				got = append(got, string(p.UID))
			}
			if strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Errorf("fenced %v, want %v", got, c.want)
			}
		})
	}
}

// TestFenceMessagesAreTheExecutors: each message FenceEvents counts is one
// pkg/executor logs, so that a reworded message fails here rather than as a
// chaos run whose SIGSTOP seems to have exercised nothing.
func TestFenceMessagesAreTheExecutors(t *testing.T) {
	files, err := filepath.Glob("../../../../pkg/executor/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("pkg/executor's sources: %v (%d files)", err, len(files))
	}
	var src strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	for _, m := range fenceMessages {
		if !strings.Contains(src.String(), `"`+m.prefix) {
			t.Errorf("pkg/executor logs no message that starts %q", m.prefix)
		}
	}
}
