// Package integration holds tests against a real local cluster: etcd,
// kube-apiserver, kube-scheduler, kube-controller-manager, local process nodes
// and kwok nodes, shared by every test of this binary.
package integration

import (
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) {
	clustertest.MainWith(m, clustertest.Options{})
}
