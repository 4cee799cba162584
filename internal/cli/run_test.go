package cli

import (
	"context"

	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/runner"
	"github.com/kubetask/kubetask/pkg/task"
)

func code(c int32) *int32 { return &c }

func TestExitCode(t *testing.T) {
	sigint := fmt.Errorf("wrapped: %w", Signalled{Signal: syscall.SIGINT})
	sigterm := Signalled{Signal: syscall.SIGTERM}
	for name, tc := range map[string]struct {
		o     runner.Outcome
		cause error
		want  int
	}{
		"completed":                  {runner.Outcome{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted, ExitCode: code(0)}, nil, 0},
		"main exit code":             {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, ExitCode: code(7)}, nil, 7},
		"main exit code above 255":   {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode, ExitCode: code(258)}, nil, 2},
		"exit reason without a code": {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonExitCode}, nil, 1},
		"cancelled by SIGINT":        {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonCancelled}, sigint, 130},
		"cancelled by SIGTERM":       {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonCancelled}, sigterm, 143},
		"cancelled otherwise":        {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonCancelled}, context.Canceled, 130},
		"image pull":                 {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonImagePullFailed}, nil, ExitImagePull},
		"invalid image":              {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonInvalidImage}, nil, ExitImagePull},
		"config error":               {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonConfigError}, nil, ExitConfig},
		"schedule timeout":           {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonScheduleTimeout}, nil, ExitSchedule},
		"startup timeout":            {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonStartupTimeout}, nil, ExitStartupTimeout},
		"run timeout":                {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonRunTimeout}, nil, ExitRunTimeout},
		"deadline exceeded":          {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonDeadlineExceeded}, nil, ExitRunTimeout},
		"evicted":                    {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonEvicted}, nil, ExitDisrupted},
		"preempted":                  {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonPreempted}, nil, ExitDisrupted},
		"node lost":                  {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonNodeLost}, nil, ExitDisrupted},
		"pod failed":                 {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonPodFailed}, nil, ExitDisrupted},
		"deleted externally":         {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonDeletedExternally}, nil, ExitDeleted},
		"init failed":                {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonInitFailed}, nil, ExitInitFailed},
		"result failed":              {runner.Outcome{Phase: podstate.Failed, Reason: runner.ReasonResultFailed, ExitCode: code(0)}, nil, ExitResult},
		"oom killed":                 {runner.Outcome{Phase: podstate.Failed, Reason: podstate.ReasonOOMKilled, ExitCode: code(137)}, nil, ExitOOMKilled},
	} {
		t.Run(name, func(t *testing.T) {
			if got := ExitCode(&tc.o, tc.cause); got != tc.want {
				t.Errorf("ExitCode = %d, want %d", got, tc.want)
			}
		})
	}
}

// Every terminal reason has an exit code other than 0, distinct per family.
func TestExitCodeCoversEveryFailure(t *testing.T) {
	for _, r := range podstate.Reasons {
		o := runner.Outcome{Phase: podstate.Failed, Reason: r, ExitCode: code(1)}
		if r == podstate.ReasonCompleted {
			continue
		}
		if c := ExitCode(&o, nil); c == 0 {
			t.Errorf("reason %s exits 0", r)
		}
	}
}

func TestRunFlagsValidate(t *testing.T) {
	ok := runFlags{file: "t.yaml", logs: "main"}
	for name, tc := range map[string]struct {
		mutate func(*runFlags)
		want   string // substring of the error; "" for none
	}{
		"defaults":           {func(*runFlags) {}, ""},
		"stdin":              {func(f *runFlags) { f.file = "-" }, ""},
		"no file":            {func(f *runFlags) { f.file = "" }, "-f FILE is required"},
		"logs all":           {func(f *runFlags) { f.logs = "all" }, ""},
		"logs none":          {func(f *runFlags) { f.logs = "none" }, ""},
		"bad logs":           {func(f *runFlags) { f.logs = "some" }, "--logs must be main, all or none"},
		"cleanup Keep":       {func(f *runFlags) { f.cleanup = "Keep" }, ""},
		"cleanup lower case": {func(f *runFlags) { f.cleanup = "keep" }, "--cleanup must be Delete, DeleteSucceeded or Keep"},
		"json":               {func(f *runFlags) { f.output = "json" }, ""},
		"yaml":               {func(f *runFlags) { f.output = "yaml" }, "-o must be json"},
		"negative timeout":   {func(f *runFlags) { f.timeout = -1 }, "--timeout must not be negative"},
		"several problems":   {func(f *runFlags) { f.file = ""; f.logs = "x" }, "--logs must be"},
	} {
		t.Run(name, func(t *testing.T) {
			f := ok
			tc.mutate(&f)
			err := f.validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestResolveNamespace(t *testing.T) {
	for name, tc := range map[string]struct {
		flag          string
		flagSet       bool
		taskNS, kubNS string
		want, err     string
	}{
		"flag":                     {"a", true, "", "k", "a", ""},
		"flag agrees with task":    {"a", true, "a", "k", "a", ""},
		"flag disagrees with task": {"a", true, "b", "k", "", "does not match"},
		"task":                     {"", false, "b", "k", "b", ""},
		"kubeconfig":               {"", false, "", "k", "k", ""},
		"default":                  {"", false, "", "", "default", ""},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := resolveNamespace(tc.flag, tc.flagSet, tc.taskNS, tc.kubNS)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestRunIDIsDeterministic(t *testing.T) {
	load := func(cmd string) *task.Task {
		tk, err := task.Parse([]byte(`{"apiVersion":"kubetask.dev/v1alpha1","kind":"Task","metadata":{"name":"t"},
"spec":{"template":{"spec":{"containers":[{"name":"base","image":"busybox","command":["` + cmd + `"]}]}}}}`))
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	id := func(tk *task.Task, ns string) string {
		s, err := RunID(tk, ns)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := id(load("true"), "ns")
	if b := id(load("true"), "ns"); a != b {
		t.Errorf("same task, different run IDs %s %s", a, b)
	}
	if b := id(load("false"), "ns"); a == b {
		t.Error("a different template gives the same run ID")
	}
	if b := id(load("true"), "other"); a == b {
		t.Error("another namespace gives the same run ID")
	}
	tk := load("true")
	tk.Spec.Cleanup = task.CleanupKeep
	tk.Spec.Timeouts.Run = "5m"
	if b := id(tk, "ns"); a != b {
		t.Error("cleanup and timeouts (not part of the pod) change the run ID; --attach after changing them would not find the pod")
	}
}
