package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if raw := os.Getenv(helperEnv); raw != "" {
		runHelper(raw)
	}
	code := m.Run()
	if code == 0 {
		if left := childProcesses(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "processes left behind: %v\n", left)
			code = 1
		}
	}
	os.Exit(code)
}

// childProcesses lists the live children of this test binary.
func childProcesses() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		rest := s[strings.LastIndexByte(s, ')')+2:]
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == strconv.Itoa(self) && f[0] != "Z" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// runtimeEnv names the runtime this package's tests run containers of
// images with: "runc" (on PATH) runs them all under runc, as a node with
// Runtime "runc" does; unset, the node's init.
const runtimeEnv = "KUBETASK_CONTAINER_TEST_RUNTIME"

// withTestRuntime sets the runtime of runtimeEnv on a spec with a Rootfs.
func withTestRuntime(t *testing.T, spec Spec) Spec {
	t.Helper()
	if spec.Rootfs == nil || os.Getenv(runtimeEnv) != "runc" {
		return spec
	}
	spec.Runtime = runcRuntime(t)
	return spec
}

// runcRuntime is runc on PATH with a state directory of the test's.
func runcRuntime(t *testing.T) *OCIRuntime {
	t.Helper()
	path, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("runc is not installed")
	}
	return &OCIRuntime{Path: path, Root: filepath.Join(t.TempDir(), "runc")}
}

func start(t *testing.T, spec Spec) *Process {
	t.Helper()
	spec = withTestRuntime(t, spec)
	if spec.LogPath == "" {
		spec.LogPath = filepath.Join(t.TempDir(), "0.log")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		p.Kill()
		waitReleased(t, p) // runc's state is in the test's directory
	})
	return p
}

func waitDone(t *testing.T, p *Process) Result {
	t.Helper()
	select {
	case <-p.Done():
		return p.Result()
	case <-time.After(15 * time.Second):
		t.Fatalf("process %d did not exit", p.PID())
		return Result{}
	}
}

// waitReleased waits until nothing of p is left (see Process.released).
func waitReleased(t *testing.T, p *Process) {
	t.Helper()
	select {
	case <-p.released:
	case <-time.After(15 * time.Second):
		t.Fatalf("process %d: not released 15 s after its end", p.PID())
	}
}

func readAll(t *testing.T, p *Process, opts LogOptions) string {
	t.Helper()
	var b bytes.Buffer
	if err := p.ReadLog(context.Background(), opts, &b); err != nil {
		t.Fatalf("ReadLog: %v", err)
	}
	return b.String()
}

func sh(script string) []string { return []string{"sh", "-c", script} }

func TestExitCodeEnvWorkingDirAndLogs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "work", "dir")
	p := start(t, Spec{
		Command:    sh(`echo "out $GREETING"; echo err >&2; pwd; exit 3`),
		Env:        []string{"GREETING=hello"},
		WorkingDir: dir,
	})
	res := waitDone(t, p)
	if res.ExitCode != 3 || res.Signal != 0 {
		t.Fatalf("result = %+v, want exit 3", res)
	}
	if res.StartedAt.IsZero() || res.FinishedAt.Before(res.StartedAt) {
		t.Fatalf("bad times: %+v", res)
	}
	got := readAll(t, p, LogOptions{TailLines: -1})
	for _, want := range []string{"out hello\n", "err\n", dir + "\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("log %q lacks %q", got, want)
		}
	}
	raw, err := os.ReadFile(p.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.SplitN(line, " ", 4)
		if len(f) != 4 || (f[1] != "stdout" && f[1] != "stderr") || f[2] != "F" {
			t.Errorf("not a CRI log line: %q", line)
		}
		if _, err := time.Parse(time.RFC3339Nano, f[0]); err != nil {
			t.Errorf("bad timestamp in %q: %v", line, err)
		}
	}
}

func TestStartErrorForMissingExecutable(t *testing.T) {
	_, err := Start(context.Background(), Spec{Command: []string{"kubetask-no-such-command"}, LogPath: filepath.Join(t.TempDir(), "0.log")})
	var se *StartError
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "executable file not found") {
		t.Fatalf("err = %v, want StartError about the missing executable", err)
	}
}

func TestStopHonoursSIGTERM(t *testing.T) {
	// The trap makes SIGTERM work even when the shell is PID 1 of its namespace.
	p := start(t, Spec{Command: sh(`trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.1; done`)})
	waitLog(t, p, "ready\n")
	begin := time.Now()
	res := p.Stop(context.Background(), time.Minute)
	if res.ExitCode != 0 {
		t.Fatalf("exit = %d, want 0 from the trap", res.ExitCode)
	}
	if d := time.Since(begin); d > 20*time.Second {
		t.Fatalf("stop took %v", d)
	}
	if got := readAll(t, p, LogOptions{TailLines: -1}); !strings.Contains(got, "bye") {
		t.Fatalf("log %q lacks the trap's output", got)
	}
}

