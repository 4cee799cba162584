package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/runner"
)

// newClientCommands builds the commands that talk to kubetask serve.
func newClientCommands() []*cobra.Command {
	return []*cobra.Command{
		newSubmitCommand(), newGetCommand(), newListCommand(), newLogsCommand(), newCancelCommand(), newRerunCommand(),
		newClustersCommand(),
	}
}

// clientExit is the exit of a client command whose call failed: quiet 128+signal
// when a signal ended it, else the error, explained.
func clientExit(ctx context.Context, conn *connection, err error) error {
	var sig Signalled
	if errors.As(context.Cause(ctx), &sig) {
		return &ExitError{Code: ExitCode(&runner.Outcome{Reason: podstate.ReasonCancelled}, sig)}
	}
	return conn.explain(err)
}

func newGetCommand() *cobra.Command {
	cf := &clientFlags{}
	var output string
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show a task: its state, why, its result and attempts (and, while Pending, its pod's events)",
		Example: `  kubetask get t01jb2c3d4e5f6g7h8j9k0m1n2p
  kubetask get nightly-2026-01-02 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outputTable, outputJSON, outputYAML); err != nil {
				return &ExitError{Code: ExitUsage, Err: err}
			}
			c, conn, err := connect(cmd, cf)
			if err != nil {
				return err
			}
			t, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return clientExit(cmd.Context(), conn, err)
			}
			if output != "" {
				return printObject(cmd.OutOrStdout(), output, t)
			}
			return printTask(cmd.OutOrStdout(), t, time.Now())
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or yaml: the task as the API reports it, with its document")
	cf.add(cmd.Flags())
	return cmd
}

type listFlags struct {
	opts     client.ListOptions
	selector string
	output   string
	watch    bool
}

func newListCommand() *cobra.Command {
	cf := &clientFlags{}
	f := &listFlags{}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List tasks, newest first (and with --watch, their changes)",
		Long: `List the tasks you may see, newest first, as a table (ID, NAMESPACE, NAME,
STATE, REASON, ATTEMPTS, AGE; -o wide adds CLUSTER, EXIT, LABELS and MESSAGE).

Without --limit every page is listed; with --limit one page, and the flag that
gets the next. With --watch the changes of the tasks the filters select follow,
one line per change of state, until Ctrl-C (-o json: the list, then one event
per line; -o yaml: one document per event).`,
		Example: `  kubetask list
  kubetask list -n jobs --phase Failed -l team=data
  kubetask list --limit 20 && kubetask list --limit 20 --continue TOKEN
  kubetask list --watch`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(f.output, outputTable, outputWide, outputJSON, outputYAML); err != nil {
				return &ExitError{Code: ExitUsage, Err: err}
			}
			if f.opts.Limit < 0 {
				return &ExitError{Code: ExitUsage, Err: fmt.Errorf("--limit must be positive, got %d", f.opts.Limit)}
			}
			c, conn, err := connect(cmd, cf)
			if err != nil {
				return err
			}
			f.opts.LabelSelector = f.selector
			err = listTasks(cmd.Context(), c, f, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return clientExit(cmd.Context(), conn, err)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.opts.Namespace, "namespace", "n", "", "only tasks in this namespace (default: every namespace you may list)")
	fl.StringVar(&f.opts.Phase, "phase", "", "only tasks in this phase: Pending, Running, Succeeded or Failed")
	fl.StringVar(&f.opts.Reason, "reason", "", "only tasks with this reason (docs/states.md), such as Unschedulable or ExitCode")
	fl.StringVar(&f.opts.NamePrefix, "name-prefix", "", "only tasks whose name starts with this")
	fl.StringVarP(&f.selector, "selector", "l", "", "only tasks with these labels: key=value pairs separated by commas")
	fl.StringVar(&f.opts.Cluster, "cluster", "", "only tasks placed on this cluster (a service with several clusters)")
	fl.IntVar(&f.opts.Limit, "limit", 0, "list one page of at most this many tasks (1 to 1000), and say how to get the next")
	fl.StringVar(&f.opts.Continue, "continue", "", "the continue token of the previous page (same filters)")
	fl.StringVarP(&f.output, "output", "o", "", "wide, json or yaml")
	fl.BoolVarP(&f.watch, "watch", "w", false, "after the list, print the changes of the tasks as they happen")
	cf.add(fl)
	return cmd
}

// listTasks prints the page (with --limit) or every page of tasks, then, with
// watch, their changes.
func listTasks(ctx context.Context, c *client.Client, f *listFlags, stdout, stderr io.Writer) error {
	list, err := listPages(ctx, c, f.opts)
	if err != nil {
		return err
	}
	table := newTaskTable(stdout, f.output == outputWide, time.Now)
	switch f.output {
	case outputJSON, outputYAML:
		if err := printObject(stdout, f.output, list); err != nil {
			return err
		}
	default:
		for i := range list.Items {
			table.add(rowOf(&list.Items[i]))
		}
		if len(list.Items) == 0 {
			fmt.Fprintln(stderr, "no tasks")
		}
		if err := table.flush(); err != nil {
			return err
		}
	}
	if list.Continue != "" {
		fmt.Fprintf(stderr, "more tasks: add --continue %s\n", list.Continue)
	}
	if !f.watch {
		return nil
	}
	return watchList(ctx, c, f, list, table, stdout, stderr)
}

// listPages lists one page with a limit, every page without.
func listPages(ctx context.Context, c *client.Client, opts client.ListOptions) (*api.TaskList, error) {
	if opts.Limit > 0 {
		return c.List(ctx, opts)
	}
	first, err := c.List(ctx, opts)
	if err != nil {
		return nil, err
	}
	for next := first.Continue; next != ""; {
		opts.Continue = next
		page, err := c.List(ctx, opts)
		if err != nil {
			return nil, err
		}
		first.Items = append(first.Items, page.Items...)
		next = page.Continue
	}
	first.Continue = ""
	return first, nil
}

// watchList prints a line for each change of the tasks the filters select,
// from the list's cursor, until ctx ends. After an Expired event it lists
// again.
func watchList(ctx context.Context, c *client.Client, f *listFlags, list *api.TaskList, table *taskTable, stdout, stderr io.Writer) error {
	rows := map[string]row{}
	for i := range list.Items {
		rows[list.Items[i].ID] = rowOf(&list.Items[i])
	}
	opts := client.WatchOptions{
		Cursor: list.Cursor, Namespace: f.opts.Namespace, Phase: f.opts.Phase, Reason: f.opts.Reason,
		NamePrefix: f.opts.NamePrefix, LabelSelector: f.opts.LabelSelector, Cluster: f.opts.Cluster,
	}
	_, err := c.Watch(ctx, opts, func(ev api.Event) error {
		if ev.Type == api.EventExpired {
			fmt.Fprintln(stderr, "events were missed (the server restarted?): listing again")
			again, err := listPages(ctx, c, client.ListOptions{
				Namespace: f.opts.Namespace, Phase: f.opts.Phase, Reason: f.opts.Reason, NamePrefix: f.opts.NamePrefix, LabelSelector: f.opts.LabelSelector,
			})
			if err != nil {
				return err
			}
			for i := range again.Items {
				r := rowOf(&again.Items[i])
				if old, ok := rows[r.id]; !ok || !old.sameState(r) {
					rows[r.id] = r
					if err := printChange(stdout, f.output, table, r, nil); err != nil {
						return err
					}
				}
			}
			return nil
		}
		r, known := rows[ev.TaskID]
		if !known {
			r = row{id: ev.TaskID, created: ev.Time}
			if ev.Type != "Submitted" {
				if t, err := c.Get(ctx, ev.TaskID); err == nil {
					r = rowOf(t)
				}
			}
		}
		next := r
		next.namespace, next.name = orKeep(ev.Namespace, r.namespace), orKeep(ev.Name, r.name)
		next.phase, next.reason, next.attempts = orKeep(ev.Phase, r.phase), orKeep(ev.Reason, r.reason), max(ev.Attempt+1, r.attempts)
		if ev.Attempt+1 >= r.attempts {
			next.cluster = orKeep(ev.Cluster, r.cluster)
		}
		if ev.Message != "" {
			next.message = ev.Message
		}
		if ev.ExitCode != nil {
			next.exit = ev.ExitCode
		}
		changed := !known || !next.sameState(r)
		rows[ev.TaskID] = next
		if !changed && (f.output == outputTable || f.output == outputWide) {
			return nil
		}
		return printChange(stdout, f.output, table, next, &ev)
	})
	return err
}

// sameState reports whether two rows of a task show the same state.
func (r row) sameState(o row) bool {
	return r.phase == o.phase && r.reason == o.reason && r.attempts == o.attempts
}

func orKeep(s, old string) string {
	if s == "" {
		return old
	}
	return s
}

// printChange prints a row of the table, or the event as a JSON line or a
// YAML document.
func printChange(w io.Writer, output string, table *taskTable, r row, ev *api.Event) error {
	switch output {
	case outputJSON, outputYAML:
		var v any = ev
		if ev == nil {
			v = map[string]any{"type": "Listed", "taskId": r.id, "phase": r.phase, "reason": r.reason}
		}
		if output == outputYAML {
			fmt.Fprintln(w, "---")
			return printObject(w, output, v)
		}
		b, err := jsonLine(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	table.add(r)
	return table.flush()
}

func newLogsCommand() *cobra.Command {
	cf := &clientFlags{}
	var (
		follow    bool
		attempt   int
		container string
	)
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print a task's log (the main container's of its current attempt by default), as archived: the raw bytes",
		Long: `Print the archived log of one container of one attempt of a task on stdout,
byte for byte, with nothing added. With -f, go on as the log grows until it is
complete; dropped connections are resumed from the byte reached.`,
		Example: `  kubetask logs t01jb2c3d4e5f6g7h8j9k0m1n2p
  kubetask logs nightly-2026-01-02 -f
  kubetask logs nightly-2026-01-02 --attempt 0 -c envoy`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := client.LogOptions{Container: container, Follow: follow}
			if cmd.Flags().Changed("attempt") {
				if attempt < 0 {
					return &ExitError{Code: ExitUsage, Err: fmt.Errorf("--attempt must be 0 or more, got %d", attempt)}
				}
				opts.Attempt = &attempt
			}
			c, conn, err := connect(cmd, cf)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			r, err := c.Logs(ctx, args[0], opts)
			if err != nil {
				return clientExit(ctx, conn, err)
			}
			defer func() { _ = r.Close() }()
			if _, err := io.Copy(cmd.OutOrStdout(), r); err != nil {
				return clientExit(ctx, conn, err)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&follow, "follow", "f", false, "go on as the log grows, until it is complete")
	fl.IntVar(&attempt, "attempt", 0, "the attempt, 0 for the first (default: the current one)")
	fl.StringVarP(&container, "container", "c", "", "the container (default: the task's main container)")
	cf.add(fl)
	return cmd
}

func newCancelCommand() *cobra.Command {
	cf := &clientFlags{}
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a task: it ends Failed/Cancelled unless its main container finished already",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, conn, err := connect(cmd, cf)
			if err != nil {
				return err
			}
			before, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return clientExit(cmd.Context(), conn, err)
			}
			t, err := c.Cancel(cmd.Context(), args[0])
			if err != nil {
				return clientExit(cmd.Context(), conn, err)
			}
			switch {
			case before.Terminal:
				fmt.Fprintf(cmd.OutOrStdout(), "task %s finished already (%s): nothing to cancel\n", t.ID, state(t.Phase, t.Reason))
			case before.CancelledAt != nil:
				fmt.Fprintf(cmd.OutOrStdout(), "task %s: cancellation was requested already (%s)\n", t.ID, state(t.Phase, t.Reason))
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "task %s: cancellation requested (%s); kubetask get %s shows the outcome\n", t.ID, state(t.Phase, t.Reason), shellWord(t.ID))
			}
			return nil
		},
	}
	cf.add(cmd.Flags())
	return cmd
}

func newRerunCommand() *cobra.Command {
	cf := &clientFlags{}
	var (
		id    string
		await awaitFlags
	)
	cmd := &cobra.Command{
		Use:   "rerun ID",
		Short: "Run a finished task again, as a new task (whose origin is ID); print the new task's ID",
		Long: `Submit the document of a finished task again as a new task and print the new
task's ID. With --id the rerun is idempotent (running the command again returns
the same new task). --wait and --follow wait for the new task as submit does.`,
		Example: `  kubetask rerun nightly-2026-01-02
  kubetask rerun nightly-2026-01-02 --id nightly-2026-01-02-again --follow`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := await.validate(); err != nil {
				return &ExitError{Code: ExitUsage, Err: err}
			}
			c, conn, err := connect(cmd, cf)
			if err != nil {
				return err
			}
			t, created, err := c.Rerun(cmd.Context(), args[0], client.RerunOptions{ID: id})
			if err != nil {
				return submitError(conn, err)
			}
			return reportSubmitted(cmd, c, conn, t, created, &await, "submitted as a rerun of "+args[0])
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "the new task's ID: makes the rerun idempotent; default: one the server makes")
	await.add(cmd)
	cf.add(cmd.Flags())
	return cmd
}

func jsonLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding the output: %w", err)
	}
	return append(b, '\n'), nil
}
