// Package bench holds benchmarks of kubetask against the local cluster on
// kwok nodes. The cluster starts only when a benchmark is selected
// (-bench), so `go test ./...` runs just the cheap unit tests here.
//
//	go test ./test/bench -run '^$' -bench BenchmarkExecutor -benchtime 1x -timeout 60m
package bench

import (
	"flag"
	"os"
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// benchNodes is the number of kwok nodes the benchmarks run on.
const benchNodes = 10

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	clustertest.MainWith(m, clustertest.Options{SimNodes: benchNodes, LocalNodes: -1})
}
