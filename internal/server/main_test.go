package server_test

import (
	"os"
	"testing"

	"github.com/kubetask/kubetask/internal/pgtest"
)

// TestMain stops the PostgreSQL server of the tests that start one.
func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