func TestStopKillsProcessIgnoringSIGTERMAfterGrace(t *testing.T) {
	p := start(t, Spec{Command: sh(`trap '' TERM; sleep 1000 & sleep 1000 & echo ready; wait`)})
	waitLog(t, p, "ready\n")
	grace := 500 * time.Millisecond
	begin := time.Now()
	res := p.Stop(context.Background(), grace)
	if d := time.Since(begin); d < grace {
		t.Fatalf("killed after %v, before the grace period", d)
	}
	if res.ExitCode != 137 || res.Signal != syscall.SIGKILL {
		t.Fatalf("result = %+v, want SIGKILL/137", res)
	}
	if err := syscall.Kill(-p.PID(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("process group %d still has members (kill 0: %v)", p.PID(), err)
	}
}

// waitLog waits until the log contains want.
func waitLog(t *testing.T, p *Process, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		changed, _ := p.log.watch()
		if strings.Contains(readAll(t, p, LogOptions{TailLines: -1}), want) {
			return
		}
		select {
		case <-changed:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("log never contained %q", want)
		}
	}
}

// syncBuffer is a bytes.Buffer that signals every write.
type syncBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	select {
	case s.wrote <- struct{}{}:
	default:
	}
	return n, err
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !strings.Contains(s.String(), want) {
		select {
		case <-s.wrote:
		case <-deadline:
			t.Fatalf("output %q never contained %q", s.String(), want)
		}
	}
}

func TestFollowStreamsLinesAsWrittenAndEndsAtExit(t *testing.T) {
	gate := filepath.Join(t.TempDir(), "gate")
	p := start(t, Spec{Command: sh(fmt.Sprintf(`echo one; while [ ! -e %s ]; do sleep 0.02; done; echo two`, gate))})
	out := &syncBuffer{wrote: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- p.ReadLog(context.Background(), LogOptions{Follow: true, TailLines: -1}, out) }()
	out.waitFor(t, "one\n")
	if strings.Contains(out.String(), "two") {
		t.Fatal("second line before it was written")
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "two\n")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end when the container exited")
	}
	if got := out.String(); got != "one\ntwo\n" {
		t.Fatalf("followed %q", got)
	}
}

