package components

// Pinned versions. Change them here and in the matching tools/<module>/go.mod
// (TestToolsModulesMatchPins keeps the two in step).
const (
	// KubernetesVersion is the release of kube-apiserver, kube-scheduler and
	// kube-controller-manager, and of the k8s.io libraries kubetask uses.
	KubernetesVersion = "v1.37.2"
	// EtcdVersion is the etcd server release.
	EtcdVersion = "v3.6.16"
	// KwokVersion is the kwok release that simulates nodes at scale.
	KwokVersion = "v0.8.0"
	// JaegerVersion is the Jaeger release (all-in-one, its v2 binary built
	// on the OpenTelemetry Collector) that the tracing tests send spans to.
	JaegerVersion = "v1.75.0"
)

// Component is one binary the local cluster runs.
type Component struct {
	// Name is the binary's name, e.g. "kube-apiserver".
	Name string
	// Version is the pinned release; together with Name it keys the cache.
	Version string
	// Module is the directory under tools/ whose go.mod builds the binary.
	Module string
	// Package is the Go package built, relative to Module's requirements.
	Package string
	// LDFlags are passed to the linker (version stamping).
	LDFlags string
}

func kubeComponent(name string) Component {
	return Component{
		Name:    name,
		Version: KubernetesVersion,
		Module:  "kube",
		Package: "k8s.io/kubernetes/cmd/" + name,
		// Without these the server reports v0.0.0-master, which kubectl cannot parse.
		LDFlags: "-X k8s.io/component-base/version.gitVersion=" + KubernetesVersion +
			" -X k8s.io/component-base/version.gitMajor=1" +
			" -X k8s.io/component-base/version.gitMinor=37" +
			" -X k8s.io/component-base/version.gitTreeState=clean",
	}
}

// The components of the local cluster.
var (
	Etcd                  = Component{Name: "etcd", Version: EtcdVersion, Module: "etcd", Package: "."}
	KubeAPIServer         = kubeComponent("kube-apiserver")
	KubeScheduler         = kubeComponent("kube-scheduler")
	KubeControllerManager = kubeComponent("kube-controller-manager")
	// Kubectl is used by tests and examples; kubetask itself never shells out to it.
	Kubectl = kubeComponent("kubectl")
	Kwok    = Component{Name: "kwok", Version: KwokVersion, Module: "kwok", Package: "sigs.k8s.io/kwok/cmd/kwok"}
	// Jaeger receives OTLP spans and answers queries of them: the tracing
	// tests' receiver (docs/tracing.md); kubetask itself never runs it.
	Jaeger = Component{Name: "jaeger", Version: JaegerVersion, Module: "jaeger", Package: "github.com/jaegertracing/jaeger/cmd/jaeger"}
)

// All lists every component in the order a cold build makes them (the
// longest first, so that its progress shows early).
func All() []Component {
	return []Component{KubeAPIServer, Etcd, KubeScheduler, KubeControllerManager, Kubectl, Kwok, Jaeger}
}
