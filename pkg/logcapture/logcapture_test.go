package logcapture_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/pkg/logcapture"
	"github.com/kubetask/kubetask/pkg/podlog"
	"github.com/kubetask/kubetask/pkg/podlog/podlogtest"
	"github.com/kubetask/kubetask/pkg/store"
)

// fixture is a fake kubelet with one container and a memory store with the
// task's record.
type fixture struct {
	t     *testing.T
	k     *podlogtest.Kubelet
	logs  store.Logs
	key   store.LogKey
	clock *clocktesting.FakeClock
	ctx   context.Context
}

func newFixture(t *testing.T, opts store.Options) *fixture {
	t.Helper()
	st := store.NewMemoryWithOptions(opts)
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	rec, _, err := st.Create(ctx, store.Record{ID: "t1", Namespace: podlogtest.Namespace, Name: "task", Task: []byte(`{}`), Phase: "Running", Nonce: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, k: podlogtest.NewKubelet(t), logs: st.(store.Logs),
		key: store.LogKey{TaskID: rec.ID, Attempt: 1, Container: podlogtest.Container}, clock: clocktesting.NewFakeClock(podlogtest.T0), ctx: ctx}
}

func (f *fixture) config() logcapture.Config {
	return logcapture.Config{
		Client: f.k.Client(), Namespace: podlogtest.Namespace, Pod: podlogtest.PodName, Container: podlogtest.Container,
		Key: f.key, Logs: f.logs, Clock: f.clock, ChunkSize: 1, FlushInterval: time.Hour,
		Progress: func() podlog.Progress { return podlog.ProgressOf(f.k.Pod(), podlogtest.Container) },
		Changed:  f.k.Changed(),
	}
}

// archived returns the whole archived log and its info.
func (f *fixture) archived() ([]byte, store.LogInfo) {
	f.t.Helper()
	b, info, err := f.logs.ReadLog(f.ctx, f.key, 0, 1<<30)
	if errors.Is(err, store.ErrNotFound) {
		return nil, store.LogInfo{}
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return b, info
}

// waitArchived waits until the archive holds want.
func (f *fixture) waitArchived(want string) {
	f.t.Helper()
	for {
		if b, _ := f.archived(); string(b) == want {
			return
		}
		select {
		case <-f.ctx.Done():
			b, _ := f.archived()
			f.t.Fatalf("archived %q, want %q", b, want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// The whole log, across broken streams and a restart, archived byte for
// byte and marked complete; Run returns nil only then.
func TestArchivesTheWholeLog(t *testing.T) {
	f := newFixture(t, store.Options{})
	at := podlogtest.Every(podlogtest.T0, 300*time.Millisecond, 1)
	out1 := []byte("one\ntwo\nthree\nhalf a line")
	out2 := []byte("again\n\n\nand the end without newline")
	first := podlogtest.Split(out1, 16<<10, at)
	second := podlogtest.Split(out2, 16<<10, func(i int) time.Time { return podlogtest.T0.Add(time.Minute + time.Duration(i)*time.Second) })
	f.k.Start(first...)
	f.k.CutOpen(0, podlogtest.Cut{At: 40})
	f.k.CutOpen(1, podlogtest.Cut{At: 10, Clean: true})
	var appended int64
	cfg := f.config()
	cfg.OnAppend = func(n int64) { appended += n }
	done := make(chan error, 1)
	go func() { done <- logcapture.Run(f.ctx, cfg) }()
	f.waitArchived(string(out1))
	if _, info := f.archived(); info.Complete {
		t.Fatal("complete while the container runs")
	}
	f.k.Start(second...)
	f.k.Terminate()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b, info := f.archived()
	if want := string(out1) + string(out2); string(b) != want || !info.Complete || info.Truncated {
		t.Errorf("archived %q (%+v), want %q complete", b, info, want)
	}
	if appended != int64(len(b)) {
		t.Errorf("OnAppend reported %d bytes, want %d", appended, len(b))
	}
}

// Captures stopped at many points and started again archive together what
// one capture would: no gap, no duplicate.
func TestResumesWhereTheArchiveEnds(t *testing.T) {
	f := newFixture(t, store.Options{})
	var want bytes.Buffer
	f.k.Start()
	line := 0
	for stop := range 6 {
		// Lines, some with the same timestamp (the cursor counts them), some
		// unterminated for a while.
		var recs []podlogtest.Record
		for range 5 {
			text := []byte{byte('a' + line%26), byte('0' + stop)}
			recs = append(recs, podlogtest.Record{Time: podlogtest.T0.Add(time.Duration(line/3) * time.Second), Text: text})
			want.Write(text)
			want.WriteByte('\n')
			line++
		}
		f.k.Write(recs...)
		ctx, cancel := context.WithCancel(f.ctx)
		done := make(chan error, 1)
		go func() { done <- logcapture.Run(ctx, f.config()) }()
		f.waitArchived(want.String())
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("stop %d: Run = %v, want context.Canceled", stop, err)
		}
	}
	f.k.Write(podlogtest.Record{Time: podlogtest.T0.Add(time.Hour), Text: []byte("last")})
	want.WriteString("last\n")
	f.k.Terminate()
	if err := logcapture.Run(f.ctx, f.config()); err != nil {
		t.Fatal(err)
	}
	b, info := f.archived()
	if string(b) != want.String() || !info.Complete {
		t.Errorf("archived %q (%+v), want %q complete", b, info, want.String())
	}
	// A complete log: a further Run returns at once without reading.
	opens := f.k.Opens()
	if err := logcapture.Run(f.ctx, f.config()); err != nil {
		t.Fatal(err)
	}
	if f.k.Opens() != opens {
		t.Error("a complete log was read again")
	}
}

// Bytes wait at most FlushInterval when fewer than ChunkSize are pending.
func TestFlushInterval(t *testing.T) {
	f := newFixture(t, store.Options{})
	f.k.Start(podlogtest.Record{Time: podlogtest.T0, Text: []byte("small")})
	cfg := f.config()
	cfg.ChunkSize, cfg.FlushInterval = 1<<20, time.Second
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- logcapture.Run(ctx, cfg) }()
	defer func() { cancel(); <-done }()
	for {
		if b, _ := f.archived(); string(b) == "small\n" {
			break
		}
		f.clock.Step(time.Second)
		select {
		case <-f.ctx.Done():
			t.Fatal("the pending line was never flushed")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A pod that vanished before its log was read to the end: what was read
// stays, a marker line says the rest is lost, the log is complete.
func TestPodGoneMarksTheLoss(t *testing.T) {
	f := newFixture(t, store.Options{})
	f.k.Start(podlogtest.Record{Time: podlogtest.T0, Text: []byte("kept")}, podlogtest.Record{Time: podlogtest.T0, Partial: true, Text: []byte("half")})
	done := make(chan error, 1)
	go func() { done <- logcapture.Run(f.ctx, f.config()) }()
	f.waitArchived("kept\nhalf")
	f.k.Delete()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b, info := f.archived()
	if want := "kept\nhalf\n" + logcapture.PodGoneMarker; string(b) != want || !info.Complete {
		t.Errorf("archived %q (%+v), want %q complete", b, info, want)
	}
}

// The archive's size cap: the log is kept up to the cap, marked truncated,
// and still completed.
func TestSizeCap(t *testing.T) {
	f := newFixture(t, store.Options{MaxLogSize: 10})
	f.k.Start(podlogtest.Split([]byte("0123456\nabcdefgh\nmore\n"), 16<<10, podlogtest.Every(podlogtest.T0, time.Second, 1))...)
	f.k.Terminate()
	if err := logcapture.Run(f.ctx, f.config()); err != nil {
		t.Fatal(err)
	}
	b, info := f.archived()
	if want := "0123456\nab\n" + store.LogTruncatedMarker(10); string(b) != want || !info.Complete || !info.Truncated {
		t.Errorf("archived %q (%+v), want %q complete and truncated", b, info, want)
	}
}

// A log whose task record is gone (retention) is not archived, and Run ends.
func TestNoRecord(t *testing.T) {
	f := newFixture(t, store.Options{})
	f.key.TaskID = "unknown"
	f.k.Start(podlogtest.Record{Time: podlogtest.T0, Text: []byte("x")})
	f.k.Terminate()
	if err := logcapture.Run(f.ctx, f.config()); err != nil {
		t.Fatal(err)
	}
	if b, info := f.archived(); len(b) != 0 || info.Size != 0 {
		t.Errorf("archived %q for a task without a record", b)
	}
}

// A capture of an earlier record's pod (Config.Nonce another record's) does
// not write into the record that now has the task ID, and Run ends as for a
// record that is gone; with the record's nonce, it archives.
func TestAnotherRecordsCapture(t *testing.T) {
	for _, tc := range []struct {
		nonce, want string
	}{{"n0", ""}, {"n1", "x\n"}} {
		f := newFixture(t, store.Options{})
		f.k.Start(podlogtest.Record{Time: podlogtest.T0, Text: []byte("x")})
		f.k.Terminate()
		cfg := f.config()
		cfg.Nonce = tc.nonce
		if err := logcapture.Run(f.ctx, cfg); err != nil {
			t.Fatal(err)
		}
		if b, _ := f.archived(); string(b) != tc.want {
			t.Errorf("nonce %s: archived %q, want %q", tc.nonce, b, tc.want)
		}
	}
}

// A saved cursor this version cannot read ends the log with a marker.
func TestBadCursor(t *testing.T) {
	f := newFixture(t, store.Options{})
	if _, err := f.logs.AppendLog(f.ctx, f.key, store.LogAppend{Data: []byte("old"), Cursor: []byte{0xff, 1, 2}}); err != nil {
		t.Fatal(err)
	}
	f.k.Start(podlogtest.Record{Time: podlogtest.T0, Text: []byte("x")})
	if err := logcapture.Run(f.ctx, f.config()); err != nil {
		t.Fatal(err)
	}
	b, info := f.archived()
	if want := "old\n" + logcapture.BadCursorMarker; string(b) != want || !info.Complete {
		t.Errorf("archived %q (%+v), want %q complete", b, info, want)
	}
}

// Missing configuration is an error, not a panic.
func TestConfigRequired(t *testing.T) {
	for _, cfg := range []logcapture.Config{{}, {Key: store.LogKey{TaskID: "x"}}} {
		if err := logcapture.Run(context.Background(), cfg); err == nil {
			t.Errorf("Run(%+v) = nil", cfg)
		}
	}
}

// A container that ended on a node that no longer serves its log: the
// capture keeps trying for GiveUpAfter, then ends the log with a marker so
// the pod's finalizer can go. While the container runs it never gives up.
func TestGivesUpOnAnUnreadableLog(t *testing.T) {
	f := newFixture(t, store.Options{})
	f.k.Start(podlogtest.Record{Time: podlogtest.T0, Text: []byte("read")})
	cfg := f.config()
	done := make(chan error, 1)
	go func() { done <- logcapture.Run(f.ctx, cfg) }()
	f.waitArchived("read\n")
	f.k.Unreachable(true)
	// Running: hours without news do not end the capture.
	for range 3 {
		f.clock.Step(time.Hour)
	}
	select {
	case err := <-done:
		t.Fatalf("the capture of a running container ended: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	f.k.Terminate()
	for {
		f.clock.Step(time.Hour)
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			b, info := f.archived()
			if want := "read\n" + logcapture.UnreadableMarker(logcapture.DefaultGiveUpAfter); string(b) != want || !info.Complete {
				t.Errorf("archived %q (%+v), want %q complete", b, info, want)
			}
			return
		case <-f.ctx.Done():
			t.Fatal("the capture never gave up")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A container whose node was deleted (the API server answers 404 for the
// node): once it ended, a few such answers end the log with a marker at
// once, not after GiveUpAfter (TestChaosTiny's node fault held a pod's
// finalizer for the whole 5 minutes).
func TestGivesUpOnAGoneNode(t *testing.T) {
	f := newFixture(t, store.Options{})
	f.k.Start()
	f.k.Terminate()
	f.k.NodeGone()
	if err := logcapture.Run(f.ctx, f.config()); err != nil {
		t.Fatal(err)
	}
	b, info := f.archived()
	if string(b) != logcapture.NodeGoneMarker || !info.Complete {
		t.Errorf("archived %q (%+v), want the marker, complete", b, info)
	}
}

// A container on a node without an address (a kwok node: the API server
// answers "no preferred addresses found"): once it ended, a few such answers
// end the log with a marker at once, without waiting for GiveUpAfter; while
// it runs, the capture waits.
func TestGivesUpOnANodeWithoutAddress(t *testing.T) {
	f := newFixture(t, store.Options{})
	f.k.Start()
	f.k.NoNodeAddress()
	done := make(chan error, 1)
	go func() { done <- logcapture.Run(f.ctx, f.config()) }()
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-f.ctx.Done():
				t.Fatalf("timed out waiting for %s", what)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	eventually("log requests while the container runs", func() bool { return f.k.Opens() >= 5 })
	select {
	case err := <-done:
		t.Fatalf("the capture of a running container ended: %v", err)
	default:
	}
	f.k.Terminate()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b, info := f.archived()
	if string(b) != logcapture.NoAddressMarker || !info.Complete {
		t.Errorf("archived %q (%+v), want the marker, complete", b, info)
	}
}