func TestLogOptions(t *testing.T) {
	gate := filepath.Join(t.TempDir(), "gate")
	p := start(t, Spec{Command: sh(fmt.Sprintf(`echo a; echo b; while [ ! -e %s ]; do sleep 0.02; done; echo c; printf partial`, gate))})
	waitLog(t, p, "b\n")
	// Records carry their own times; take the cut from the file, not from a clock.
	raw, _ := os.ReadFile(p.LogPath())
	lastBefore, _ := time.Parse(time.RFC3339Nano, strings.Fields(strings.Split(string(raw), "\n")[1])[0])
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitDone(t, p)
	all := LogOptions{TailLines: -1}
	cases := map[string]struct {
		opts LogOptions
		want string
	}{
		// The unterminated last line is served without a newline.
		"all":        {all, "a\nb\nc\npartial"},
		"tail 2":     {LogOptions{TailLines: 2}, "c\npartial"},
		"tail 0":     {LogOptions{TailLines: 0}, ""},
		"tail 10":    {LogOptions{TailLines: 10}, "a\nb\nc\npartial"},
		"limit 3":    {LogOptions{TailLines: -1, LimitBytes: 3}, "a\nb"},
		"since":      {LogOptions{TailLines: -1, SinceTime: lastBefore.Add(time.Nanosecond)}, "c\npartial"},
		"since zero": {LogOptions{TailLines: -1, SinceTime: lastBefore}, "b\nc\npartial"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := readAll(t, p, tc.opts); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	ts := readAll(t, p, LogOptions{TailLines: 1, Timestamps: true})
	f := strings.SplitN(ts, " ", 2)
	if _, err := time.Parse(time.RFC3339Nano, f[0]); err != nil || len(f) != 2 || f[1] != "partial" {
		t.Fatalf("timestamped line %q", ts)
	}
}

func TestLongLinesAreSplitIntoPartialRecords(t *testing.T) {
	p := start(t, Spec{Command: sh(`head -c 40000 /dev/zero | tr '\0' x; echo`)})
	waitDone(t, p)
	got := readAll(t, p, LogOptions{TailLines: -1})
	if got != strings.Repeat("x", 40000)+"\n" {
		t.Fatalf("reassembled %d bytes", len(got))
	}
	raw, _ := os.ReadFile(p.LogPath())
	if n := strings.Count(string(raw), " P "); n != 2 {
		t.Fatalf("%d partial records, want 2", n)
	}
}

func TestExecReturnsExitCodeAndStreams(t *testing.T) {
	p := start(t, Spec{Command: sh(`echo ready; exec sleep 1000`), Env: []string{"WHO=container"}})
	waitLog(t, p, "ready\n")
	var out, errb bytes.Buffer
	code, err := p.Exec(context.Background(), sh(`read line; echo "$line $WHO"; echo oops >&2; exit 7`), strings.NewReader("hi\n"), &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if code != 7 || out.String() != "hi container\n" || errb.String() != "oops\n" {
		t.Fatalf("exec: code %d stdout %q stderr %q", code, out.String(), errb.String())
	}
	code, _ = p.Exec(context.Background(), []string{"kubetask-no-such-command"}, nil, io.Discard, io.Discard)
	if code != 127 {
		t.Fatalf("missing command exit %d, want 127", code)
	}
	p.Kill()
	if _, err := p.Exec(context.Background(), []string{"true"}, nil, io.Discard, io.Discard); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("exec after exit: %v", err)
	}
}

func TestNamespacesMountVolumesAndTerminationMessage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("namespace isolation needs root")
	}
	tmp := t.TempDir()
	vol := filepath.Join(tmp, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	term := filepath.Join(tmp, "termination-log")
	if err := os.WriteFile(term, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mountPoint := filepath.Join(tmp, "not-yet", "data")
	p := start(t, Spec{
		Command: sh(`echo shared > ` + mountPoint + `/file; echo done > /dev/termination-log; echo pid=$$; ps -e -o pid= | wc -l`),
		Mounts: []Mount{
			{HostPath: vol, ContainerPath: mountPoint},
			{HostPath: term, ContainerPath: "/dev/termination-log"},
		},
		Isolation: IsolationNamespaces,
	})
	if res := waitDone(t, p); res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, readAll(t, p, LogOptions{TailLines: -1}))
	}
	if b, _ := os.ReadFile(filepath.Join(vol, "file")); string(b) != "shared\n" {
		t.Fatalf("volume file = %q", b)
	}
	if msg, err := ReadTerminationMessage(term); err != nil || msg != "done\n" {
		t.Fatalf("termination message %q, %v", msg, err)
	}
	if b, _ := os.ReadFile("/dev/termination-log"); len(b) != 0 {
		t.Fatalf("host /dev/termination-log was written: %q", b)
	}
	if got := readAll(t, p, LogOptions{TailLines: -1}); !strings.HasPrefix(got, "pid=1\n") {
		t.Fatalf("not PID 1 of its own namespace: %q", got)
	}
}

func TestExecJoinsContainerNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("namespace isolation needs root")
	}
	tmp := t.TempDir()
	vol := filepath.Join(tmp, "vol")
	_ = os.Mkdir(vol, 0o755)
	_ = os.WriteFile(filepath.Join(vol, "f"), []byte("in-volume"), 0o644)
	mountPoint := filepath.Join(tmp, "mnt")
	p := start(t, Spec{
		Command:   sh(`trap 'exit 0' TERM; echo ready; while :; do sleep 0.1; done`),
		Mounts:    []Mount{{HostPath: vol, ContainerPath: mountPoint}},
		Isolation: IsolationNamespaces,
	})
	waitLog(t, p, "ready\n")
	var out bytes.Buffer
	code, err := p.Exec(context.Background(), sh(`cat `+mountPoint+`/f; kill -TERM 1`), nil, &out, io.Discard)
	if err != nil || code != 0 || out.String() != "in-volume" {
		t.Fatalf("exec: code %d err %v out %q", code, err, out.String())
	}
	// kill 1 inside the container reached the container's PID 1.
	if res := waitDone(t, p); res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
}

func TestFallbackLogTail(t *testing.T) {
	p := start(t, Spec{Command: sh(`for i in $(seq 1 100); do echo line$i; done; exit 1`)})
	waitDone(t, p)
	got := p.LogTail(80, 2048)
	if !strings.HasPrefix(got, "line21\n") || !strings.HasSuffix(got, "line100\n") {
		t.Fatalf("tail = %q", got)
	}
	if got := p.LogTail(80, 8); got != "line100\n" {
		t.Fatalf("byte-capped tail = %q", got)
	}
}
