// A module outside kubetask that imports its library packages. check.sh copies it to a
// temporary directory, gets github.com/kubetask/kubetask at HEAD from a module proxy of
// files (no replace directive) and runs go mod tidy, go build and go vet.
module example.com/kubetask-importcheck

go 1.26.0
