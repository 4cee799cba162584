package simulation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/logcapture"
	"github.com/kubetask/kubetask/pkg/store"
)

// tickEvery is how often a running main container writes a line.
const tickEvery = 700 * time.Millisecond

// captureGiveUp is the captures' GiveUpAfter: a log the node no longer
// serves is ended with a marker this long after the container ended (5
// minutes in production; shorter here so that a lost node's pod is let go
// within the liveness bound).
const captureGiveUp = time.Minute

// containerLog is what the kubelet keeps of a main container's log: its
// lines follow from its start, its end and its exit code (a line at the
// start, one every tickEvery while it runs, one at its end), so a reader
// and the checker compute the same bytes.
type containerLog struct {
	task    string // the history's name of its task
	id      string // its task's ID (the archive's key)
	attempt int
	start   time.Time
	end     time.Time // zero: runs
	code    int32
	lostAt  time.Time // its node was lost then: nothing is served after
}

// logLine is one line of a container's log.
type logLine struct {
	at   time.Time
	text string // with its newline
}

// lines are the lines the container wrote by now. A tick is written after
// its instant (strictly): one due at the instant the container ends is
// never written, so a line once served never changes.
func (c *containerLog) lines(now time.Time) []logLine {
	until := now
	ended := !c.end.IsZero() && !c.end.After(now)
	if ended {
		until = c.end
	}
	out := []logLine{{c.start, fmt.Sprintf("%s/%d started\n", c.task, c.attempt)}}
	for i, at := 1, c.start.Add(tickEvery); at.Before(until); i, at = i+1, at.Add(tickEvery) {
		out = append(out, logLine{at, fmt.Sprintf("tick %d\n", i)})
	}
	if ended {
		out = append(out, logLine{c.end, fmt.Sprintf("exit %d\n", c.code)})
	}
	return out
}

// written is the whole log as the container wrote it (its end reached).
func (c *containerLog) written() string {
	var b strings.Builder
	for _, l := range c.lines(c.end) {
		b.WriteString(l.text)
	}
	return b.String()
}

// nextLine is when the next line shows (zero: none will, or only at the
// container's end, which wakes the streams).
func (c *containerLog) nextLine(now time.Time) time.Time {
	if !c.end.IsZero() && !c.end.After(now) {
		return time.Time{}
	}
	at := c.start.Add(time.Duration(len(c.lines(now))) * tickEvery)
	return at.Add(time.Nanosecond)
}

// stopLog ends the main container's log of pod uid at now (srv.mu held):
// the kubelet reported it ended (code), or killed it on a grace-0 deletion.
func (s *apiServer) stopLog(uid string, code int32) {
	if c := s.clogs[uid]; c != nil && c.end.IsZero() {
		c.end, c.code = s.now(), code
	}
	s.logChanged()
}

// logChanged wakes the log streams that follow (srv.mu held).
func (s *apiServer) logChanged() {
	close(s.logWake)
	s.logWake = make(chan struct{})
}

// logTransport serves GET pods/log as the API server does, from the
// kubelet's logs: each request a step and its answer another (an injected
// failure is a 503), each line of the stream a step of its own (a failed
// one breaks the stream), a follow stream open until the container ended
// (all sent) or the pod is gone; a pod on no node has an empty log, as
// kube-apiserver answers (test/integration/cluster's contract test).
type logTransport struct {
	srv   *apiServer
	actor string
}

func statusResponse(req *http.Request, err error) *http.Response {
	var st metav1.Status
	if s, ok := err.(apierrors.APIStatus); ok { //nolint:errorlint // the apierrors constructors' own type
		st = s.Status()
	}
	st.Kind, st.APIVersion = "Status", "v1"
	body, _ := json.Marshal(st) //nolint:errchkjson // a plain struct
	return &http.Response{StatusCode: int(st.Code), Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(bytes.NewReader(body)), Request: req}
}

