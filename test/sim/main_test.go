// Package sim tests kubetask's kwok-simulated nodes against a real control
// plane: kube-apiserver, etcd, kube-scheduler, kube-controller-manager and
// kwok running the stages in internal/localcluster/kwokstages.
package sim

import (
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) {
	clustertest.MainWith(m, clustertest.Options{SimNodes: 3, LocalNodes: -1})
}
