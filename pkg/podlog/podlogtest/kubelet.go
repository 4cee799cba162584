package podlogtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The pod a Kubelet serves: Namespace/PodName, with one container.
const (
	Namespace = "ns"
	PodName   = "p"
	Container = "c"
)

// Cut ends the response to one log request after At bytes, cleanly (the
// stream ends) or not (the connection breaks).
type Cut struct {
	At    int
	Clean bool
}

// Kubelet is a fake API server for one pod with one container. It serves
// GET pods/log (container, follow, previous, timestamps, sinceTime) from the
// container's instances as the kubelet does, and GET of the pod. While the
// container runs, a follow stream of the current instance stays open and
// streams what Write adds, until the container terminates, restarts or the
// pod is deleted. It is safe for concurrent use.
type Kubelet struct {
	srv    *httptest.Server
	client kubernetes.Interface

	mu         sync.Mutex
	instances  [][]Record
	rotated    []int // per instance: records rotated away from its start
	terminated bool
	gone       bool
	// unreachable: log requests fail with this message (500), as when the
	// API server cannot reach the node's kubelet; "" when they do not.
	unreachable string
	// nodeGone: log requests fail as for a pod whose node object is gone.
	nodeGone bool
	cuts     map[int]Cut
	onOpen   func(n int)
	opens    int
	requests []string
	// wake is closed (and replaced) at every change, for open streams.
	wake    chan struct{}
	changed chan struct{}
}

// NewKubelet starts a fake API server for pod Namespace/PodName; the
// test's cleanup stops it. The container has not started.
func NewKubelet(t testing.TB) *Kubelet {
	k := &Kubelet{cuts: map[int]Cut{},
		wake: make(chan struct{}), changed: make(chan struct{}, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/namespaces/{ns}/pods/{pod}/log", k.serveLog)
	mux.HandleFunc("GET /api/v1/namespaces/{ns}/pods/{pod}", k.servePod)
	k.srv = httptest.NewServer(mux)
	t.Cleanup(k.Close)
	c, err := kubernetes.NewForConfig(&rest.Config{Host: k.srv.URL, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	k.client = c
	return k
}

// Close ends every open stream and stops the server.
func (k *Kubelet) Close() {
	k.mu.Lock()
	k.gone = true
	k.changeLocked()
	k.mu.Unlock()
	k.srv.CloseClientConnections()
	k.srv.Close()
}

// Client is a clientset that talks to this kubelet (no client-side rate limit).
func (k *Kubelet) Client() kubernetes.Interface { return k.client }

// Changed is signalled (buffer of one) at every log request and every change
// of the pod: a follower's Config.Changed, so that it never waits on its clock.
func (k *Kubelet) Changed() <-chan struct{} { return k.changed }

// Start starts a new instance of the container that has written recs (a
// restart when one ran before: that one becomes the previous instance).
func (k *Kubelet) Start(recs ...Record) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.instances = append(k.instances, append([]Record(nil), recs...))
	k.rotated = append(k.rotated, 0)
	k.changeLocked()
}

// Write appends records to the current instance's log.
func (k *Kubelet) Write(recs ...Record) {
	k.mu.Lock()
	defer k.mu.Unlock()
	i := len(k.instances) - 1
	k.instances[i] = append(k.instances[i], recs...)
	k.changeLocked()
}

// Terminate terminates the container for good (the pod succeeds).
func (k *Kubelet) Terminate() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.terminated = true
	k.changeLocked()
}

// Delete deletes the pod: the pod and its logs answer NotFound.
func (k *Kubelet) Delete() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.gone = true
	k.changeLocked()
}

// Rotate rotates the current instance's log: its first n records (counted
// from the start of the log, rotated or not) are no longer served.
func (k *Kubelet) Rotate(n int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	i := len(k.instances) - 1
	k.rotated[i] = max(k.rotated[i], min(n, len(k.instances[i])))
	k.changeLocked()
}

// CutOpen cuts the response to log request n (counted from 0).
func (k *Kubelet) CutOpen(n int, c Cut) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cuts[n] = c
}

// Unreachable makes log requests fail (500, as when the API server cannot
// reach the node's kubelet) while set; the pod stays readable.
func (k *Kubelet) Unreachable(on bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.unreachable = ""
	if on {
		k.unreachable = `Get "https://node:10250/containerLogs": dial tcp: connect: connection refused`
	}
	k.changeLocked()
}

// NoNodeAddress makes log requests fail as the API server answers for a
// node without an address (a kwok node): 500, "no preferred addresses found".
func (k *Kubelet) NoNodeAddress() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.unreachable = "no preferred addresses found; known addresses: []"
	k.changeLocked()
}

// NodeGone makes log requests fail as the API server answers for a pod
// whose node object was deleted: 404, nodes "node" not found (the node
// getter's NotFound, details kind "nodes"); the pod stays readable.
func (k *Kubelet) NodeGone() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.nodeGone = true
	k.changeLocked()
}

