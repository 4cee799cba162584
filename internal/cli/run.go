package cli

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/runner"
	"github.com/kubetask/kubetask/pkg/task"
)

// Exit codes of `kubetask run` other than the main container's own exit code.
// They are documented in docs/run.md; scripts may rely on them.
const (
	ExitUsage           = 64 // bad flags, unreadable or invalid task
	ExitCluster         = 65 // the cluster could not be reached or refused a request
	ExitAttach          = 66 // --attach found no unfinished pod, or several
	ExitImagePull       = 67 // ImagePullFailed, InvalidImage
	ExitConfig          = 68 // ConfigError (missing ConfigMap/Secret, ...)
	ExitSchedule        = 69 // ScheduleTimeout (unschedulable)
	ExitStartupTimeout  = 70 // StartupTimeout
	ExitRunTimeout      = 71 // RunTimeout, DeadlineExceeded
	ExitDisrupted       = 72 // Evicted, Preempted, NodeLost, PodFailed
	ExitDeleted         = 73 // DeletedExternally
	ExitInitFailed      = 74 // InitFailed
	ExitResult          = 75 // the result is missing or too large
	ExitOOMKilled       = 76 // OOMKilled
	ExitCancelledSIGINT = 130
	ExitCancelledTERM   = 143
)

// Signalled is the cancellation cause cmd/kubetask sets when a signal ends the
// context, so that commands can exit 128+signal.
type Signalled struct{ Signal os.Signal }

func (s Signalled) Error() string { return "received signal " + s.Signal.String() }

type runFlags struct {
	file          string
	mainContainer string
	cleanup       string
	timeout       time.Duration
	logs          string
	result        string
	attach        bool
	output        string
	quiet         bool
}

func newRunCommand() *cobra.Command {
	f := &runFlags{}
	cf := newKubeFlags()
	cmd := &cobra.Command{
		Use:   "run -f FILE",
		Short: "Run one task (or pod manifest) to completion and exit with its outcome",
		Long: `Run a task as a pod: create it (or attach to the unfinished pod of the same task),
stream the main container's log to stdout, decide the outcome from the main container,
stop sidecars, clean up, and exit with the main container's exit code, or with one of
the codes in docs/run.md for failures of the infrastructure.`,
		Example: `  kubetask run -f examples/local/sidecar-task.yaml
  kubetask run -f task.yaml -n jobs --logs all --result out.json
  kubetask run -f task.yaml --attach        # after the previous run was killed`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.validate(); err != nil {
				return &ExitError{Code: ExitUsage, Err: err}
			}
			return runTask(cmd, f, cf)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.file, "filename", "f", "", "task or pod manifest (YAML or JSON); - reads stdin")
	fl.StringVar(&f.mainContainer, "main-container", "", "the container whose exit decides the task (overrides spec.mainContainer)")
	fl.StringVar(&f.cleanup, "cleanup", "", "Delete, DeleteSucceeded or Keep (overrides spec.cleanup)")
	fl.DurationVar(&f.timeout, "timeout", 0, "limit on the main container's run time (overrides spec.timeouts.run; 0 keeps the task's)")
	fl.StringVar(&f.logs, "logs", string(runner.LogsMain), "logs to stream to stdout: main, all (prefixed by container) or none")
	fl.StringVar(&f.result, "result", "", "write the task's result to this file")
	fl.BoolVar(&f.attach, "attach", false, "attach to the unfinished pod of this task; fail if there is none")
	fl.StringVarP(&f.output, "output", "o", "", "json: JSON lines on stdout (events, log lines, the outcome)")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress output")
	cf.addFlags(fl)
	return cmd
}

