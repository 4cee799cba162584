// Package executor tests the executor against the real local cluster: the
// local process node for behaviour (sidecars, exit codes, deletions) and kwok
// nodes for scale, with apiserver restarts in the middle of runs.
package executor

import (
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) {
	clustertest.MainWith(m, clustertest.Options{SimNodes: 4})
}
