package executor

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/pkg/store"
)

// lineFx is an executor of parallelism 1 whose slot x1 (namespace x)
// holds, with a1 and a2 (namespace a) and then b1 (namespace b) waiting
// in its lines, submitted a second apart.
func lineFx(t *testing.T, edit func(*Config)) (*fx, *corev1.Pod) {
	t.Helper()
	f := newFx(t, func(c *Config) {
		c.Namespaces = nil
		c.Parallelism = 1
		if edit != nil {
			edit(c)
		}
	})
	submitIn := func(id, ns string) {
		tk := newTask()
		tk.Namespace = ns
		if _, err := f.ex.Submit(f.ctx, id, tk); err != nil {
			t.Fatal(err)
		}
		f.clk.Step(time.Second)
	}
	submitIn("x1", "x")
	f.update("x1", func(r *store.Record) { r.PodCreated = true })
	xPod := f.podOf("x1", 0, running())
	f.both(xPod)
	for _, s := range [][2]string{{"a1", "a"}, {"a2", "a"}, {"b1", "b"}} {
		submitIn(s[0], s[1])
	}
	for _, id := range []string{"x1", "a1", "a2", "b1"} {
		if _, _, err := f.sync(id); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.state("b1"); got != "Pending/WaitingForSlot" {
		t.Fatalf("b1 is %s, want it waiting", got)
	}
	return f, xPod
}

// TestNextInLine: the tasks another cluster may take from an executor's
// lines are those its slot plan would start first with that many slots
// more, each namespace capped by the other's room for it, and never one
// the executor's own free slot takes.
func TestNextInLine(t *testing.T) {
	all := func(string) int { return 10 }
	for name, tc := range map[string]struct {
		edit    func(*Config)
		n       int
		room    func(ns string) int
		skip    func(id string) bool
		release bool // x1's pod goes before the call: its slot is free here
		want    []string
	}{
		"fair: the namespaces in turn, earliest head first": {n: 5, room: all, want: []string{"a1", "b1", "a2"}},
		"no more than n": {n: 2, room: all, want: []string{"a1", "b1"}},
		"none asked":     {n: 0, room: all, want: nil},
		"a namespace without room elsewhere stays": {n: 5, room: func(ns string) int { return map[string]int{"b": 1}[ns] }, want: []string{"b1"}},
		"a namespace's room caps its count":        {n: 5, room: func(ns string) int { return map[string]int{"a": 1, "b": 1}[ns] }, want: []string{"a1", "b1"}},
		"skipped ones do not count":                {n: 2, room: func(ns string) int { return 1 }, skip: func(id string) bool { return id == "a1" }, want: []string{"a2", "b1"}},
		"FIFO: submission order":                   {edit: func(c *Config) { c.SlotOrder = SlotOrderFIFO }, n: 5, room: all, want: []string{"a1", "a2", "b1"}},
		"the head its own free slot takes stays":   {n: 5, room: all, release: true, want: []string{"b1", "a2"}},
	} {
		t.Run(name, func(t *testing.T) {
			f, pod := lineFx(t, tc.edit)
			if tc.release {
				f.uncache(pod)
				f.ex.podEvent(compactPod(pod), true)
			}
			if got := f.ex.NextInLine(tc.n, tc.room, tc.skip); !slices.Equal(got, tc.want) {
				t.Errorf("NextInLine(%d) = %v, want %v", tc.n, got, tc.want)
			}
		})
	}
}

// TestAMovedWaitingTaskLeavesTheLine: a task moved to another cluster
// while it waits in this executor's line leaves the line at its next
// pass: it no longer counts against Free, and the next task in line takes
// the slot that frees (before, the moved task kept its namespace's head, and
// the slot went to nobody).
func TestAMovedWaitingTaskLeavesTheLine(t *testing.T) {
	f, pod := lineFx(t, func(c *Config) { c.Cluster = "east" })
	if got := f.ex.Free("a"); got != -3 {
		t.Fatalf("Free with three waiting = %d, want -3", got)
	}
	if _, err := f.ex.store.(store.Clusters).Move(f.ctx, f.record("a1"), "ex-west", "west"); err != nil {
		t.Fatal(err)
	}
	before := f.record("a1")
	if _, _, err := f.sync("a1"); err != nil {
		t.Fatal(err)
	}
	if got := f.ex.Free("a"); got != -2 {
		t.Errorf("Free once a1 moved away = %d, want -2", got)
	}
	if after := f.record("a1"); after.Version != before.Version {
		t.Errorf("the moved record was written (version %d to %d): it is west's", before.Version, after.Version)
	}
	f.uncache(pod)
	f.ex.podEvent(compactPod(pod), true)
	for _, id := range []string{"b1", "a2"} {
		if _, _, err := f.sync(id); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.state("a2"); got != "Pending/Creating" {
		t.Errorf("a2, next in line once x1's slot freed, is %s; want Pending/Creating", got)
	}
}
