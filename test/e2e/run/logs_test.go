package run

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// logPayload is what the test container writes: lines from 1 byte to 300 KiB
// (over the 16 KiB record limit, so split into partial records), empty lines,
// UTF-8 (multi-byte characters across record boundaries too), CR characters
// (alone, doubled, at line starts and ends, but not before a newline: containerd
// turns CRLF into LF, and the local node does the same), tabs, text that looks
// like a timestamp, and a last line without a newline.
func logPayload() []byte {
	var b bytes.Buffer
	pattern := bytes.Repeat([]byte("abcdefghijklmnopqrstuvwxyz0123456789 é✓\r\t"), 8000)
	for _, n := range []int{1, 2, 0, 100, 4095, 4096, 4097, 0, 16383, 16384, 16385, 65536, 1, 300 << 10, 7, 200000, 3} {
		b.Write(pattern[:n])
		b.WriteByte('\n')
	}
	b.WriteString("\r\rcarriage returns\r in\rthe middle\r\r and at the end\r\r\t\n")
	b.WriteString("2026-01-02T03:04:05.000000000Z looks like a kubelet timestamp\n")
	b.WriteString("UTF-8: héllo wörld ✓ 日本語 🚀\n")
	b.WriteString("\n\n")
	b.WriteString("the last line, without a newline ✓\r")
	return b.Bytes()
}

// `kubetask run --logs main -q` reproduces the container's output byte for
// byte while kube-apiserver restarts in the middle of the stream: the stream
// breaks while a long line is half written, the container writes on during
// the outage, and ends with an unterminated line.
func TestRunLogsExactBytesAcrossAPIServerRestart(t *testing.T) {
	env := clustertest.New(t)
	want := logPayload()
	if bytes.Contains(want, []byte("\r\n")) {
		t.Fatal("the payload has a CRLF, which the runtime turns into LF")
	}
	dir := t.TempDir()
	// Part 1 ends in the middle of the 65536-byte line (after its first 16 KiB
	// record); part 2 is written in 40 chunks during the restart, cut anywhere;
	// part 3 after it.
	cut1 := indexOfLineOfLength(t, want, 65536) + 20000
	cut3 := len(want) - 5000
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("p1", want[:cut1])
	middle := want[cut1:cut3]
	for i := range 40 {
		write(fmt.Sprintf("p2-%03d", i), middle[i*len(middle)/40:(i+1)*len(middle)/40])
	}
	write("p3", want[cut3:])
	script := fmt.Sprintf(`d=%s; cat $d/p1; while [ ! -e $d/gate1 ]; do sleep 0.05; done; `+
		`for f in $d/p2-*; do cat $f; sleep 0.25; done; while [ ! -e $d/gate2 ]; do sleep 0.05; done; cat $d/p3`, dir)
	f := taskFile(t, "exact-logs", "", fmt.Sprintf(`      containers:
        - {name: base, image: busybox, command: [sh, -c, %q]}`, script))

	p := start(t, env, "-v", "run", "-f", f, "--logs", "main", "-q")
	// Everything of part 1 up to its last newline is printed; the half line is
	// held back until it is complete.
	whole := want[:bytes.LastIndexByte(want[:cut1], '\n')+1]
	eventually(t, time.Minute, "part 1 on stdout", func() bool { return len(p.stdout.String()) >= len(whole) })
	if got := p.stdout.String(); got != string(whole) {
		t.Fatalf("before the rest was written, stdout has %d bytes, want the %d of part 1's complete lines", len(got), len(whole))
	}

	// Restart kube-apiserver; once kubetask's stream broke (in the middle of the
	// 64 KiB line), the container writes on, during the outage.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	restarted := make(chan error, 1)
	go func() { restarted <- env.Cluster.RestartAPIServer(ctx) }()
	eventually(t, time.Minute, "the log stream to break", func() bool { return strings.Contains(p.stderr.String(), "resuming") })
	write("gate1", nil)
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver restarted; %d of %d bytes printed", len(p.stdout.String()), len(want))
	write("gate2", nil)

	code := p.wait(t, 2*time.Minute)
	stderr := p.stderr.String()
	if code != 0 {
		t.Errorf("exit %d, want 0; stderr:\n%s", code, stderr)
	}
	got := []byte(p.stdout.String())
	if i := firstDifference(want, got); i >= 0 {
		lo := max(i-40, 0)
		t.Errorf("stdout differs from the container's output at byte %d (got %d bytes, want %d):\ngot  %q\nwant %q",
			i, len(got), len(want), got[lo:min(i+40, len(got))], want[lo:min(i+40, len(want))])
	}
}

