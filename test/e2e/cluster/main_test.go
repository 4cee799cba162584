// Package cluster drives the built kubetask binary as a user would.
//
// In short: proves that `kubetask cluster` brings the local cluster up,
// reports it, takes it down and leaves no orphan when its supervisor is
// killed; about 50 s in `go test ./...` on the 2-core CI machine.
package cluster

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// kubetaskBin is the binary under test, built once per test binary.
var kubetaskBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kubetask-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	kubetaskBin, err = clustertest.BuildKubetask(ctx, dir)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
