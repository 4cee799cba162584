// Package executor is `make bench`: the executor against S0 (a minimal client
// at the API server's ceiling) and the Kubernetes Job controller at equal
// client limits, at scale, and its memory per tracked pod, on the local
// cluster with kwok nodes. TestBenchTiny runs the same code with a few
// tasks in `go test ./...`.
//
//	go test ./test/bench/executor -run '^$' -bench BenchmarkExecutor -benchtime 1x -timeout 60m
//
// In short: measures the executor's throughput, requests and heap per task
// against S0 and the Job controller in one run (docs/benchmarks.md); about
// 70 s as TestBenchTiny in `go test ./...` on the 2-core CI machine, about
// 25 min for `make bench`.
package executor

import (
	"flag"
	"testing"

	"k8s.io/client-go/util/workqueue"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// benchNodes is the number of kwok nodes the benchmarks run on.
const benchNodes = 10

func TestMain(m *testing.M) {
	flag.Parse()
	workqueue.SetProvider(queueMetrics)
	nodes := 2 // TestBenchTiny
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		nodes = benchNodes
	}
	clustertest.MainWith(m, clustertest.Options{SimNodes: nodes, LocalNodes: -1, Profiling: profilesDir() != ""})
}
