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
	// The first SIGINT/SIGTERM cancels the context with the signal as its cause, so
	// that commands can exit 128+signal.
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() { cancel(cli.Signalled{Signal: <-sigs}) }()
	code := cli.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	signal.Stop(sigs)
	cancel(nil)
	os.Exit(code)
}
