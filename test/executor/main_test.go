// Package executor tests the executor against the real local cluster: the
// local process node for behaviour (sidecars, exit codes, deletions) and kwok
// nodes for scale, with apiserver restarts in the middle of runs, and an
// executor process killed with SIGKILL.
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
