package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubetask/kubetask/pkg/api"
)

// newClustersCommand is `kubetask clusters`: the clusters of a kubetask
// serve with several (its configuration's clusters), and their drain.
// (`kubetask cluster` is the local development cluster.)
func newClustersCommand() *cobra.Command {
	cf := &clientFlags{}
	var output string
	cmd := &cobra.Command{
		Use:   "clusters",
		Short: "List the clusters of a kubetask serve with several: their states, since when, why",
		Long: `List the clusters a kubetask serve places tasks on (the clusters of its
configuration) with their states: Ready (tasks are placed there), Draining
(no new task; running ones finish), Unreachable, Lost or Returning. It needs
a caller allowed every namespace. A service on one cluster lists none.
(kubetask cluster, singular, runs the local development cluster.)`,
		Example: `  kubetask clusters
  kubetask clusters drain east
  kubetask clusters resume east`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, outputTable, outputJSON, outputYAML); err != nil {
				return &ExitError{Code: ExitUsage, Err: err}
			}
			c, conn, err := connect(cmd, cf)
			if err != nil {
				return err
			}
			l, err := c.Clusters(cmd.Context())
			if err != nil {
				return clientExit(cmd.Context(), conn, err)
			}
			if output != "" {
				return printObject(cmd.OutOrStdout(), output, l)
			}
			return printClusters(cmd.OutOrStdout(), l.Items, time.Now())
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or yaml")
	cf.add(cmd.Flags())
	cmd.AddCommand(newDrainCommand(true), newDrainCommand(false), newLoseCommand())
	return cmd
}

// newDrainCommand is `kubetask clusters drain NAME` (draining) or
// `kubetask clusters resume NAME`.
func newDrainCommand(draining bool) *cobra.Command {
	cf := &clientFlags{}
	use, short := "drain NAME", "Stop placing new tasks on a cluster; its running tasks finish there"
	if !draining {
		use, short = "resume NAME", "Place tasks on a drained cluster again"
	}
	cmd := &cobra.Command{
		Use: use, Short: short,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, conn, err := connect(cmd, cf)
			if err != nil {
				return err
			}
			cl, err := c.DrainCluster(cmd.Context(), args[0], draining)
			if err != nil {
				return clientExit(cmd.Context(), conn, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cluster %s: %s since %s\n", cl.Name, cl.State, cl.Since.Format(time.RFC3339))
			return nil
		},
	}
	cf.add(cmd.Flags())
	return cmd
}

// newLoseCommand is `kubetask clusters lose NAME --yes`.
func newLoseCommand() *cobra.Command {
	cf := &clientFlags{}
	var yes bool
	cmd := &cobra.Command{
		Use:   "lose NAME --yes",
		Short: "Declare a cluster lost: its tasks run again elsewhere (at least once for those that had a pod there)",
		Long: `Declare a cluster lost, for one that will not answer again soon: no task is
placed on it any more; each of its tasks whose current attempt has a pod
ends that attempt Failed/ClusterLost and runs its next attempt on another
cluster, and the others move there. The lost pods may still run where
nobody sees them: for those attempts this is at least once, not exactly
once. If the cluster answers again, its lost pods are stopped and what they
did is recorded as discarded, never as the task's outcome. Repeatable.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				return &ExitError{Code: ExitUsage, Err: fmt.Errorf("declaring cluster %s lost runs its tasks' attempts again elsewhere while their pods may still run there (at least once): add --yes to do it", args[0])}
			}
			c, conn, err := connect(cmd, cf)
			if err != nil {
				return err
			}
			cl, err := c.LoseCluster(cmd.Context(), args[0])
			if err != nil {
				return clientExit(cmd.Context(), conn, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cluster %s: %s since %s: %s\n", cl.Name, cl.State, cl.Since.Format(time.RFC3339), cl.Message)
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "declare it: its lost attempts run again elsewhere (at least once)")
	cf.add(cmd.Flags())
	return cmd
}

// printClusters writes clusters as a table: NAME, STATE, SINCE, LABELS,
// MESSAGE.
func printClusters(w io.Writer, clusters []api.Cluster, now time.Time) error {
	if len(clusters) == 0 {
		_, err := fmt.Fprintln(w, "no clusters: the service runs tasks on one cluster (no clusters in its configuration)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tSINCE\tLABELS\tMODE\tMESSAGE")
	for _, c := range clusters {
		since := "-"
		if !c.Since.IsZero() {
			since = age(now, c.Since)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.Name, c.State, since, orDash(labelText(c.Labels)), orDash(c.Mode), oneLine(c.Message, 80))
	}
	return tw.Flush()
}
