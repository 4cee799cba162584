// Package hooks tests the local cluster's fault hooks against the real
// components: an apiserver restart (watchers get 410 Expired) and an etcd
// outage. It has its own cluster because these tests disturb it.
//
// In short: proves that the local cluster's fault hooks (an API server
// restart, an etcd outage) do what the fault suites rely on; about 50 s in `go
// test ./...` on the 2-core CI machine.
package hooks

import (
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) {
	clustertest.MainWith(m, clustertest.Options{LocalNodes: -1})
}
