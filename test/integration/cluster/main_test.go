// Package cluster holds tests against a real local cluster: etcd,
// kube-apiserver, kube-scheduler, kube-controller-manager, local process nodes
// and kwok nodes, shared by every test of this binary.
//
// In short: proves the local cluster, its local node and the task format
// against the real components; about 60 s in `go test ./...` on the 2-core CI
// machine.
package cluster

import (
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) {
	clustertest.MainWith(m, clustertest.Options{})
}