func (f *runFlags) validate() error {
	var errs []error
	if f.file == "" {
		errs = append(errs, errors.New("-f FILE is required (- reads stdin)"))
	}
	switch runner.LogMode(f.logs) {
	case runner.LogsMain, runner.LogsAll, runner.LogsNone:
	default:
		errs = append(errs, fmt.Errorf("--logs must be main, all or none, got %q", f.logs))
	}
	switch task.Cleanup(f.cleanup) {
	case "", task.CleanupDelete, task.CleanupDeleteSucceeded, task.CleanupKeep:
	default:
		errs = append(errs, fmt.Errorf("--cleanup must be Delete, DeleteSucceeded or Keep, got %q", f.cleanup))
	}
	if f.output != "" && f.output != "json" {
		errs = append(errs, fmt.Errorf("-o must be json, got %q", f.output))
	}
	if f.timeout < 0 {
		errs = append(errs, fmt.Errorf("--timeout must not be negative, got %s", f.timeout))
	}
	return errors.Join(errs...)
}

// loadTask reads the task and applies the flags that change it.
func (f *runFlags) loadTask(stdin io.Reader) (*task.Task, error) {
	r := stdin
	if f.file != "-" {
		fh, err := os.Open(f.file)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		r = fh
	}
	// The override is applied before validation: it may be what makes the task
	// valid (several containers, none named base or main).
	var edit func(*task.Task)
	if f.mainContainer != "" {
		edit = func(t *task.Task) {
			t.Spec.MainContainer = f.mainContainer
			t.Spec.Logs.Containers = nil
		}
	}
	t, err := task.LoadWith(r, edit)
	if err != nil {
		if f.mainContainer != "" {
			return nil, fmt.Errorf("--main-container %s: %w", f.mainContainer, err)
		}
		return nil, err
	}
	if f.cleanup != "" {
		t.Spec.Cleanup = task.Cleanup(f.cleanup)
	}
	if f.timeout > 0 {
		t.Spec.Timeouts.Run = task.Duration(f.timeout.String())
	}
	return t, nil
}

// RunID returns the CLI's run ID for t in namespace ns: a hash of what
// determines the pod (name, namespace, main container, result, template), so
// that running the same task again after the CLI was killed finds its pod.
func RunID(t *task.Task, ns string) (string, error) {
	b, err := json.Marshal(struct {
		NS, Name, Main string
		Result         *task.Result
		Template       any
	}{ns, t.Name, t.Spec.MainContainer, t.Spec.Result, t.Spec.Template})
	if err != nil {
		return "", fmt.Errorf("hashing task: %w", err)
	}
	sum := sha256.Sum256(b)
	return "cli-" + strings.ToLower(base32.StdEncoding.EncodeToString(sum[:]))[:20], nil
}

// resolveNamespace picks the task's namespace: -n (which must agree with
// metadata.namespace when both are set), else metadata.namespace, else the
// kubeconfig context's.
func resolveNamespace(flagNS string, flagSet bool, taskNS, kubeconfigNS string) (string, error) {
	switch {
	case flagSet && taskNS != "" && flagNS != taskNS:
		return "", fmt.Errorf("the task's metadata.namespace %q does not match -n %q", taskNS, flagNS)
	case flagSet:
		return flagNS, nil
	case taskNS != "":
		return taskNS, nil
	case kubeconfigNS != "":
		return kubeconfigNS, nil
	}
	return "default", nil
}

func runTask(cmd *cobra.Command, f *runFlags, cf *kubeFlags) error {
	ctx := cmd.Context()
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	t, err := f.loadTask(cmd.InOrStdin())
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: err}
	}
	kubeNS, _, err := cf.clientConfig().Namespace()
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("reading kubeconfig: %w", err)}
	}
	ns, err := resolveNamespace(cf.namespace(), cmd.Flags().Changed("namespace"), t.Namespace, kubeNS)
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: err}
	}
	runID, err := RunID(t, ns)
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: err}
	}
	cfg, err := cf.restConfig()
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("reading kubeconfig: %w", err)}
	}
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return &ExitError{Code: ExitCluster, Err: fmt.Errorf("creating client: %w", err)}
	}

	p := &printer{out: stdout, errw: stderr, json: f.output == "json", quiet: f.quiet, prefix: f.logs == string(runner.LogsAll)}
	opts := runner.Options{
		Identity:   task.Identity{Namespace: ns, Name: t.Name, RunID: runID, Executor: runID},
		AttachOnly: f.attach,
		Logs:       runner.LogMode(f.logs),
		OnLog:      p.log,
		OnEvent:    p.event,
		Logger:     slog.Default(),
	}
	out, err := runner.Run(ctx, client, cfg, t, opts)
	if err != nil {
		code := ExitCluster
		var sig Signalled
		if errors.As(context.Cause(ctx), &sig) {
			code = ExitCode(&runner.Outcome{Reason: podstate.ReasonCancelled}, sig)
		}
		if errors.Is(err, runner.ErrNothingToAttach) || errors.Is(err, runner.ErrAmbiguous) {
			code = ExitAttach
		}
		return &ExitError{Code: code, Err: err}
	}
	if f.result != "" && out.Result != nil {
		if werr := os.WriteFile(f.result, out.Result, 0o600); werr != nil {
			fmt.Fprintf(stderr, "error: writing result: %v\n", werr)
		}
	}
	p.outcome(out, f.result == "")
	code := ExitCode(out, context.Cause(ctx))
	if code == 0 {
		return nil
	}
	return &ExitError{Code: code}
}

