// Package benchserve holds benchmarks of `kubetask serve`: the built binary,
// started as a user would, driven over HTTP on the local cluster.
//
//   - BenchmarkServeSubmit: tasks submitted by concurrent clients, run on
//     kwok nodes until each has an outcome; against a plain pod create loop
//     from as many clients.
//   - BenchmarkServeLogCapture: tasks whose real processes on the local
//     process node each write a large log, archived into the SQLite store.
//
// Run them one at a time, once:
//
//	go test ./test/benchserve -run '^$' -bench BenchmarkServeSubmit -benchtime 1x -timeout 30m
//	go test ./test/benchserve -run '^$' -bench BenchmarkServeLogCapture -benchtime 1x -timeout 40m
//
// Without -bench, `go test ./test/benchserve` runs the code of each
// benchmark once at a tiny size (TestServeSubmitTiny, TestServeLogCaptureTiny)
// on the same kind of cluster, so that it cannot rot. The numbers those print
// mean nothing.
package benchserve

import (
	"flag"
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// benchSimNodes is the number of kwok nodes of a benchmark run (as in
// test/bench); the tiny runs have one.
const benchSimNodes = 10

func TestMain(m *testing.M) {
	flag.Parse()
	sim := 1
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		sim = benchSimNodes
	}
	clustertest.MainWith(m, clustertest.Options{SimNodes: sim, LocalNodes: 1})
}
