// Package executor tests the executor against the real local cluster: the
// local process node for behaviour (sidecars, exit codes, deletions) and kwok
// nodes for scale, with apiserver restarts in the middle of runs, and an
// executor process killed with SIGKILL.
//
// In short: proves the executor's lifecycle (outcomes, sidecars, deletions,
// limits, restarts, a SIGKILLed executor) on a real cluster; about 2.5 min in
// `go test ./...` on the 2-core CI machine.
package executor

import (
	"os"
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	clustertest.MainWith(m, clustertest.Options{SimNodes: 4})
}
