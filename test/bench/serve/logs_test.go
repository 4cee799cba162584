package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/bench/benchresult"
)

// logSize is the shape of one log capture run.
type logSize struct {
	tasks int
	bytes int64 // each task's log
	// parallelism is the service's --parallelism; 0 keeps its default (100).
	parallelism int
	// verify is how many archived logs are compared with the payload byte
	// for byte (every log's size and completeness is checked).
	verify int
	// timeout bounds the wait for every log.
	timeout time.Duration
	// progress prints a line every 10 s to stderr.
	progress bool
}

// benchLogSize is the benchmark's size: 200 tasks of 10 MiB each
// (KUBETASK_BENCH_LOG_TASKS, KUBETASK_BENCH_LOG_MIB change them).
func benchLogSize() logSize {
	return logSize{tasks: envInt("KUBETASK_BENCH_LOG_TASKS", 200), bytes: int64(envInt("KUBETASK_BENCH_LOG_MIB", 10)) << 20,
		verify: 5, timeout: 30 * time.Minute, progress: true}
}

// logResult is what one log capture run measured.
type logResult struct {
	size logSize
	// From the first submission sent: the last outcome and the last
	// PodReleased (sent once the pod's log is complete in the archive)
	// received on the watch stream.
	outcomes, complete time.Duration
	archived           int64 // sum of the archived sizes
	peakRSS, hwm       int64 // the largest VmRSS sampled, VmHWM at the end
	storeBytes         int64 // the SQLite files at the end
	cpu                string
	requests           string // the API server's, all clients, during the run
}

func (r logResult) bytesPerSecond() float64 { return float64(r.archived) / r.complete.Seconds() }

func (r logResult) summary() string {
	par := "default"
	if r.size.parallelism > 0 {
		par = strconv.Itoa(r.size.parallelism)
	}
	return fmt.Sprintf("%d tasks x %d bytes of log on the local node (parallelism %s):\n"+
		"  archived %d bytes; every outcome after %.1f s, every log complete after %.1f s: %.1f MiB/s archived\n"+
		"  kubetask serve memory: peak VmRSS sampled %.0f MiB, VmHWM %.0f MiB; SQLite files %.0f MiB\n"+
		"  CPU during the run: %s\n"+
		"  API server requests during the run: %s",
		r.size.tasks, r.size.bytes, par, r.archived, r.outcomes.Seconds(), r.complete.Seconds(), r.bytesPerSecond()/(1<<20),
		mib(r.peakRSS), mib(r.hwm), mib(r.storeBytes), r.cpu, r.requests)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// BenchmarkServeLogCapture runs 200 tasks whose container, a real process on
// the local process node, writes 10 MiB of log (cat of a file), through
// `kubetask serve` with its default SQLite store and parallelism. It reports
// the archived bytes/s (the sum of the archived sizes over the time from the
// first submission to the last log complete) and the service's peak RSS; it
// checks that every archived log is complete with exactly the bytes written,
// and compares a few of them byte for byte.
//
//	go test ./test/bench/serve -run '^$' -bench BenchmarkServeLogCapture -benchtime 1x -timeout 40m
func BenchmarkServeLogCapture(b *testing.B) {
	res := benchresult.Start(b, "serve")
	sz := benchLogSize()
	for range b.N {
		r := runServeLogCapture(b, sz)
		fmt.Println(r.summary())
		res.Report(b, r.bytesPerSecond()/(1<<20), "archived-MiB/s")
		res.Report(b, mib(r.peakRSS), "peak-rss-MiB")
		res.Report(b, mib(r.hwm), "vmhwm-MiB")
		res.Report(b, r.complete.Seconds(), "s-to-last-log")
	}
}

// TestServeLogCaptureTiny runs BenchmarkServeLogCapture's code at a tiny
// size, every log compared byte for byte.
func TestServeLogCaptureTiny(t *testing.T) {
	r := runServeLogCapture(t, logSize{tasks: 3, bytes: 300 << 10, verify: 3, timeout: 2 * time.Minute})
	t.Log(r.summary())
}

// logPayload is n bytes of text lines of 10 to 199 bytes, 105 on average
// (no carriage return: the runtime turns CRLF into LF), the last one ending
// at n with a newline; the same for the same n.
func logPayload(n int64) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?-_=+/()[]{}<>"
	text := strings.Repeat(alphabet, 3)[:190]
	var b bytes.Buffer
	b.Grow(int(n))
	for i := 0; int64(b.Len()) < n; i++ {
		fmt.Fprintf(&b, "%08d %s\n", i, text[:(i*37)%len(text)])
	}
	p := b.Bytes()[:n]
	if n > 0 {
		p[n-1] = '\n'
	}
	return p
}

// catTask is a task for the local process node whose only container writes
// the file at path to its output.
func catTask(name, path string) *task.Task {
	grace := int64(5)
	t := &task.Task{TypeMeta: metav1.TypeMeta{APIVersion: task.APIVersion, Kind: task.Kind}, ObjectMeta: metav1.ObjectMeta{Name: name}}
	t.Spec.Template.Spec = corev1.PodSpec{TerminationGracePeriodSeconds: &grace,
		Containers: []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"cat", path}}}}
	return t
}

