package cli

import (
	"context"
	"io"

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

// The printer reproduces a container's output byte for byte: a newline only
// where the line had one; with several containers, prefixes start lines only.
func TestPrinterLog(t *testing.T) {
	for name, tc := range map[string]struct {
		prefix bool
		lines  []runner.LogLine
		want   string
	}{
		"main: bytes as written, no newline added": {
			lines: []runner.LogLine{
				{Container: "main", Text: "a", Newline: true},
				{Container: "main", Text: "\r\xff", Newline: true},
				{Container: "main", Text: "piece "},
				{Container: "main", Text: "and rest", Newline: true},
				{Container: "main", Text: "", Newline: true},
				{Container: "main", Text: "last, no newline"},
			},
			want: "a\n\r\xff\npiece and rest\n\nlast, no newline",
		},
		"all: a prefix at the start of each line only": {
			prefix: true,
			lines: []runner.LogLine{
				{Container: "a", Text: "one", Newline: true},
				{Container: "a", Text: "lo"},
				{Container: "a", Text: "ng", Newline: true},
				{Container: "b", Text: "end"},
			},
			want: "[a] one\n[a] long\n[b] end",
		},
		"all: a line interrupted by another container continues with its prefix": {
			prefix: true,
			lines: []runner.LogLine{
				{Container: "a", Text: "half"},
				{Container: "b", Text: "other", Newline: true},
				{Container: "a", Text: " rest", Newline: true},
				{Container: "a", Text: "x"},
				{Container: "b", Text: "y", Newline: true},
				{Container: "a", Text: "", Newline: true},
				{Container: "a", Text: "z", Newline: true},
			},
			want: "[a] half\n[b] other\n[a]  rest\n[a] x\n[b] y\n[a] z\n",
		},
	} {
		t.Run(name, func(t *testing.T) {
			var out strings.Builder
			p := &printer{out: &out, errw: io.Discard, prefix: tc.prefix}
			for _, l := range tc.lines {
				p.log(l)
			}
			if out.String() != tc.want {
				t.Errorf("stdout %q, want %q", out.String(), tc.want)
			}
		})
	}
}
