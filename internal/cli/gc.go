package cli

import (
	"context"
	"fmt"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"time"
)

// ServeGCPercent is the garbage collector's target (GOGC) that `kubetask
// serve` runs with while its live heap is small, unless GOGC is set in its
// environment. The service's live heap is tens of MiB and a burst of
// submissions allocates quickly: at the runtime's default of 100 it
// collected 19-27 times during 500 submissions in 1.4 s, each cycle taking a
// quarter of the CPUs and making the requests in flight assist it
// (docs/benchmarks.md).
const ServeGCPercent = 400

// gcHeadroom bounds what ServeGCPercent costs: the garbage a heap may gather
// between two collections beyond the runtime's default is at most this much.
const gcHeadroom = 256 << 20

// gcPercentFor is the GOGC for a live heap of live bytes: ServeGCPercent
// while that lets at most gcHeadroom of garbage gather (a live heap up to
// 64 MiB), less above that, never below the runtime's default of 100 (from a
// live heap of 256 MiB on, the runtime's own behaviour).
func gcPercentFor(live uint64) int {
	if live == 0 {
		return ServeGCPercent
	}
	return int(min(ServeGCPercent, max(100, gcHeadroom*100/live)))
}

// tunesGC reports whether `kubetask serve` tunes GOGC, given the
// environment's GOGC (gogc, "" when unset): not when GOGC is set. A value the
// runtime does not take (it reads a whole number or exactly "off", and
// silently runs at 100 otherwise) is an error, so that a mistyped GOGC is not
// a silent default.
func tunesGC(gogc string) (tune bool, err error) {
	switch gogc {
	case "":
		return true, nil
	case "off":
		return false, nil
	default:
		if _, err := strconv.Atoi(gogc); err != nil {
			return false, fmt.Errorf("GOGC=%q: the Go runtime takes a percentage or \"off\"; unset it to let kubetask serve tune it (%d while the live heap is small)", gogc, ServeGCPercent)
		}
		return false, nil
	}
}

// tuneGC sets GOGC to gcPercentFor the live heap, now and every interval
// until ctx ends.
func tuneGC(ctx context.Context, every time.Duration) {
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	cur := -1
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		metrics.Read(live)
		var n uint64
		if live[0].Value.Kind() == metrics.KindUint64 {
			n = live[0].Value.Uint64()
		}
		if p := gcPercentFor(n); p != cur {
			debug.SetGCPercent(p)
			cur = p
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
