// Package cli wires kubetask's cobra commands to the domain packages. It holds
// no logic of its own beyond flag parsing and output formatting.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/kubetask/kubetask/internal/version"
)

// ExitError carries a specific process exit code out of a command.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Execute runs the kubetask command line with args and returns the process exit code.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := NewRootCommand(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintln(stderr, "error:", ee.Err)
		}
		return ee.Code
	}
	fmt.Fprintln(stderr, "error:", err)
	return 1
}

// NewRootCommand builds the kubetask command tree.
func NewRootCommand(stdout, stderr io.Writer) *cobra.Command {
	var verbose bool
	root := &cobra.Command{
		Use:           "kubetask",
		Short:         "Run tasks as Kubernetes pods and report each outcome exactly once",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(cmd *cobra.Command, _ []string) {
			level := slog.LevelInfo
			switch {
			case verbose:
				level = slog.LevelDebug
			case cmd.Name() == "run":
				// kubetask run prints its own progress; the library's and
				// client-go's informational logs would only clutter it.
				level = slog.LevelWarn
			}
			h := slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})
			slog.SetDefault(slog.New(h))
			klog.SetLogger(logr.FromSlogHandler(h)) // one logger: client-go's klog goes through slog
		},
	}
	root.Version = version.String(version.Get()) // --version
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "log debug details to stderr")
	root.AddCommand(newClusterCommand())
	root.AddCommand(newNodeCommand())
	root.AddCommand(newRunCommand())
	root.AddCommand(newServeCommand())
	root.AddCommand(newClientCommands()...)
	root.AddCommand(newVersionCommand())
	return root
}
