// A module outside kubetask that imports its library packages. check.sh copies it to a
// temporary directory, adds `replace github.com/kubetask/kubetask => <checkout>` and
// runs go mod tidy, go build and go vet: the library must resolve with a plain go get.
module example.com/kubetask-importcheck

go 1.26.0
