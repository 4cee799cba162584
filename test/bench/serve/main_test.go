// Package serve holds benchmarks of `kubetask serve`: the built binary,
// started as a user would, driven over HTTP on the local cluster.
//
//   - BenchmarkServeSubmit: tasks submitted by concurrent clients, run on
//     kwok nodes until each has an outcome; against a plain pod create loop
//     from as many clients.
//   - BenchmarkServeLogCapture: tasks whose real processes on the local
//     process node each write a large log, archived into the SQLite store.
//   - BenchmarkServeReplicas: the same tasks through 1, 2 and 3 replicas on
//     PostgreSQL and one on SQLite, at the same client QPS per replica.
//
// Run them one at a time, once:
//
//	go test ./test/bench/serve -run '^$' -bench BenchmarkServeSubmit -benchtime 1x -timeout 30m
//	go test ./test/bench/serve -run '^$' -bench BenchmarkServeLogCapture -benchtime 1x -timeout 40m
//	go test ./test/bench/serve -run '^$' -bench BenchmarkServeReplicas -benchtime 1x -timeout 60m
//
// Without -bench, `go test ./test/bench/serve` runs the code of each
// benchmark once at a tiny size (TestServeSubmitTiny, TestServeLogCaptureTiny,
// TestServeReplicasTiny)
// on the same kind of cluster, so that it cannot rot. The numbers those print
// mean nothing.
//
// In short: measures `kubetask serve`'s submissions against plain creates,
// its log capture and its replicas; about 35 s in `go test ./...` (the Tiny
// tests) on the 2-core CI machine; `make bench-serve` is not timed as a whole
// (log capture alone about 10 min).
package serve

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
)

// benchSimNodes is the number of kwok nodes of a benchmark run (as in
// test/bench/executor); the tiny runs have one.
const benchSimNodes = 10

func TestMain(m *testing.M) {
	flag.Parse()
	sim := 1
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		sim = benchSimNodes
	}
	code := clustertest.Run(m, clustertest.Options{SimNodes: sim, LocalNodes: 1})
	if err := pgtest.StopShared(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}
