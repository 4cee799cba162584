package executor

import (
	"testing"

	"github.com/kubetask/kubetask/pkg/store"
)

// TestRoomAtSubmit: a submission skips the slot plan (and e.mu) only when
// no task waits, its namespace has no limit of its own and a slot is free
// counting every admitted creation; whenever it does, the plan agrees that
// the task would not wait.
func TestRoomAtSubmit(t *testing.T) {
	for _, c := range []struct {
		name        string
		parallelism int
		nsLimit     int  // NamespaceParallelism of ns
		defaultNS   int  // DefaultNamespaceParallelism
		pods        int  // task pods in the cache
		admitted    int  // submitted and synced: creations admitted, not performed
		shown       bool // the admitted creations' pods are in the cache
		waiting     bool
		want        bool
		waits       bool // the plan says the next task waits
		free        int  // Free("ns"): negative, the tasks in line
	}{
		{name: "nothing runs", parallelism: 2, want: true, free: 2},
		{name: "a slot free", parallelism: 2, pods: 1, want: true, free: 1},
		{name: "every slot holds a pod", parallelism: 2, pods: 2, waits: true},
		{name: "the last slot admitted to a creation", parallelism: 2, pods: 1, admitted: 1, waits: true},
		{name: "a created pod counted once", parallelism: 3, pods: 1, admitted: 1, shown: true, want: true, free: 1},
		{name: "every slot taken, a created pod counted once", parallelism: 2, pods: 1, admitted: 1, shown: true, waits: true},
		{name: "a task waits", parallelism: 1, pods: 1, waiting: true, waits: true, free: -1},
		{name: "its namespace has a limit", parallelism: 10, nsLimit: 5, free: 5},
		{name: "namespaces have a default limit", parallelism: 10, defaultNS: 5, free: 5},
		{name: "its namespace's limit left", parallelism: 10, nsLimit: 3, pods: 2, free: 1},
		{name: "its namespace at its limit", parallelism: 10, nsLimit: 2, pods: 2, waits: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFx(t, func(cfg *Config) {
				cfg.Parallelism = c.parallelism
				cfg.DefaultNamespaceParallelism = c.defaultNS
				if c.nsLimit > 0 {
					cfg.NamespaceParallelism = map[string]int{"ns": c.nsLimit}
				}
			})
			for i := range c.pods {
				id := "run-" + string(rune('a'+i))
				f.submit(id, newTask())
				f.update(id, func(r *store.Record) { r.PodCreated = true })
				f.cache(f.podOf(id, 0, running()))
				if _, _, err := f.sync(id); err != nil { // out of the line
					t.Fatal(err)
				}
			}
			if n := f.ex.waiting.Load(); n != 0 {
				t.Fatalf("%d task(s) in line after their pods ran", n)
			}
			for i := range c.admitted {
				id := "new-" + string(rune('a'+i))
				f.submit(id, newTask())
				if _, _, err := f.sync(id); err != nil {
					t.Fatal(err)
				}
				if c.shown { // created, and the cache shows the pod
					f.ex.mu.Lock()
					name := f.ex.creations[id].name
					f.ex.mu.Unlock()
					f.drainCreations()
					pod := f.serverPod(name)
					if pod == nil {
						t.Fatalf("the pod %s of %s was not created", name, id)
					}
					f.cache(pod)
					f.ex.podEvent(compactPod(pod), false)
				}
			}
			if c.waiting {
				f.submit("waits", newTask())
				if _, _, err := f.sync("waits"); err != nil {
					t.Fatal(err)
				}
			}
			f.ex.mu.Lock()
			unseen := 0
			for _, cr := range f.ex.creations {
				if !cr.seen {
					unseen++
				}
			}
			f.ex.mu.Unlock()
			if got := f.ex.unseen.Load(); got != int64(unseen) {
				t.Errorf("unseen = %d, but %d creations are not shown by the cache", got, unseen)
			}
			if got := f.ex.roomAtSubmit("ns"); got != c.want {
				t.Errorf("roomAtSubmit = %v, want %v (waiting %d, admitted %d, cached pods %d)", got, c.want, f.ex.waiting.Load(), f.ex.unseen.Load(), f.ex.cachedPodCount())
			}
			if got := f.ex.Free("ns"); got != c.free {
				t.Errorf("Free = %d, want %d", got, c.free)
			}
			plan := f.ex.planAtSubmit(store.Record{ID: "next", Namespace: "ns", CreatedAt: f.clk.Now()}, 0)
			if c.want && plan != "" {
				t.Errorf("roomAtSubmit says a slot is free, but the plan says the task waits: %q", plan)
			}
			if got := plan != ""; got != c.waits {
				t.Errorf("the plan says %q, want waiting %v", plan, c.waits)
			}
			// Creations dropped, seen or not, leave none counted.
			for i := range c.admitted {
				f.ex.dropCreation("new-" + string(rune('a'+i)))
			}
			if got := f.ex.unseen.Load(); got != 0 {
				t.Errorf("unseen = %d after every creation was dropped", got)
			}
		})
	}
}
