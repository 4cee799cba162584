// Package components pins the versions of the control-plane binaries the local
// cluster runs (etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
// kwok) and builds them from the Go module proxy with the local Go toolchain.
//
// Every pinned version lives in this package (versions.go); the tools modules
// under tools/ in the repository require exactly these versions, which a test
// checks. Built binaries are cached under CacheDir/bin/<name>/<version>/<name>
// and reused: a component is built at most once per version per cache.
package components
