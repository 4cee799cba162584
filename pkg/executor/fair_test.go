package executor

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// line builds a namespace's waiting tasks from "id" or "id@second" or
// "id@second^priority" (submitted that many seconds after podtest.T0), in
// line order.
func line(specs ...string) []waiter {
	var ws []waiter
	for i, s := range specs {
		w := waiter{id: s, at: podtest.T0.Add(time.Duration(i) * time.Millisecond)}
		if id, rest, ok := strings.Cut(s, "@"); ok {
			var sec int
			at, prio, _ := strings.Cut(rest, "^")
			fmt.Sscan(at, &sec)
			if prio != "" {
				fmt.Sscan(prio, &w.prio)
			}
			w.id, w.at = id, podtest.T0.Add(time.Duration(sec)*time.Second)
		}
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b waiter) int {
		if a.before(b) {
			return -1
		}
		return 1
	})
	return ws
}

// TestAllot: which waiting tasks take the free slots, given the slots each
// namespace holds, their limits, weights, and the tasks' priorities and
// submission times.
func TestAllot(t *testing.T) {
	cases := map[string]struct {
		order  SlotOrder
		free   int
		spaces map[string]nsSlots
		admit  []string
		used   map[string]int
	}{
		"one namespace: its line in submission order": {
			free:   2,
			spaces: map[string]nsSlots{"a": {weight: 1, waiting: line("a1", "a2", "a3")}},
			admit:  []string{"a1", "a2"},
		},
		"no free slot: nobody starts": {
			free:   0,
			spaces: map[string]nsSlots{"a": {used: 5, weight: 1, waiting: line("a1")}, "b": {weight: 1, waiting: line("b1")}},
		},
		"more pods than slots (Parallelism lowered): nobody starts": {
			free:   -3,
			spaces: map[string]nsSlots{"b": {weight: 1, waiting: line("b1")}},
		},
		"B's first task takes the next free slot, ahead of A's older backlog": {
			free: 1,
			spaces: map[string]nsSlots{
				"a": {used: 50, weight: 1, waiting: line("a1@0", "a2@0", "a3@0")},
				"b": {weight: 1, waiting: line("b1@60", "b2@60")},
			},
			admit: []string{"b1"},
		},
		"namespaces with waiting tasks take free slots in turn; ties to the earlier submission": {
			free: 5,
			spaces: map[string]nsSlots{
				"a": {used: 2, weight: 1, waiting: line("a1@0", "a2@1", "a3@2", "a4@3")},
				"b": {used: 2, weight: 1, waiting: line("b1@10", "b2@11", "b3@12")},
			},
			admit: []string{"a1", "b1", "a2", "b2", "a3"},
		},
		"the namespace that holds fewer slots catches up first": {
			free: 4,
			spaces: map[string]nsSlots{
				"a": {used: 3, weight: 1, waiting: line("a1@0", "a2@1")},
				"b": {used: 0, weight: 1, waiting: line("b1@10", "b2@11", "b3@12", "b4@13")},
			},
			admit: []string{"b1", "b2", "b3", "a1"},
		},
		"weights: a namespace of weight 2 takes two slots for each one of weight 1": {
			free: 6,
			spaces: map[string]nsSlots{
				"a": {weight: 2, waiting: line("a1@0", "a2@1", "a3@2", "a4@3", "a5@4")},
				"b": {weight: 1, waiting: line("b1@0", "b2@1", "b3@2")},
			},
			admit: []string{"a1", "b1", "a2", "b2", "a3", "a4"},
			used:  map[string]int{"a": 4, "b": 2},
		},
		"a namespace at its limit waits; the others take the free slots": {
			free: 3,
			spaces: map[string]nsSlots{
				"a": {used: 2, limit: 2, weight: 1, waiting: line("a1@0", "a2@1")},
				"b": {used: 5, weight: 1, waiting: line("b1@10", "b2@11")},
			},
			admit: []string{"b1", "b2"},
		},
		"a namespace reaches its limit within the plan": {
			free: 4,
			spaces: map[string]nsSlots{
				"a": {used: 0, limit: 1, weight: 1, waiting: line("a1@0", "a2@1", "a3@2")},
				"b": {used: 3, weight: 1, waiting: line("b1@10", "b2@11")},
			},
			admit: []string{"a1", "b1", "b2"},
			used:  map[string]int{"a": 1, "b": 5},
		},
		"every namespace at its limit: free slots stay free": {
			free: 10,
			spaces: map[string]nsSlots{
				"a": {used: 1, limit: 1, weight: 1, waiting: line("a1")},
				"b": {used: 2, limit: 2, weight: 1, waiting: line("b1")},
			},
		},
		"priority within a namespace: higher first, then submission order": {
			free: 3,
			spaces: map[string]nsSlots{
				"a": {weight: 1, waiting: line("low@0^-1", "old@1", "urgent@5^10", "new@3")},
			},
			admit: []string{"urgent", "old", "new"},
		},
		"priority does not take another namespace's turn": {
			free: 2,
			spaces: map[string]nsSlots{
				"a": {used: 1, weight: 1, waiting: line("a1@0^1000", "a2@0^1000")},
				"b": {used: 0, weight: 1, waiting: line("b1@9", "b2@9")},
			},
			admit: []string{"b1", "a1"},
		},
		"fifo: one line by submission time across namespaces, whatever they hold": {
			order: SlotOrderFIFO,
			free:  3,
			spaces: map[string]nsSlots{
				"a": {used: 50, weight: 1, waiting: line("a1@0", "a2@1", "a3@5")},
				"b": {weight: 5, waiting: line("b1@2", "b2@3")},
			},
			admit: []string{"a1", "a2", "b1"},
		},
		"fifo: a namespace at its limit does not hold up the others": {
			order: SlotOrderFIFO,
			free:  2,
			spaces: map[string]nsSlots{
				"a": {used: 3, limit: 3, weight: 1, waiting: line("a1@0", "a2@1")},
				"b": {weight: 1, waiting: line("b1@2", "b2@3", "b3@4")},
			},
			admit: []string{"b1", "b2"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			order := tc.order
			if order == "" {
				order = SlotOrderFair
			}
			before := fmt.Sprint(tc.spaces)
			plan := allot(order, tc.free, tc.spaces)
			if diff := cmp.Diff(tc.admit, plan.admit); diff != "" {
				t.Errorf("admitted (-want +got):\n%s", diff)
			}
			for ns, want := range tc.used {
				if plan.used[ns] != want {
					t.Errorf("namespace %s holds %d slots after the plan, want %d", ns, plan.used[ns], want)
				}
			}
			if after := fmt.Sprint(tc.spaces); after != before {
				t.Errorf("allot modified its arguments:\n%s\n%s", before, after)
			}
		})
	}
}

