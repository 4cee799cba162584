package podlog

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

// Tail keeps the last lines of one container's log, as given to Add, joining
// the pieces of a line. It is safe for concurrent use.
type Tail struct {
	mu    sync.Mutex
	n     int
	lines []string
	open  bool // the last line has no newline yet: the next Line continues it
}

// NewTail returns a Tail that keeps the last n lines (at least one).
func NewTail(n int) *Tail { return &Tail{n: max(n, 1)} }

// Add appends l, a Line (or piece) of the container's log.
func (t *Tail) Add(l Line) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open {
		t.lines[len(t.lines)-1] += l.Text
	} else {
		t.lines = append(t.lines, l.Text)
	}
	t.open = !l.Newline
	if len(t.lines) > t.n {
		t.lines = append([]string(nil), t.lines[len(t.lines)-t.n:]...)
	}
}

// Lines returns the kept lines, oldest first, without newlines.
func (t *Tail) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.lines...)
}

// LastLines reads the last n lines of a container's current log in one request
// (tailLines), without newlines: for explaining a failure when the log was not
// followed.
func LastLines(ctx context.Context, client kubernetes.Interface, namespace, pod, container string, n int64) ([]string, error) {
	b, err := client.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container, TailLines: &n}).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading log of %s/%s[%s]: %w", namespace, pod, container, err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	if len(b) == 0 {
		return nil, nil
	}
	var out []string
	for _, l := range bytes.Split(b, []byte("\n")) {
		out = append(out, string(l))
	}
	return out, nil
}
