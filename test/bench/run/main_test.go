// Package run is `make bench-run`: the built `kubetask run -f pod.yaml`
// against `kubectl run --rm -i --restart=Never --image=busybox` on the same
// local cluster (one local process node), a one-line pod each, in
// alternating pairs; it prints both tools' wall time, peak RSS and CPU time
// per process, their medians and the ratios, in one run. TestRunBenchTiny
// runs the same code with one pair in `go test ./...` and checks only that
// both commands worked.
//
//	go test ./test/bench/run -run '^$' -bench BenchmarkRun -benchtime 1x -pairs 12
//	# also -baseline /path/to/an/older/kubetask ($KUBETASK_BENCH_BASELINE_BIN): a third
//	# column, the same pod run by it, and kubetask over it per round;
//	# $KUBETASK_BENCH_BIN runs that kubetask binary instead of building this checkout's
//
// In short: measures `kubetask run` against `kubectl run` (wall, peak RSS,
// CPU) in alternating pairs; about 20 s in `go test ./...` (TestRunBenchTiny)
// on the 2-core CI machine, about 2 min for `make bench-run`.
package run

import (
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) { clustertest.MainWith(m, clustertest.Options{}) }
