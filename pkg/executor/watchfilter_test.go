package executor

import (
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// TestFilteredWatchEndsAtStopWithAnEventInFlight: the pod cache's watch
// filter holds an event its consumer no longer reads (the reflector stopped
// reading when its context ended) and is stopped: its goroutine ends.
// watch.Filter's stayed blocked on its send for ever (one goroutine and one
// pod kept per Lease loss or shard hand-over that met an event on its way);
// the simulator's replicas scenario found it, as a goroutine left in its
// bubble. Here too, synctest fails the test on a goroutine left blocked.
func TestFilteredWatchEndsAtStopWithAnEventInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := watch.NewFakeWithChanSize(1, false)
		fw := filterWatch(in, func(ev watch.Event) (watch.Event, bool) { return ev, true })
		in.Add(&corev1.Pod{})
		synctest.Wait() // the loop took the event and waits for a reader
		fw.Stop()
		synctest.Wait()
		if _, open := <-fw.ResultChan(); open {
			t.Fatal("the filtered watch delivered an event after Stop; want its channel closed")
		}
	})
}

// TestFilteredWatchPassesAndFilters: events pass through the filter, in
// order, those it drops are not delivered, and the channel closes when the
// upstream watch ends.
func TestFilteredWatchPassesAndFilters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := watch.NewFakeWithChanSize(3, false)
		fw := filterWatch(in, func(ev watch.Event) (watch.Event, bool) { return ev, ev.Type != watch.Modified })
		in.Add(&corev1.Pod{})
		in.Modify(&corev1.Pod{})
		in.Delete(&corev1.Pod{})
		var got []watch.EventType
		for _, want := range []watch.EventType{watch.Added, watch.Deleted} {
			ev := <-fw.ResultChan()
			got = append(got, ev.Type)
			if ev.Type != want {
				t.Fatalf("events %v, want %s next", got, want)
			}
		}
		in.Stop()
		if _, open := <-fw.ResultChan(); open {
			t.Fatal("the filtered watch stays open after its upstream ended")
		}
	})
}