// TestWaitMessage: a waiting task's message names the limit it waits for.
func TestWaitMessage(t *testing.T) {
	cases := map[string]struct {
		order                      SlotOrder
		limit, used, total, shards int
		want                       string
	}{
		"its namespace at its limit":                 {SlotOrderFair, 20, 20, 50, 0, "namespace team-a at its limit of 20"},
		"its namespace over its limit (lowered)":     {SlotOrderFair, 5, 8, 50, 0, "namespace team-a at its limit of 5"},
		"below its namespace's limit: all slots":     {SlotOrderFair, 20, 7, 50, 0, "all 50 slots in use; namespaces with waiting tasks take free slots in turn"},
		"no limit of its own: all slots":             {SlotOrderFair, 0, 50, 50, 0, "all 50 slots in use; namespaces with waiting tasks take free slots in turn"},
		"fifo: all slots, in submission order":       {SlotOrderFIFO, 0, 3, 50, 0, "all 50 slots in use; tasks start in submission order"},
		"fifo: the namespace's limit is still named": {SlotOrderFIFO, 3, 3, 50, 0, "namespace team-a at its limit of 3"},
		"a shard's part of its namespace's limit": {SlotOrderFair, 2, 2, 9, 12,
			"namespace team-a at its limit of 2 in this task's shard (the namespace's limit divided among 12 shards)"},
		"a shard's part of the slots": {SlotOrderFair, 2, 1, 9, 12,
			"all 9 slots of this task's shard in use (the parallelism divided among 12 shards); namespaces with waiting tasks take free slots in turn"},
		"one shard: its own limits": {SlotOrderFair, 20, 20, 50, 1, "namespace team-a at its limit of 20"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := waitMessage(tc.order, "team-a", tc.limit, tc.used, tc.total, tc.shards); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestNamespacesShareTheSlots: through sync passes, the namespaces with
// waiting tasks take the slots in turn, a namespace at its limit waits and
// its tasks say so, and a slot that frees goes to the namespace that holds
// the fewest.
func TestNamespacesShareTheSlots(t *testing.T) {
	f := newFx(t, func(c *Config) {
		c.Namespaces = nil
		c.Parallelism = 4
		c.NamespaceParallelism = map[string]int{"a": 3, "c": 1}
	})
	submit := func(id, ns string) {
		tk := newTask()
		tk.Namespace = ns
		if _, err := f.ex.Submit(f.ctx, id, tk); err != nil {
			t.Fatal(err)
		}
		f.clk.Step(time.Second)
	}
	for _, id := range []string{"a1", "a2", "a3", "a4", "b1", "b2", "c1", "c2"} {
		submit(id, id[:1])
	}
	all := []string{"c2", "c1", "b2", "b1", "a4", "a3", "a2", "a1"} // newest first: the order of syncs does not matter
	for _, id := range all {
		if _, _, err := f.sync(id); err != nil {
			t.Fatal(err)
		}
	}
	// In turn: a1 (the earliest of three namespaces holding none), b1, c1
	// (c is then at its limit), a2 (a and b hold one each; a's next is
	// older). A single line would have started a1, a2, a3, b1.
	allSlots := "all 4 slots in use; namespaces with waiting tasks take free slots in turn"
	want := map[string]string{
		"a1": "Creating", "b1": "Creating", "c1": "Creating", "a2": "Creating",
		"a3": allSlots, "a4": allSlots, "b2": allSlots, "c2": "namespace c at its limit of 1",
	}
	check := func(want map[string]string) {
		t.Helper()
		for id, w := range want {
			rec, err := f.ex.Get(f.ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			got := rec.Reason
			if rec.Reason == reasonWaitingForSlot {
				got = rec.Message
			}
			if got != w {
				t.Errorf("%s: %s (%s), want %s", id, rec.Reason, rec.Message, w)
			}
		}
	}
	syncAll := func() {
		t.Helper()
		for _, id := range all {
			if _, _, err := f.sync(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	check(want)
	// The pods exist and the cache shows them: the waiting tasks still wait.
	if got := f.drainCreations(); len(got) != 4 {
		t.Fatalf("creations %v", got)
	}
	pods := map[string]*corev1.Pod{}
	for _, id := range []string{"a1", "a2", "b1", "c1"} {
		rec := f.record(id)
		name := task.PodName(task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Executor: "ex", Nonce: rec.Nonce}, 0)
		p, err := f.client.CoreV1().Pods(rec.Namespace).Get(f.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods[id] = p
		f.cache(p)
		f.ex.podEvent(compactPod(p), false) // the creation is seen: the cache counts its slot
	}
	syncAll()
	for _, id := range []string{"a1", "a2", "b1", "c1"} {
		delete(want, id)
	}
	check(want)
	// b1's pod leaves the cache: b2 takes the slot (b holds none; a holds
	// two), not a3, which a single line would start.
	f.uncache(pods["b1"])
	f.ex.podEvent(compactPod(pods["b1"]), true)
	syncAll()
	want["b2"] = "Creating"
	check(want)
}

// TestPriorityWithinANamespace: a task of higher spec.priority takes its
// namespace's next slot before earlier submissions, whoever syncs first.
func TestPriorityWithinANamespace(t *testing.T) {
	f := newFx(t, func(c *Config) { c.Parallelism = 1 })
	f.submit("early", newTask())
	f.clk.Step(time.Second)
	f.submit("urgent", newTask(func(tk *task.Task) { tk.Spec.Priority = 5 }))
	for _, id := range []string{"early", "urgent"} {
		if _, _, err := f.sync(id); err != nil {
			t.Fatal(err)
		}
	}
	if f.state("urgent") != "Pending/Creating" || f.state("early") != "Pending/WaitingForSlot" {
		t.Errorf("urgent %s, early %s: want urgent admitted first", f.state("urgent"), f.state("early"))
	}
}

// TestSlotConfigErrors: bad limits and weights are refused, naming the field.
func TestSlotConfigErrors(t *testing.T) {
	cases := map[string]struct {
		edit func(*Config)
		want string
	}{
		"namespace limit 0":      {func(c *Config) { c.NamespaceParallelism = map[string]int{"a": 0} }, `NamespaceParallelism["a"] must be at least 1`},
		"negative default limit": {func(c *Config) { c.DefaultNamespaceParallelism = -1 }, "DefaultNamespaceParallelism must not be negative"},
		"weight 0":               {func(c *Config) { c.NamespaceWeights = map[string]int{"b": 0} }, `NamespaceWeights["b"] must be at least 1`},
		"unknown order":          {func(c *Config) { c.SlotOrder = "lifo" }, `SlotOrder "lifo": want "fair" or "fifo"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := Config{RESTConfig: &rest.Config{}, InstanceID: "x"}
			tc.edit(&cfg)
			if err := cfg.defaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("defaults() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	cfg := Config{RESTConfig: &rest.Config{}, InstanceID: "x"}
	if err := cfg.defaults(); err != nil || cfg.SlotOrder != SlotOrderFair {
		t.Errorf("defaults: %v, order %q, want fair", err, cfg.SlotOrder)
	}
}

// TestGetSaysWhichLimitNow: a waiting task is synced again only when a slot
// may be its, so the message of its last sync can be out of date; Get says
// which limit it waits for now.
func TestGetSaysWhichLimitNow(t *testing.T) {
	f := newFx(t, func(c *Config) {
		c.Namespaces = nil
		c.Parallelism = 1
		c.NamespaceParallelism = map[string]int{"ns": 1}
	})
	// A task of namespace x holds the only slot.
	x := newTask()
	x.Namespace = "x"
	if _, err := f.ex.Submit(f.ctx, "x1", x); err != nil {
		t.Fatal(err)
	}
	f.update("x1", func(r *store.Record) { r.PodCreated = true })
	xPod := f.podOf("x1", 0, running())
	f.both(xPod)
	if _, _, err := f.sync("x1"); err != nil || f.state("x1") != "Running/Running" {
		t.Fatalf("x1: %v %s", err, f.state("x1"))
	}
	f.clk.Step(time.Second)
	f.submit("b1", newTask())
	f.clk.Step(time.Second)
	f.submit("b2", newTask())
	for _, id := range []string{"b2", "b1"} {
		if _, _, err := f.sync(id); err != nil {
			t.Fatal(err)
		}
	}
	msg := func(id string) string {
		rec, err := f.ex.Get(f.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Message
	}
	if got := msg("b2"); got != "all 1 slots in use; namespaces with waiting tasks take free slots in turn" {
		t.Errorf("b2 while x1 runs: %q", got)
	}
	// x1's pod goes: b1 takes the slot, and ns is at its limit. b2 is not
	// synced again (no slot is its), yet Get says what it waits for now.
	f.uncache(xPod)
	f.ex.podEvent(compactPod(xPod), true)
	if _, _, err := f.sync("b1"); err != nil || f.state("b1") != "Pending/Creating" {
		t.Fatalf("b1: %v %s", err, f.state("b1"))
	}
	if got := msg("b2"); got != "namespace ns at its limit of 1" {
		t.Errorf("b2 once b1 took the slot: %q", got)
	}
}