// indexOfLineOfLength returns the offset of the first line of n bytes in b.
func indexOfLineOfLength(t *testing.T, b []byte, n int) int {
	t.Helper()
	off := 0
	for _, l := range bytes.SplitAfter(b, []byte("\n")) {
		if len(l) == n+1 {
			return off
		}
		off += len(l)
	}
	t.Fatalf("no line of %d bytes", n)
	return 0
}

// firstDifference returns the first offset where a and b differ, -1 if equal.
func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// The main container (restartPolicy OnFailure) exits 1 and is restarted while
// kube-apiserver is down, so while kubetask's log stream is broken: kubetask
// prints the rest of the first instance (read with previous=true), ending with
// its unterminated last line, then the second instance, byte for byte.
func TestRunLogsContainerRestartWhileStreamBroken(t *testing.T) {
	env := clustertest.New(t)
	dir := t.TempDir()
	a1 := []byte("first instance, line 1\nfirst instance, a half li")
	a2 := []byte("ne written while the apiserver is down\n" + strings.Repeat("é", 10000) + "\nno newline before the exit")
	b1 := []byte("second instance, line 1\n")
	b2 := []byte("second instance, last line\n")
	for name, b := range map[string][]byte{"a1": a1, "a2": a2, "b1": b1, "b2": b2} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := fmt.Sprintf(`d=%s; if [ ! -e $d/ran ]; then touch $d/ran; cat $d/a1; `+
		`while [ ! -e $d/gate1 ]; do sleep 0.05; done; cat $d/a2; exit 1; fi; `+
		`cat $d/b1; while [ ! -e $d/gate2 ]; do sleep 0.05; done; cat $d/b2`, dir)
	f := taskFile(t, "restart-logs", "", fmt.Sprintf(`      restartPolicy: OnFailure
      containers:
        - {name: base, image: busybox, command: [sh, -c, %q]}`, script))

	p := start(t, env, "-v", "run", "-f", f, "--logs", "main", "-q")
	eventually(t, time.Minute, "the first line on stdout", func() bool { return strings.HasPrefix(p.stdout.String(), "first instance, line 1\n") })

	// Restart kube-apiserver; once kubetask's stream broke (a stream in flight
	// outlives the listener for a while), let the first instance finish (exit 1)
	// and the node restart it, before kube-apiserver is back.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	restarted := make(chan error, 1)
	go func() { restarted <- env.Cluster.RestartAPIServer(ctx) }()
	eventually(t, time.Minute, "the log stream to break", func() bool { return strings.Contains(p.stderr.String(), "resuming") })
	if err := os.WriteFile(filepath.Join(dir, "gate1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	want := append(append(append([]byte(nil), a1...), a2...), b1...)
	// Both instances' output, or as much as comes within a minute (the comparison
	// below says what is missing).
	for deadline := time.Now().Add(time.Minute); len(p.stdout.String()) < len(want) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	if err := os.WriteFile(filepath.Join(dir, "gate2"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want = append(want, b2...)

	code := p.wait(t, 2*time.Minute)
	stderr := p.stderr.String()
	if code != 0 {
		t.Errorf("exit %d, want 0; stderr:\n%s", code, stderr)
	}
	got := []byte(p.stdout.String())
	if i := firstDifference(want, got); i >= 0 {
		lo := max(i-40, 0)
		t.Errorf("stdout differs from the container's output at byte %d (got %d bytes, want %d):\ngot  %q\nwant %q",
			i, len(got), len(want), got[lo:min(i+40, len(got))], want[lo:min(i+40, len(want))])
	}
}