// ExitCode maps an outcome to the process exit code: the main container's exit
// code when it ran to completion, 128+signal when cancelled by a signal (cause
// is the context's cancellation cause), and the Exit* constants otherwise.
func ExitCode(o *runner.Outcome, cause error) int {
	switch o.Reason {
	case podstate.ReasonCompleted:
		return 0
	case podstate.ReasonExitCode:
		if o.ExitCode != nil && *o.ExitCode != 0 {
			return int(*o.ExitCode & 0xff)
		}
		return 1
	case podstate.ReasonCancelled:
		var s Signalled
		if errors.As(cause, &s) {
			if sig, ok := s.Signal.(syscall.Signal); ok {
				return 128 + int(sig)
			}
		}
		return ExitCancelledSIGINT
	case podstate.ReasonImagePullFailed, podstate.ReasonInvalidImage:
		return ExitImagePull
	case podstate.ReasonConfigError:
		return ExitConfig
	case podstate.ReasonScheduleTimeout, podstate.ReasonUnschedulable:
		return ExitSchedule
	case podstate.ReasonStartupTimeout:
		return ExitStartupTimeout
	case podstate.ReasonRunTimeout, podstate.ReasonDeadlineExceeded:
		return ExitRunTimeout
	case podstate.ReasonEvicted, podstate.ReasonPreempted, podstate.ReasonNodeLost, podstate.ReasonPodFailed:
		return ExitDisrupted
	case podstate.ReasonDeletedExternally:
		return ExitDeleted
	case podstate.ReasonInitFailed:
		return ExitInitFailed
	case runner.ReasonResultFailed:
		return ExitResult
	case podstate.ReasonOOMKilled:
		return ExitOOMKilled
	}
	if o.Phase == podstate.Succeeded {
		return 0
	}
	return ExitDisrupted
}

// printer writes logs to stdout and progress to stderr, or JSON lines to stdout.
type printer struct {
	out, errw   io.Writer
	json, quiet bool
	prefix      bool
	// With prefix: the container whose line stdout ends in the middle of ("" at
	// the start of a line), and the containers whose line another container's
	// output interrupted.
	midLine     string
	interrupted map[string]bool
}

func (p *printer) jsonLine(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	_, _ = p.out.Write(append(b, '\n'))
}

// log writes a line (or piece of one) as the container wrote it: a newline only
// when the line had one. With prefix (several containers), "[name] " starts each
// line; a line interrupted by another container's output is broken there and
// continues on a new line with its prefix again.
func (p *printer) log(l runner.LogLine) {
	if p.json {
		p.jsonLine(map[string]any{"type": "log", "container": l.Container, "time": l.Time, "line": l.Text, "newline": l.Newline})
		return
	}
	var b []byte
	if p.prefix && p.midLine != l.Container {
		if p.interrupted[l.Container] && l.Text == "" && l.Newline {
			// The end of an interrupted line, already broken.
			delete(p.interrupted, l.Container)
			return
		}
		if p.midLine != "" {
			b = append(b, '\n')
			if p.interrupted == nil {
				p.interrupted = map[string]bool{}
			}
			p.interrupted[p.midLine] = true
		}
		b = fmt.Appendf(b, "[%s] ", l.Container)
		delete(p.interrupted, l.Container)
	}
	b = append(b, l.Text...)
	if l.Newline {
		b = append(b, '\n')
	}
	if l.Newline || !p.prefix {
		p.midLine = ""
	} else {
		p.midLine = l.Container
	}
	_, _ = p.out.Write(b)
}

