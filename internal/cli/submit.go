package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/runner"
)

// awaitFlags are the flags of the commands that may wait for the task they
// submit (submit, rerun).
type awaitFlags struct {
	wait, follow, quiet bool
	output              string
}

func (f *awaitFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&f.wait, "wait", false, "wait for the outcome and exit with it (as kubetask run does)")
	fl.BoolVar(&f.follow, "follow", false, "print the main container's log while the task runs (each attempt's in turn), then wait for the outcome (implies --wait)")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress on stderr while waiting")
	fl.StringVarP(&f.output, "output", "o", "", "json or yaml: print the task (with --wait, the finished task) instead of its ID")
}

func (f *awaitFlags) validate() error {
	if err := checkOutput(f.output, outputTable, outputJSON, outputYAML); err != nil {
		return err
	}
	if f.follow && f.output != "" {
		return errors.New("--follow prints the log on stdout: it does not take -o")
	}
	return nil
}

type submitFlags struct {
	file, namespace, id string
	await               awaitFlags
}

func newSubmitCommand() *cobra.Command {
	f := &submitFlags{}
	cf := &clientFlags{}
	cmd := &cobra.Command{
		Use:   "submit -f FILE",
		Short: "Submit a task (or pod manifest) to kubetask serve; optionally wait for it and follow its log",
		Long: `Submit a task to the server (kubetask serve) and print its ID on stdout.

The namespace is -n, else the document's metadata.namespace, else "default".
With --id the submission is idempotent: submitting the same document with the
same ID again returns the existing task (exit 0) instead of running it twice;
another document under a taken ID is refused.

With --wait (or --follow, which prints the main container's log as it runs)
the command waits for the outcome and exits as kubetask run does: 0 when the
task succeeded, the main container's exit code, or one of the codes of
docs/run.md. Ctrl-C stops waiting; the task goes on. 64: bad flags or a
document the server refused; 65: the server could not be reached or refused
the request.`,
		Example: `  kubetask submit -f task.yaml
  kubetask submit -f task.yaml -n jobs --id nightly-2026-01-02 --wait
  kubetask submit -f task.yaml --follow
  kubetask submit -f - -o json < pod.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.validate(); err != nil {
				return &ExitError{Code: ExitUsage, Err: err}
			}
			doc, err := readDocument(f.file, cmd.InOrStdin())
			if err != nil {
				return &ExitError{Code: ExitUsage, Err: err}
			}
			ns, err := resolveNamespace(f.namespace, cmd.Flags().Changed("namespace"), documentNamespace(doc), "")
			if err != nil {
				return &ExitError{Code: ExitUsage, Err: err}
			}
			c, conn, err := connect(cmd, cf)
			if err != nil {
				return err
			}
			t, created, err := c.Submit(cmd.Context(), ns, doc, client.SubmitOptions{ID: f.id})
			if err != nil {
				return submitError(conn, err)
			}
			return reportSubmitted(cmd, c, conn, t, created, &f.await, "submitted")
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.file, "filename", "f", "", "task or pod manifest (YAML or JSON); - reads stdin")
	fl.StringVarP(&f.namespace, "namespace", "n", "", "namespace to run the task in (default: the document's, else default)")
	fl.StringVar(&f.id, "id", "", "task ID (printable text up to 512 bytes, no '/', such as an Airflow task-instance key): makes the submission idempotent; default: one the server makes")
	f.await.add(cmd)
	cf.add(fl)
	return cmd
}

func (f *submitFlags) validate() error {
	var errs []error
	if f.file == "" {
		errs = append(errs, errors.New("-f FILE is required (- reads stdin)"))
	}
	if err := f.await.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// readDocument reads the task document from a file or, for "-", stdin.
func readDocument(file string, stdin io.Reader) ([]byte, error) {
	var (
		b   []byte
		err error
	)
	if file == "-" {
		b, err = io.ReadAll(stdin)
	} else {
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the task: %w", err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil, fmt.Errorf("the task document %s is empty", file)
	}
	return b, nil
}

// documentNamespace is the metadata.namespace of a task or pod document (JSON
// or YAML), "" when it has none or cannot be read (the server then says
// what is wrong with it).
func documentNamespace(doc []byte) string {
	var d struct {
		Metadata struct {
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if yaml.Unmarshal(doc, &d) != nil {
		return ""
	}
	return d.Metadata.Namespace
}

// submitError is the exit of a refused submission or rerun: 64 when the
// document or the flags are at fault, 65 when the server is unreachable or
// refuses the caller.
func submitError(conn *connection, err error) error {
	code := ExitCluster
	switch client.StatusCode(err) {
	case http.StatusBadRequest, http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		code = ExitUsage
	}
	return &ExitError{Code: code, Err: conn.explain(err)}
}

// reportSubmitted prints a submitted (or rerun) task and, when asked, waits
// for it.
func reportSubmitted(cmd *cobra.Command, c *client.Client, conn *connection, t *api.Task, created bool, f *awaitFlags, verb string) error {
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if !f.quiet {
		if created {
			fmt.Fprintf(stderr, "task %s %s: %s/%s\n", t.ID, verb, t.Namespace, t.Name)
		} else {
			fmt.Fprintf(stderr, "task %s exists already with the same document (%s/%s): %s\n", t.ID, t.Namespace, t.Name, state(t.Phase, t.Reason))
		}
	}
	if !f.wait && !f.follow {
		if f.output != "" {
			return printObject(stdout, f.output, t)
		}
		fmt.Fprintln(stdout, t.ID)
		return nil
	}
	return awaitTask(cmd.Context(), c, conn, t.ID, f, stdout, stderr)
}

// awaitTask waits for task id's outcome, printing progress to stderr and,
// with follow, the main container's log of each attempt to stdout; it prints
// the outcome and returns the exit code of kubetask run for it.
func awaitTask(ctx context.Context, c *client.Client, conn *connection, id string, f *awaitFlags, stdout, stderr io.Writer) error {
	start := time.Now()
	t, cursor, err := c.GetWithCursor(ctx, id)
	pctx, stopProgress := context.WithCancel(ctx)
	defer stopProgress()
	progressDone := make(chan struct{})
	if err == nil && !t.Terminal && !f.quiet {
		// Progress from the read on, until the outcome's event.
		p := &progress{w: stderr, start: start}
		go func() {
			defer close(progressDone)
			_, _ = c.Watch(pctx, client.WatchOptions{TaskID: id, Cursor: cursor}, p.event)
		}()
	} else {
		close(progressDone)
	}
	if err == nil && f.follow {
		err = followLogs(ctx, c, id, stdout, stderr)
	}
	if err == nil {
		t, err = c.Wait(ctx, id)
	}
	if err == nil {
		// Let the progress print the outcome's event (it may lag behind).
		select {
		case <-progressDone:
		case <-time.After(2 * time.Second):
		}
	}
	stopProgress()
	<-progressDone
	if err != nil {
		var sig Signalled
		if errors.As(context.Cause(ctx), &sig) || errors.Is(err, context.Canceled) {
			return &ExitError{
				Code: ExitCode(&runner.Outcome{Reason: podstate.ReasonCancelled}, context.Cause(ctx)),
				Err:  fmt.Errorf("stopped waiting; task %s goes on (kubetask get %s, kubetask cancel %s)", id, shellWord(id), shellWord(id)),
			}
		}
		return &ExitError{Code: ExitCluster, Err: conn.explain(err)}
	}
	if f.output != "" {
		if err := printObject(stdout, f.output, t); err != nil {
			return err
		}
	}
	printOutcome(stderr, t, f.quiet, time.Since(start))
	o := &runner.Outcome{Phase: podstate.Phase(t.Phase), Reason: podstate.Reason(t.Reason), ExitCode: t.ExitCode}
	if code := ExitCode(o, nil); code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

// followLogs copies the main container's log of each attempt of task id to
// stdout, in turn, until the log of the task's last attempt ended. Without a
// log archive on the server it says so and returns.
func followLogs(ctx context.Context, c *client.Client, id string, stdout, stderr io.Writer) error {
	for attempt := 0; ; attempt++ {
		r, err := c.Logs(ctx, id, client.LogOptions{Attempt: &attempt, Follow: true})
		if client.StatusCode(err) == http.StatusNotImplemented {
			fmt.Fprintln(stderr, "the server keeps no logs: waiting for the outcome without them")
			return nil
		}
		if err != nil {
			return err
		}
		_, err = io.Copy(stdout, r)
		_ = r.Close()
		if err != nil {
			return fmt.Errorf("copying the log of attempt %d: %w", attempt, err)
		}
		// The attempt's log ended: go on with the next attempt, if any.
		t, err := c.WaitUntil(ctx, id, func(t *api.Task) bool { return t.Terminal || t.Attempt > attempt })
		if err != nil {
			return err
		}
		if t.Attempt <= attempt {
			return nil
		}
		fmt.Fprintf(stderr, "--- log of attempt %d ---\n", attempt+1)
	}
}

// progress prints a task's events to stderr, as kubetask run prints its
// progress.
type progress struct {
	w     io.Writer
	start time.Time
}

func (p *progress) event(ev api.Event) error {
	var what string
	switch ev.Type {
	case "State":
		what = state(ev.Phase, ev.Reason)
		if ev.Message != "" {
			what += ": " + ev.Message
		}
	case "AttemptFinished":
		what = fmt.Sprintf("attempt %d finished: %s", ev.Attempt, state(ev.Phase, ev.Reason))
		if ev.Message != "" {
			what += ": " + ev.Message
		}
		if !ev.Terminal {
			what += " (another attempt follows)"
		}
	case "PodCreated", "PodAdopted":
		what = strings.ToLower(strings.TrimPrefix(ev.Type, "Pod")) + " pod " + ev.Pod
	case api.EventExpired:
		what = "events were missed (the server restarted?); the outcome is read again at the end"
	default:
		what = strings.ToLower(strings.TrimPrefix(ev.Type, "Pod"))
	}
	fmt.Fprintf(p.w, "[%6.1fs] %s\n", time.Since(p.start).Seconds(), what)
	if ev.Terminal {
		return client.ErrStopWatch
	}
	return nil
}

// printOutcome prints a finished task's outcome like kubetask run does: the
// state and, for a success, the result (unless quiet); for a failure, where
// to look.
func printOutcome(w io.Writer, t *api.Task, quiet bool, waited time.Duration) {
	attempts := fmt.Sprintf("%d attempts", t.Attempt+1)
	if t.Attempt == 0 {
		attempts = "1 attempt"
	}
	msg := ""
	if t.Message != "" {
		msg = ": " + t.Message
	}
	if t.Phase == string(podstate.Succeeded) {
		if quiet {
			return
		}
		fmt.Fprintf(w, "outcome: %s%s (task %s, %s; waited %.1fs)\n", state(t.Phase, t.Reason), msg, t.ID, attempts, waited.Seconds())
		if r := t.ResultBytes(); r != nil {
			fmt.Fprintf(w, "result: %s\n", resultText(t))
		}
		return
	}
	fmt.Fprintf(w, "outcome: FAILED %s%s (task %s, %s; waited %.1fs)\n", state(t.Phase, t.Reason), msg, t.ID, attempts, waited.Seconds())
	fmt.Fprintf(w, "see: kubetask get %s; kubetask logs %s --attempt %d\n", shellWord(t.ID), shellWord(t.ID), t.Attempt)
}
