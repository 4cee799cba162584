package main

import (
	"os/exec"
	"strings"
	"testing"
)

// heavy lists packages the kubetask binary must not link, and why: every
// start of it (`kubetask run` among them) pays for everything it links, in
// package initialisation and in the binary's pages it touches
// (docs/benchmarks.md, "kubetask run against kubectl run").
var heavy = []struct{ pkg, why string }{
	{"plugin", "a binary that links Go's plugin package keeps every exported method and, with cgo, exports every symbol: 160 MB instead of 121 MB"},
	{"sigs.k8s.io/kustomize", "comes with cli-runtime's resource builder (genericclioptions) and brings plugin"},
	{"k8s.io/cli-runtime", "its genericclioptions brings kustomize; kubectl's connection flags are bound with clientcmd (internal/cli/kubeflags.go)"},
	{"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil", "its auth options bring kube-apiserver's server packages, etcd's client, gRPC, CEL and OpenTelemetry (526 packages); the local node wires virtual-kubelet's controllers itself (internal/localnode/vknode.go)"},
	{"k8s.io/apiserver/pkg/server/options", "kube-apiserver's server options: what nodeutil brought"},
	{"google.golang.org/grpc", "came with nodeutil (etcd's client, OpenTelemetry's exporters)"},
	{"go.etcd.io/etcd", "came with nodeutil (kube-apiserver's storage)"},
	{"github.com/google/cel-go", "came with nodeutil (kube-apiserver's admission)"},
}

// TestLinksNoHeavyPackages: the binary links none of heavy (nor any
// package under one of them).
func TestLinksNoHeavyPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, h := range heavy {
			if p == h.pkg || strings.HasPrefix(p, h.pkg+"/") {
				t.Errorf("links %s: %s", p, h.why)
			}
		}
	}
}
