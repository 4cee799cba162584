// Package costs holds the costs of kubetask that cannot drift: counts, not
// times. The API requests and store calls per task of the real executor on
// each lifecycle path (success, a sidecar, a retry, a cancellation, an
// adoption) against the local cluster, the size of the kubetask binary and
// what it links. Each is an ordinary test with an exact or a tight bound,
// so that a change that adds a request per task fails CI; the bounds and how
// to update them are in docs/costs.md.
//
// In short: proves that requests and store calls per task, the binary's
// size and what it links stay within their bounds; about 30 s in `go test
// ./...` on the 2-core CI machine.
package costs

import (
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) { clustertest.MainWith(m, clustertest.Options{}) }
