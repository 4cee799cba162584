package podlog

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/pkg/podlog/podlogtest"
)

// This file is a fake node for the follower's tests: container logs as CRI
// records, served as the kubelet serves them (k8s.io/cri-client/pkg/logs
// ReadLogs), with streams cut where a test says.

// record is one CRI log record (podlogtest holds the kubelet's serving logic,
// shared with the tests of packages that use the follower).
type record = podlogtest.Record

// t0 is the time of the first record of every test log.
var t0 = podlogtest.T0

// toRecords splits what a container wrote into records like the local node
// (and containerd): see podlogtest.Split.
func toRecords(out []byte, maxRecord int, at func(i int) time.Time) []record {
	return podlogtest.Split(out, maxRecord, at)
}

// every returns a stamping function: records come in groups of same stamps,
// group g at t0 + g*step.
func every(step time.Duration, group int) func(int) time.Time {
	return podlogtest.Every(t0, step, group)
}

// serve is the kubelet's ReadLogs with timestamps (podlogtest.Serve).
func serve(recs []record, since *metav1.Time) []byte { return podlogtest.Serve(recs, since) }

// cut ends a stream after at bytes (when at >= 0), cleanly or with an error.
type cut struct {
	at    int
	clean bool
}

// fakeNode serves the logs of one container's instances. Every instance's log
// is complete from the start; current says which instance the node runs.
type fakeNode struct {
	mu        sync.Mutex
	instances [][]record
	current   int
	// cuts: the stream of the open with this index (from 0) is cut.
	cuts map[int]cut
	// onOpen runs before open n is served, under mu.
	onOpen func(n int)
	opens  int
	// requests records each request ("cur since=..." / "prev since=...").
	requests []string
	progress Progress
	changed  chan struct{}
	served   map[string][]byte // bodies by instance and sinceTime
}

func newFakeNode(instances ...[]record) *fakeNode {
	return &fakeNode{instances: instances, cuts: map[int]cut{}, changed: make(chan struct{}, 1),
		progress: Progress{Started: true}, served: map[string][]byte{}}
}

func (n *fakeNode) getProgress() Progress {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.progress
}

func (n *fakeNode) open(_ context.Context, opts *corev1.PodLogOptions) (io.ReadCloser, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := n.opens
	n.opens++
	if n.onOpen != nil {
		n.onOpen(i)
	}
	// Wake the follower's next wait: the tests never wait on the clock.
	select {
	case n.changed <- struct{}{}:
	default:
	}
	since := "-"
	if opts.SinceTime != nil {
		since = opts.SinceTime.UTC().Format(time.RFC3339)
	}
	inst := n.current
	if opts.Previous {
		inst--
		n.requests = append(n.requests, "prev since="+since)
		if inst < 0 {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("previous terminated container %q in pod %q not found", "c", "p"))
		}
	} else {
		n.requests = append(n.requests, "cur since="+since)
	}
	key := fmt.Sprintf("%d %s", inst, since)
	body, ok := n.served[key]
	if !ok {
		body = serve(n.instances[inst], opts.SinceTime)
		n.served[key] = body
	}
	c, ok := n.cuts[i]
	if !ok || c.at < 0 || c.at >= len(body) {
		return io.NopCloser(bytes.NewReader(body)), nil
	}
	var err error
	if !c.clean {
		err = io.ErrUnexpectedEOF
	}
	return io.NopCloser(&cutReader{r: bytes.NewReader(body[:c.at]), err: err}), nil
}

// cutReader returns r's bytes, then err (io.EOF when nil).
type cutReader struct {
	r   io.Reader
	err error
}

func (c *cutReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err == io.EOF && c.err != nil {
		err = c.err
	}
	return n, err
}

// collector gathers a follower's lines.
type collector struct {
	lines []Line
}

func (c *collector) add(l Line) { c.lines = append(c.lines, l) }

// bytes is what a writer of the lines prints.
func (c *collector) bytes() []byte {
	var b bytes.Buffer
	for _, l := range c.lines {
		b.WriteString(l.Text)
		if l.Newline {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// firstDiff returns the first offset where a and b differ (-1 when equal).
func firstDiff(a, b []byte) int {
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