func (t *logTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	actor := actorOf(ctx, t.actor)
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/") // api v1 namespaces ns pods name log
	if len(parts) != 7 || parts[4] != "pods" || parts[6] != "log" {
		return statusResponse(req, apierrors.NewBadRequest("simulated: only pods/log")), nil
	}
	ns, name := parts[3], parts[5]
	q := req.URL.Query()
	d := "get pods/log " + name
	s := t.srv
	if err := s.steps.wait(ctx, actor, actor+" api> "+d); err != nil {
		if errors.Is(err, errInjected) {
			return statusResponse(req, apierrors.NewServiceUnavailable("simulated: "+d+" refused")), nil
		}
		return nil, err
	}
	var since time.Time
	if v := q.Get("sinceTime"); v != "" {
		since, _ = time.Parse(time.RFC3339, v)
	}
	s.mu.Lock()
	pod := s.pods[s.keyFor(actor, ns, name)]
	var c *containerLog
	var uid string
	var ferr error
	var unbound bool
	switch {
	case pod == nil:
		ferr = apierrors.NewNotFound(podsGR, name)
	case !hasContainer(pod, q.Get("container")):
		ferr = apierrors.NewBadRequest(fmt.Sprintf("container %s is not valid for pod %s", q.Get("container"), name))
	case pod.Spec.NodeName == "":
		// kube-apiserver answers an empty log for a pod on no node (its
		// LogLocation has no node to ask): 200, nothing.
		unbound = true
	case q.Get("previous") == "true":
		ferr = apierrors.NewBadRequest(fmt.Sprintf("previous terminated container %q in pod %q not found", q.Get("container"), name))
	default:
		uid = string(pod.UID)
		c = s.clogs[uid]
		switch {
		case c != nil && !c.lostAt.IsZero():
			ferr = apierrors.NewInternalError(fmt.Errorf("Get \"https://node-1:10250/containerLogs/%s/%s/%s\": dial tcp 10.0.0.1:10250: connect: no route to host", ns, name, q.Get("container")))
		case c == nil || q.Get("container") != "main":
			ferr = apierrors.NewBadRequest(fmt.Sprintf("container %q in pod %q is waiting to start: ContainerCreating", q.Get("container"), name))
		}
	}
	s.mu.Unlock()
	if err := s.steps.wait(ctx, actor, actor+" api< "+d); err != nil {
		return nil, apierrors.NewTimeoutError("simulated: the answer to "+d+" was lost", 0)
	}
	if ferr != nil {
		return statusResponse(req, ferr), nil
	}
	if unbound {
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/plain"}}, Body: http.NoBody, Request: req}, nil
	}
	pr, pw := io.Pipe()
	go t.stream(ctx, actor, ns, name, uid, c, since, q.Get("follow") == "true", pw)
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/plain"}}, Body: pr, Request: req}, nil
}

// stream writes the log's lines from since (whole seconds, as the
// kubelet's sinceTime) into pw, one step a line.
func (t *logTransport) stream(ctx context.Context, actor, ns, name, uid string, c *containerLog, since time.Time, follow bool, pw *io.PipeWriter) {
	s := t.srv
	sent := 0
	for {
		s.mu.Lock()
		now := s.now()
		all := c.lines(now)
		lost := !c.lostAt.IsZero()
		p := s.pods[s.keyFor(actor, ns, name)]
		exists := p != nil && string(p.UID) == uid
		ended := !c.end.IsZero() && !c.end.After(now)
		next := c.nextLine(now)
		wake := s.logWake
		s.mu.Unlock()
		if lost {
			// The node is gone: the connection breaks.
			pw.CloseWithError(io.ErrUnexpectedEOF)
			return
		}
		for ; sent < len(all); sent++ {
			l := all[sent]
			if l.at.Before(since) {
				continue
			}
			if err := s.steps.wait(ctx, actor, fmt.Sprintf("%s log< %s %q", actor, name, strings.TrimSpace(l.text))); err != nil {
				pw.CloseWithError(io.ErrUnexpectedEOF) // a broken stream
				return
			}
			if _, err := fmt.Fprintf(pw, "%s %s", l.at.UTC().Format(time.RFC3339Nano), l.text); err != nil {
				return // the reader closed it
			}
		}
		if !follow || ended || !exists {
			_ = pw.Close() // never fails
			return
		}
		var timer <-chan time.Time
		if !next.IsZero() {
			timer = time.After(next.Sub(now))
		}
		select {
		case <-wake:
		case <-timer:
		case <-ctx.Done():
			pw.CloseWithError(ctx.Err())
			return
		}
	}
}

// logsClient is a core client whose GetLogs requests go to the simulated
// API server's pods/log.
func (s *apiServer) logsClient(actor string) corev1client.CoreV1Interface {
	cfg := &rest.Config{Host: "http://simulated", QPS: -1}
	cfg.ContentConfig = rest.ContentConfig{GroupVersion: &corev1.SchemeGroupVersion, NegotiatedSerializer: scheme.Codecs.WithoutConversion()}
	c, err := corev1client.NewForConfigAndClient(cfg, &http.Client{Transport: &logTransport{srv: s, actor: actor}})
	if err != nil {
		panic(err)
	}
	return c
}

