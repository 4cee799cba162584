package podlog_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/pkg/podlog"
	"github.com/kubetask/kubetask/pkg/podlog/podlogtest"
)

// The follower through client-go and HTTP (podlogtest's fake kubelet): a
// stream that follows a running container, breaks, a restart while the
// stream is broken, and a follower stopped and resumed from its Cursor in
// the middle.
func TestFollowerThroughTheAPI(t *testing.T) {
	k := podlogtest.NewKubelet(t)
	at := podlogtest.Every(podlogtest.T0, 300*time.Millisecond, 1)
	first := podlogtest.Split([]byte("one\ntwo\nthree\nhalf a line"), 16<<10, at)
	second := podlogtest.Split([]byte("again\nand the end\n"), 16<<10, func(i int) time.Time { return podlogtest.T0.Add(time.Minute + time.Duration(i)*time.Second) })
	k.Start(first[:2]...)
	k.CutOpen(0, podlogtest.Cut{At: 40}) // in "two"

	var mu sync.Mutex // out and cur, written by the followers' goroutines
	var out bytes.Buffer
	var cur []byte
	text := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	got := make(chan struct{}, 100)
	newFollower := func(resume []byte) *podlog.Follower {
		var f *podlog.Follower
		f, err := podlog.New(podlog.Config{
			Client: k.Client(), Namespace: podlogtest.Namespace, Pod: podlogtest.PodName, Container: podlogtest.Container,
			Progress: func() podlog.Progress { return podlog.ProgressOf(k.Pod(), podlogtest.Container) },
			Changed:  k.Changed(), Clock: clocktesting.NewFakeClock(podlogtest.T0), PartialLines: true, Resume: resume,
			OnLine: func(l podlog.Line) {
				mu.Lock()
				defer mu.Unlock()
				out.WriteString(l.Text)
				if l.Newline {
					out.WriteByte('\n')
				}
				cur = f.Cursor()
				got <- struct{}{}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor := func(want string) {
		t.Helper()
		for text() != want {
			select {
			case <-got:
			case <-ctx.Done():
				t.Fatalf("got %q, want %q", text(), want)
			}
		}
	}

	// The first follower reads while the container runs, and is stopped.
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	f := newFollower(nil)
	go func() { done <- f.Run(fctx) }()
	waitFor("one\ntwo\n")
	k.Write(first[2:]...)
	waitFor("one\ntwo\nthree\nhalf a line") // PartialLines: the piece comes before its newline
	stop()
	<-done
	mu.Lock()
	resume := cur
	mu.Unlock()

	// While nobody follows, the container restarts and ends.
	k.Start(second...)
	k.Terminate()
	if err := newFollower(resume).Run(ctx); err != nil {
		t.Fatal(err)
	}
	if want := "one\ntwo\nthree\nhalf a lineagain\nand the end\n"; text() != want {
		t.Errorf("got %q, want %q\nrequests: %v", text(), want, k.Requests())
	}
}
