package cli

import (
	"fmt"
	"strconv"
)

// ServeGCPercent is the garbage collector's target (GOGC) that `kubetask
// serve` runs with unless GOGC is set in its environment. The service's live
// heap is small (tens of MiB) and a burst of submissions allocates quickly:
// at the runtime's default of 100 it collected 19-27 times during 500
// submissions in 1.4 s, each cycle taking a quarter of the CPUs from the
// requests in flight. At 400 the heap may grow to five times the live heap
// before a cycle (docs/serve.md gives the memory this costs); GOMEMLIMIT,
// which deploy/ sets from the container's memory limit, still bounds it.
const ServeGCPercent = 400

// serveGCPercent returns the GOGC that `kubetask serve` sets, given the
// environment's GOGC (gogc, "" when unset): ok is false when the
// environment's setting stands. A value the runtime does not take (it reads
// a whole number or exactly "off", and silently runs at 100 otherwise) is an
// error, so that a mistyped GOGC is not a silent default.
func serveGCPercent(gogc string) (percent int, ok bool, err error) {
	switch {
	case gogc == "":
		return ServeGCPercent, true, nil
	case gogc == "off":
		return 0, false, nil
	default:
		if _, err := strconv.Atoi(gogc); err != nil {
			return 0, false, fmt.Errorf("GOGC=%q: the Go runtime takes a percentage or \"off\"; unset it to run with kubetask serve's default of %d", gogc, ServeGCPercent)
		}
		return 0, false, nil
	}
}