// capture is the executors' CaptureLogs: logcapture.Run, as kubetask
// serve runs it, on the process's client and store.
func capture(client *simClient, logs store.Logs, log *slog.Logger) func(context.Context, executor.LogCapture) error {
	return func(ctx context.Context, lc executor.LogCapture) error {
		return logcapture.Run(ctx, logcapture.Config{
			Client: client, Namespace: lc.Namespace, Pod: lc.Pod, Container: lc.Container, UID: lc.UID,
			Key: store.LogKey{TaskID: lc.TaskID, Attempt: lc.Attempt, Container: lc.Container}, Nonce: lc.Nonce,
			Logs: logs, Progress: lc.Progress, Changed: lc.Changed, GiveUpAfter: captureGiveUp, Logger: log,
		})
	}
}

// The store's log archive, each call a step and its answer another.

func (s *simStore) AppendLog(ctx context.Context, key store.LogKey, a store.LogAppend) (store.LogInfo, error) {
	what := fmt.Sprintf("appendlog %s/%d", key.TaskID, key.Attempt)
	if err := s.before(ctx, what); err != nil {
		return store.LogInfo{}, err
	}
	info, err := s.inner.(store.Logs).AppendLog(context.Background(), key, a)
	if aerr := s.after(ctx, what); aerr != nil {
		return store.LogInfo{}, aerr
	}
	return info, err
}

func (s *simStore) ReadLog(ctx context.Context, key store.LogKey, offset int64, limit int) ([]byte, store.LogInfo, error) {
	what := fmt.Sprintf("readlog %s/%d", key.TaskID, key.Attempt)
	if err := s.before(ctx, what); err != nil {
		return nil, store.LogInfo{}, err
	}
	b, info, err := s.inner.(store.Logs).ReadLog(context.Background(), key, offset, limit)
	if aerr := s.after(ctx, what); aerr != nil {
		return nil, store.LogInfo{}, aerr
	}
	return b, info, err
}

func (s *simStore) LogKeys(ctx context.Context, taskID string) ([]store.LogKey, error) {
	if err := s.before(ctx, "logkeys "+taskID); err != nil {
		return nil, err
	}
	keys, err := s.inner.(store.Logs).LogKeys(context.Background(), taskID)
	if aerr := s.after(ctx, "logkeys "+taskID); aerr != nil {
		return nil, aerr
	}
	return keys, err
}

// LogFacts is what the end state says of one main container's log: what
// the kubelet wrote, and what the archive holds.
type LogFacts struct {
	Written  string
	Archived string
	Complete bool
	// Lost: the container's node was lost (its log unreadable from then).
	Lost bool
	// None: nothing was archived (no log at all).
	None bool
}

func (f *LogFacts) String() string {
	state := "complete"
	switch {
	case f.None:
		state = "none"
	case !f.Complete:
		state = "not complete"
	}
	var lost string
	if f.Lost {
		lost = ", node lost"
	}
	return fmt.Sprintf("wrote %d bytes, archived %d, %s%s", len(f.Written), len(f.Archived), state, lost)
}

// logFacts writes what the archive holds of every main container that
// started into the history (the end state).
func (w *world) logFacts() {
	w.srv.mu.Lock()
	uids := make([]string, 0, len(w.srv.clogs))
	for uid := range w.srv.clogs {
		uids = append(uids, uid)
	}
	w.srv.mu.Unlock()
	sort.Strings(uids)
	for _, uid := range uids {
		w.srv.mu.Lock()
		c := *w.srv.clogs[uid]
		w.srv.mu.Unlock()
		f := w.retired[uid] // a retired record's, as archived when it was deleted
		if f == nil {
			f = w.logFactsOf(c)
		}
		w.hist.add(Event{Kind: KLog, Task: c.task, Attempt: c.attempt, UID: uid, Note: f.String(), Log: f})
	}
}

// logFactsOf is what container log c wrote until now and what the store
// holds of it.
func (w *world) logFactsOf(c containerLog) *LogFacts {
	end := c.end
	if !c.lostAt.IsZero() && (end.IsZero() || c.lostAt.Before(end)) {
		end = c.lostAt
	}
	if end.IsZero() {
		end = time.Now() // still running: what it wrote so far
	}
	f := &LogFacts{Lost: !c.lostAt.IsZero()}
	cc := c
	cc.end = end
	f.Written = cc.written()
	b, info, err := w.mem.(store.Logs).ReadLog(context.Background(), store.LogKey{TaskID: c.id, Attempt: c.attempt, Container: "main"}, 0, 1<<20)
	switch {
	case errors.Is(err, store.ErrNotFound):
		f.None = true
	case err != nil:
		panic(err)
	default:
		f.Archived, f.Complete = string(b), info.Complete
	}
	return f
}

// hasContainer: the pod has a container (or init container) of that name,
// which kube-apiserver checks first.
func hasContainer(p *corev1.Pod, name string) bool {
	for _, cs := range [][]corev1.Container{p.Spec.Containers, p.Spec.InitContainers} {
		for _, c := range cs {
			if c.Name == name {
				return true
			}
		}
	}
	return false
}
