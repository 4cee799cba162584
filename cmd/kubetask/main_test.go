package main

import (
	"os"
	"os/exec"
	"path/filepath"
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

// unreached lists symbol prefixes the built binary must not contain, and
// why: code of packages it must import, which it must never reach.
var unreached = []struct{ prefix, why string }{
	{"k8s.io/client-go/informers.(*sharedInformerFactory)", "a SharedInformerFactory reaches an informer and a lister " +
		"for every resource of every API group (ForResource), and the linker keeps every exported method of a type " +
		"the binary uses through an interface (cobra's templates look methods up by name): 104 MB instead of 90 MB, " +
		"kubetask run peaking 2.6 MiB higher; build each informer with its type's constructor (internal/localnode/informers.go)"},
}

// TestLinksNoUnreachedCode: the binary, built as make build builds it,
// has no symbol of unreached. (leaderelection imports client-go's
// informers package, so only the linked binary tells.)
func TestLinksNoUnreachedCode(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kubetask")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	for _, u := range unreached {
		var found []string
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) >= 3 && strings.HasPrefix(f[len(f)-1], u.prefix) {
				found = append(found, f[len(f)-1])
			}
		}
		if len(found) > 0 {
			t.Errorf("links %d symbols of %s (%s, ...): %s", len(found), u.prefix, found[0], u.why)
		}
	}
}