// runServeLogCapture runs sz.tasks tasks that each write sz.bytes of log
// through the service and fails tb unless every task succeeds and every
// archived log is complete with exactly sz.bytes (sz.verify of them equal to
// what was written).
func runServeLogCapture(tb testing.TB, sz logSize) logResult {
	tb.Helper()
	ctx := context.Background()
	r := logResult{size: sz}
	env := clustertest.New(tb)
	payload := logPayload(sz.bytes)
	path := filepath.Join(tb.TempDir(), "payload")
	if err := os.WriteFile(path, payload, 0o644); err != nil {
		tb.Fatal(err)
	}
	var extra []string
	if sz.parallelism > 0 {
		extra = append(extra, "--parallelism", strconv.Itoa(sz.parallelism))
	}
	s := startService(tb, env, extra...)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	cursor, err := s.cursor(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	w := s.watch(wctx, cursor)

	docs := make([][]byte, sz.tasks)
	for i := range docs {
		if docs[i], err = json.Marshal(catTask(fmt.Sprintf("log-%d", i), path)); err != nil {
			tb.Fatal(err)
		}
	}
	ids := make([]string, sz.tasks)
	cpu := newCPUMeter(s)
	reqs := apiserverRequests(tb)
	start := time.Now()
	sampler := s.sampleMemory(wctx, start, w, sz.progress)
	_, _, errs := concurrently(sz.tasks, 8, func(i int) error {
		var err error
		ids[i], err = s.submit(ctx, docs[i])
		return err
	})
	if len(errs) > 0 {
		tb.Fatalf("%d of %d submissions failed; the first: %v", len(errs), sz.tasks, errs[0])
	}
	if err := w.wait(sz.timeout, "every log complete (PodReleased)", func(_, released int) bool { return released >= sz.tasks }); err != nil {
		tb.Fatal(err)
	}
	lastDone, _ := w.last(ids, true)
	lastOutcome, outcomes := w.last(ids, false)
	r.complete, r.outcomes = lastDone.Sub(start), lastOutcome.Sub(start)
	r.cpu, _ = cpu.report()
	r.requests = requestReport(reqs, apiserverRequests(tb), 8)
	for _, o := range outcomes {
		if o.ev.Phase != "Succeeded" {
			tb.Fatalf("task %s: %s/%s %s, want Succeeded", o.ev.TaskID, o.ev.Phase, o.ev.Reason, o.ev.Message)
		}
	}
	if len(outcomes) != sz.tasks {
		tb.Fatalf("%d outcomes of %d tasks", len(outcomes), sz.tasks)
	}
	_, r.hwm, err = s.memory()
	if err != nil {
		tb.Fatal(err)
	}
	stopWatch()
	r.peakRSS = sampler.wait()

	// Every archive: complete, not truncated, exactly the bytes written.
	var mu sync.Mutex
	_, _, errs = concurrently(sz.tasks, 8, func(i int) error {
		info, err := s.logHeaders(ctx, ids[i])
		if err != nil {
			return err
		}
		mu.Lock()
		r.archived += info.size
		mu.Unlock()
		if !info.complete || info.truncated || info.size != sz.bytes {
			return fmt.Errorf("the archived log of task %s: %d bytes, complete %v, truncated %v; want %d bytes, complete", ids[i], info.size, info.complete, info.truncated, sz.bytes)
		}
		return nil
	})
	if len(errs) > 0 {
		tb.Fatalf("%d of %d archived logs are wrong; the first: %v", len(errs), sz.tasks, errs[0])
	}
	for _, id := range ids[:min(sz.verify, len(ids))] {
		got, err := s.log(ctx, id)
		if err != nil {
			tb.Fatal(err)
		}
		if !bytes.Equal(got, payload) {
			i := 0
			for i < min(len(got), len(payload)) && got[i] == payload[i] {
				i++
			}
			tb.Fatalf("the archived log of task %s differs from what its container wrote at byte %d (got %d bytes, want %d)", id, i, len(got), len(payload))
		}
	}
	for _, f := range []string{"tasks.db", "tasks.db-wal"} {
		if st, err := os.Stat(filepath.Join(s.stateDir, f)); err == nil {
			r.storeBytes += st.Size()
		}
	}
	return r
}

// memorySampler samples the service's VmRSS every 200 ms.
type memorySampler struct {
	done chan struct{}
	peak int64
}

// sampleMemory samples the service's resident set size until ctx ends and,
// with progress, prints a line every 10 s.
func (s *service) sampleMemory(ctx context.Context, start time.Time, w *watcher, progress bool) *memorySampler {
	m := &memorySampler{done: make(chan struct{})}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		next := start.Add(10 * time.Second)
		for {
			if rss, _, err := s.memory(); err == nil {
				m.peak = max(m.peak, rss)
				if progress && time.Now().After(next) {
					next = next.Add(10 * time.Second)
					t, rel := w.counts()
					fmt.Fprintf(os.Stderr, "  %5.0f s: %d outcomes, %d logs complete, kubetask serve VmRSS %.0f MiB\n", time.Since(start).Seconds(), t, rel, mib(rss))
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return m
}

// wait waits for the sampler to stop (its context ended) and returns the
// peak.
func (m *memorySampler) wait() int64 {
	<-m.done
	return m.peak
}

func TestLogPayload(t *testing.T) {
	for _, n := range []int64{1, 100, 300 << 10, 1 << 20} {
		p := logPayload(n)
		lines := bytes.Count(p, []byte("\n"))
		switch {
		case int64(len(p)) != n:
			t.Errorf("logPayload(%d): %d bytes", n, len(p))
		case p[len(p)-1] != '\n':
			t.Errorf("logPayload(%d) does not end with a newline", n)
		case bytes.IndexByte(p, '\r') >= 0:
			t.Errorf("logPayload(%d) holds a carriage return", n)
		case !bytes.Equal(p, logPayload(n)):
			t.Errorf("logPayload(%d) differs between calls", n)
		case n >= 1<<20 && (n/int64(lines) < 100 || n/int64(lines) > 110):
			t.Errorf("logPayload(%d): %d bytes per line on average, want about 105", n, n/int64(lines))
		}
	}
}
