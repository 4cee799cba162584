package localnode

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestReadinessVerdict(t *testing.T) {
	tests := map[string]struct {
		success, failure int32
		results          string // + success, - failure
		want             string // verdict after each
	}{
		"defaults: one success makes ready, three failures unready": {results: "-+--+---", want: "01111110"},
		"success threshold 2":           {success: 2, failure: 1, results: "++-+-++", want: "0100001"},
		"a success resets the failures": {failure: 2, results: "+-+-+--", want: "1111110"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			r := readiness{s: settingsOf(&corev1.Probe{SuccessThreshold: tt.success, FailureThreshold: tt.failure})}
			got := ""
			for _, c := range tt.results {
				if r.observe(c == '+') {
					got += "1"
				} else {
					got += "0"
				}
			}
			if got != tt.want {
				t.Errorf("verdicts %s, want %s", got, tt.want)
			}
		})
	}
}

func TestProbeSettingsAndPort(t *testing.T) {
	s := settingsOf(&corev1.Probe{})
	if s.delay != 0 || s.period != 10*time.Second || s.timeout != time.Second || s.success != 1 || s.failure != 3 {
		t.Errorf("defaults %+v, want the kubelet's: delay 0, period 10s, timeout 1s, success 1, failure 3", s)
	}
	c := &corev1.Container{Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 8443}}}
	for _, tt := range []struct {
		port    intstr.IntOrString
		want    int
		wantErr bool
	}{
		{port: intstr.FromInt32(80), want: 80},
		{port: intstr.FromString("https"), want: 8443},
		{port: intstr.FromString("9090"), want: 9090},
		{port: intstr.FromString("metrics"), wantErr: true},
	} {
		got, err := probePort(c, tt.port)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("probePort(%s) = %d, %v; want %d (error %v)", tt.port.String(), got, err, tt.want, tt.wantErr)
		}
	}
}

// TestReadinessProbe: a container with an HTTP readiness probe (by port
// name) is not ready while the probe fails, ready after a success, and
// unready again after failureThreshold failures; the pod's Ready condition
// follows. The probe runs on the node's clock, every periodSeconds.
func TestReadinessProbe(t *testing.T) {
	var status atomic.Int32
	var hits atomic.Int32
	status.Store(http.StatusServiceUnavailable)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(status.Load()))
		hits.Add(1)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	portNum, _ := strconv.Atoi(port)

	h := newHarness(t)
	c := shCtr("main", trapTERM)
	c.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: int32(portNum)}} //nolint:gosec // a TCP port fits
	c.ReadinessProbe = &corev1.Probe{
		ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http")}},
		InitialDelaySeconds: 5, PeriodSeconds: 2, FailureThreshold: 2,
	}
	h.create(testPod("probed", c))
	ready := func(p *corev1.Pod) bool {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady {
				return cond.Status == corev1.ConditionTrue && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready
			}
		}
		return false
	}
	running := func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	}
	h.wait("probed", "running, not ready", func(p *corev1.Pod) bool { return running(p) && !ready(p) })
	settle := func() { t.Helper(); settleProber(t, h) }
	probe := func(d time.Duration) { t.Helper(); stepProbe(t, h, &hits, d) }
	probe(5 * time.Second) // initialDelaySeconds: fails
	probe(2 * time.Second) // fails
	settle()
	if p := h.wait("probed", "status", func(*corev1.Pod) bool { return true }); ready(p) {
		t.Fatal("ready while its probe fails")
	}
	status.Store(http.StatusOK)
	probe(2 * time.Second)
	h.wait("probed", "ready after a success", ready)
	status.Store(http.StatusInternalServerError)
	probe(2 * time.Second) // one failure of two: still ready
	settle()
	if p := h.wait("probed", "status", func(*corev1.Pod) bool { return true }); !ready(p) {
		t.Fatal("unready after one failure, below failureThreshold 2")
	}
	probe(2 * time.Second)
	h.wait("probed", "unready after failureThreshold failures", func(p *corev1.Pod) bool { return running(p) && !ready(p) })
}

// TestLivenessProbe: a container whose liveness probe fails failureThreshold
// times in a row is stopped and, under restartPolicy Always, restarted; one
// failure fewer leaves it running. The stop is a SIGTERM to the container's
// PID 1, which ignores it until its trap is installed: the probes wait for
// the trap, or a stop that comes first is lost and the container lives out
// its 30 s grace period.
func TestLivenessProbe(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		hits.Add(1)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())

	h := newHarness(t)
	script, trapReady := trapped(t, "exit 0")
	c := shCtr("main", script)
	c.LivenessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.Parse(port)}},
		PeriodSeconds: 3, FailureThreshold: 2,
	}
	p := testPod("live", c)
	p.Spec.RestartPolicy = corev1.RestartPolicyAlways
	h.create(p)
	restarts := func(p *corev1.Pod) int32 {
		if len(p.Status.ContainerStatuses) != 1 {
			return -1
		}
		return p.Status.ContainerStatuses[0].RestartCount
	}
	h.wait("live", "running", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	waitFile(t, trapReady)
	probe := func(d time.Duration) { t.Helper(); stepProbe(t, h, &hits, d) }
	probe(0) // initialDelaySeconds 0: the first probe is due at once
	if p := h.wait("live", "status", func(*corev1.Pod) bool { return true }); restarts(p) != 0 {
		t.Fatalf("restarted after one failure of two: %d restarts", restarts(p))
	}
	probe(3 * time.Second)
	h.wait("live", "restarted after two failures", func(p *corev1.Pod) bool {
		return restarts(p) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
}

// settleProber waits until the prober has recorded its last verdict and set
// its timer for the next probe.
func settleProber(t *testing.T, h *harness) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !h.clock.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the prober set no timer")
		}
		time.Sleep(5 * time.Millisecond) // waiting for the prober goroutine's timer, with a deadline
	}
}

// stepProbe steps the node's clock by d, to the next probe, once the prober
// waits for it, and waits until the probe's request (counted in hits) is made.
func stepProbe(t *testing.T, h *harness, hits *atomic.Int32, d time.Duration) {
	t.Helper()
	settleProber(t, h)
	want := hits.Load() + 1
	deadline := time.Now().Add(10 * time.Second)
	h.clock.Step(d)
	for hits.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("probe %d was not made", want)
		}
		time.Sleep(5 * time.Millisecond) // waiting for the probe's request, with a deadline
	}
}
