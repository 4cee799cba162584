package cli

import "github.com/spf13/cobra"

func newClusterCommand() *cobra.Command {
	return &cobra.Command{Use: "cluster", Short: "Run a local Kubernetes cluster for development and tests"}
}
