// Command kubetask runs tasks as Kubernetes pods and reports each outcome exactly once.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubetask/kubetask/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