func (p *printer) event(e runner.Event) {
	if p.quiet {
		return
	}
	if p.json {
		m := map[string]any{"type": "event", "event": e.Type, "time": e.Time, "elapsedSeconds": e.Elapsed.Seconds(), "pod": e.Pod}
		if e.Type == "state" {
			m["phase"], m["reason"], m["message"] = e.Phase, e.Reason, e.Message
		}
		p.jsonLine(m)
		return
	}
	var what string
	switch e.Type {
	case "state":
		what = string(e.Phase) + "/" + string(e.Reason)
		if e.Message != "" {
			what += ": " + e.Message
		}
	case "created", "attached":
		what = e.Type + " pod " + e.Pod
	default:
		what = e.Type
	}
	fmt.Fprintf(p.errw, "[%6.1fs] %s\n", e.Elapsed.Seconds(), what)
}

func (p *printer) outcome(o *runner.Outcome, showResult bool) {
	if p.json {
		m := map[string]any{"type": "outcome", "namespace": o.Namespace, "pod": o.Pod, "attempt": o.Attempt, "attached": o.Attached,
			"phase": o.Phase, "reason": o.Reason, "message": o.Message, "elapsedSeconds": o.Elapsed.Seconds(), "cleanup": o.Cleanup}
		if o.ExitCode != nil {
			m["exitCode"] = *o.ExitCode
		}
		if o.Result != nil {
			if utf8.Valid(o.Result) {
				m["result"] = string(o.Result)
			} else {
				m["resultBase64"] = o.Result
			}
		}
		if o.ResultError != "" {
			m["resultError"] = o.ResultError
		}
		if len(o.LogTail) > 0 {
			m["logTail"] = o.LogTail
		}
		if len(o.Events) > 0 {
			m["events"] = o.Events
		}
		p.jsonLine(m)
		return
	}
	w := p.errw
	if o.Succeeded() {
		if p.quiet {
			return
		}
		fmt.Fprintf(w, "outcome: %s/%s: %s (decided after %.1fs; %s)\n", o.Phase, o.Reason, o.Message, o.Elapsed.Seconds(), podWords(o))
		if showResult && o.Result != nil {
			r := o.Result
			more := ""
			if len(r) > 1024 {
				r, more = r[:1024], fmt.Sprintf(" ... (%d bytes; use --result FILE)", len(o.Result))
			}
			fmt.Fprintf(w, "result: %s%s\n", strings.TrimRight(string(r), "\n"), more)
		}
		return
	}
	fmt.Fprintf(w, "outcome: FAILED %s/%s: %s (decided after %.1fs; %s)\n", o.Phase, o.Reason, o.Message, o.Elapsed.Seconds(), podWords(o))
	if o.ResultError != "" && o.Reason != runner.ReasonResultFailed {
		fmt.Fprintf(w, "result: %s\n", o.ResultError)
	}
	if len(o.LogTail) > 0 {
		fmt.Fprintln(w, "last log lines of the main container:")
		for _, l := range o.LogTail {
			fmt.Fprintln(w, "  "+l)
		}
	}
	if len(o.Events) > 0 {
		fmt.Fprintln(w, "pod events:")
		for _, e := range o.Events {
			fmt.Fprintln(w, "  "+e)
		}
	}
}

// podWords says what became of the run's pod: "pod ns/name deleted".
func podWords(o *runner.Outcome) string {
	if o.Pod == "" {
		return "no pod was created"
	}
	c := o.Cleanup
	if c == "" {
		c = "gone"
	}
	return fmt.Sprintf("pod %s/%s %s", o.Namespace, o.Pod, c)
}