// OnOpen sets a function called at each log request, with its number, before
// it is served (without the kubelet's lock: it may change the kubelet).
func (k *Kubelet) OnOpen(f func(n int)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.onOpen = f
}

// Opens is the number of log requests so far.
func (k *Kubelet) Opens() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.opens
}

// Requests describes each log request ("cur since=..." or "prev since=...").
func (k *Kubelet) Requests() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.requests...)
}

// Pod is the pod as the API server shows it; nil once deleted. Its status
// says whether the container started, how often it restarted and whether it
// terminated for good (the pod then Succeeded).
func (k *Kubelet) Pod() *corev1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.podLocked()
}

func (k *Kubelet) podLocked() *corev1.Pod {
	if k.gone {
		return nil
	}
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: PodName},
		Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{{Name: Container}}},
	}
	st := corev1.ContainerStatus{Name: Container}
	switch {
	case len(k.instances) == 0:
		p.Status.Phase = corev1.PodPending
		st.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
	case k.terminated:
		p.Status.Phase = corev1.PodSucceeded
		st.State.Terminated = &corev1.ContainerStateTerminated{}
	default:
		p.Status.Phase = corev1.PodRunning
		st.State.Running = &corev1.ContainerStateRunning{}
	}
	if n := len(k.instances); n > 1 {
		st.RestartCount = int32(min(n-1, 1<<30)) // #nosec G115 -- bounded
		st.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1}
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{st}
	return p
}

// changeLocked wakes open streams and signals Changed.
func (k *Kubelet) changeLocked() {
	close(k.wake)
	k.wake = make(chan struct{})
	k.signalLocked()
}

func (k *Kubelet) signalLocked() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

func (k *Kubelet) servePod(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	p := k.podLocked()
	k.mu.Unlock()
	if p == nil || r.PathValue("ns") != Namespace || r.PathValue("pod") != PodName {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("pods %q not found", r.PathValue("pod")))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(p)
}

func (k *Kubelet) serveLog(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	follow, previous, timestamps := q.Get("follow") == "true", q.Get("previous") == "true", q.Get("timestamps") == "true"
	var from time.Time
	since := "-"
	if s := q.Get("sinceTime"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "bad sinceTime: "+err.Error())
			return
		}
		from, since = t, t.UTC().Format(time.RFC3339)
	}

	k.mu.Lock()
	n := k.opens
	k.opens++
	hook := k.onOpen
	k.mu.Unlock()
	if hook != nil {
		hook(n)
	}

	k.mu.Lock()
	k.signalLocked()
	if msg := k.unreachable; msg != "" {
		k.mu.Unlock()
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, msg)
		return
	}
	if k.nodeGone {
		k.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(&metav1.Status{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
			Status:   metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
			Message: `nodes "node" not found`, Details: &metav1.StatusDetails{Name: "node", Kind: "nodes"},
		})
		return
	}
	if previous {
		k.requests = append(k.requests, "prev since="+since)
	} else {
		k.requests = append(k.requests, "cur since="+since)
	}
	inst := len(k.instances) - 1
	if previous {
		inst--
	}
	cut, hasCut := k.cuts[n]
	switch {
	case k.gone || r.PathValue("ns") != Namespace || r.PathValue("pod") != PodName:
		k.mu.Unlock()
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("pods %q not found", r.PathValue("pod")))
		return
	case q.Get("container") != Container:
		k.mu.Unlock()
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("container %q is not valid", q.Get("container")))
		return
	case previous && inst < 0:
		k.mu.Unlock()
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("previous terminated container %q in pod %q not found", Container, PodName))
		return
	case inst < 0:
		k.mu.Unlock()
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("container %q in pod %q is waiting to start: ContainerCreating", Container, PodName))
		return
	}
	recs := k.instances[inst]
	next := k.rotated[inst]
	newLine := true
	k.mu.Unlock()

	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	written := 0
	var buf []byte
	for {
		buf, newLine = serve(buf[:0], recs[next:], from, newLine, timestamps)
		next = len(recs)
		if hasCut && written+len(buf) >= cut.At {
			_, _ = w.Write(buf[:max(cut.At-written, 0)])
			if cut.Clean {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
			panic(http.ErrAbortHandler) // a broken connection
		}
		if len(buf) > 0 {
			if _, err := w.Write(buf); err != nil {
				return
			}
			written += len(buf)
			if flusher != nil {
				flusher.Flush()
			}
		}
		// Follow: wait for more records while this instance runs.
		k.mu.Lock()
		running := follow && !previous && !k.terminated && !k.gone && inst == len(k.instances)-1
		recs = k.instances[inst]
		wake := k.wake
		k.mu.Unlock()
		if len(recs) > next {
			continue
		}
		if !running {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-wake:
		}
	}
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&metav1.Status{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status:   metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg, // #nosec G115 -- HTTP status codes
	})
}
