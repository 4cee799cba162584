// Package faults tests the local cluster's fault hooks against the real
// components: an apiserver restart (watchers get 410 Expired) and an etcd
// outage. It has its own cluster because these tests disturb it.
package faults

import (
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

func TestMain(m *testing.M) {
	clustertest.MainWith(m, clustertest.Options{LocalNodes: -1})
}
