// Package e2e drives the built kubetask binary as a user would.
package e2e

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
