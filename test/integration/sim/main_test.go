// Package sim tests kubetask's kwok-simulated nodes against a real control
// plane: kube-apiserver, etcd, kube-scheduler, kube-controller-manager and
// kwok running the stages in internal/localcluster/kwokstages.
//
// In short: proves that kwok-simulated nodes run pods as a real control
// plane expects; about 25 s in `go test ./...` on the 2-core CI machine.
package sim

import (
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) {
	clustertest.MainWith(m, clustertest.Options{SimNodes: 3, LocalNodes: -1})
}
