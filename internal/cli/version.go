package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/kubetask/kubetask/internal/version"
	"github.com/kubetask/kubetask/pkg/api"
)

// versions is what `kubetask version -o json|yaml` prints.
type versions struct {
	Client api.Version  `json:"client"`
	Server *api.Version `json:"server,omitempty"`
}

func newVersionCommand() *cobra.Command {
	cf := &clientFlags{}
	var output string
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print kubetask's version, and the server's when one is configured",
		Long: `Print the version, commit and build date of this kubetask, and those of the
kubetask server when one is configured (--server, $KUBETASK_SERVER or the client
config's server). A server that differs in minor version gets a warning on
stderr, as every client command gives.`,
		Example: `  kubetask version
  kubetask version --client -o json
  kubetask version --server https://kubetask.example:8443`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, outputTable, outputJSON, outputYAML); err != nil {
				return &ExitError{Code: ExitUsage, Err: err}
			}
			out := versions{Client: version.Get()}
			if !clientOnly {
				c, conn, err := connect(cmd, cf)
				if err != nil {
					return err
				}
				if conn.ServerFrom != serverFromDefault {
					if out.Server, err = c.Version(cmd.Context()); err != nil {
						return clientExit(cmd.Context(), conn, err)
					}
				}
			}
			if output != "" {
				return printObject(cmd.OutOrStdout(), output, out)
			}
			printVersions(cmd.OutOrStdout(), out)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or yaml")
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print the client's version only (ask no server)")
	cf.add(cmd.Flags())
	return cmd
}

func printVersions(w io.Writer, v versions) {
	line := func(who string, v api.Version) {
		fmt.Fprintf(w, "%s: %s\n", who, version.String(v))
	}
	line("Client", v.Client)
	if v.Server != nil {
		line("Server", *v.Server)
	}
}
