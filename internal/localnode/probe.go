package localnode

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubetask/kubetask/internal/container"
)

// probeSettings are a probe's timings with the kubelet's defaults.
type probeSettings struct {
	delay, period, timeout time.Duration
	success, failure       int
}

func settingsOf(pr *corev1.Probe) probeSettings {
	s := probeSettings{
		delay:   time.Duration(pr.InitialDelaySeconds) * time.Second,
		period:  time.Duration(pr.PeriodSeconds) * time.Second,
		timeout: time.Duration(pr.TimeoutSeconds) * time.Second,
		success: int(pr.SuccessThreshold),
		failure: int(pr.FailureThreshold),
	}
	if s.period <= 0 {
		s.period = 10 * time.Second
	}
	if s.timeout <= 0 {
		s.timeout = time.Second
	}
	if s.success <= 0 {
		s.success = 1
	}
	if s.failure <= 0 {
		s.failure = 3
	}
	return s
}

// readiness folds probe results into a verdict as the kubelet does: not
// ready until success consecutive successes, then ready until failure
// consecutive failures.
type readiness struct {
	s          probeSettings
	ready      bool
	okRun, bad int
}

// observe records one result and returns the verdict.
func (r *readiness) observe(ok bool) bool {
	if ok {
		r.okRun, r.bad = r.okRun+1, 0
		if r.okRun >= r.s.success {
			r.ready = true
		}
	} else {
		r.okRun, r.bad = 0, r.bad+1
		if r.bad >= r.s.failure {
			r.ready = false
		}
	}
	return r.ready
}

// probeReadiness runs c's readiness probe against the instance proc
// (probeEvery) and records the verdict in c.probeReady.
func (w *podWorker) probeReadiness(c *ctr, proc *container.Process, pr *corev1.Probe) {
	w.probeEvery(c, proc, pr, false, func(ready bool, err error) bool {
		w.mu.Lock()
		changed := c.proc == proc && c.probeReady != ready
		if changed {
			c.probeReady = ready
		}
		w.mu.Unlock()
		if changed {
			w.log.Debug("readiness changed", "container", c.spec.Name, "ready", ready, "err", err)
			w.poke()
		}
		return true
	})
}

// probeLiveness runs c's liveness probe against the instance proc
// (probeEvery), the container taken for alive at first; after
// failureThreshold consecutive failures it stops the instance (SIGTERM,
// SIGKILL after the probe's terminationGracePeriodSeconds, else the pod's),
// as the kubelet kills a container that fails its liveness probe, and the
// pod's restart policy decides what follows.
// ctx is the node's: when it ends, a container being stopped is killed at once.
func (w *podWorker) probeLiveness(ctx context.Context, c *ctr, proc *container.Process, pr *corev1.Probe) {
	w.probeEvery(c, proc, pr, true, func(alive bool, err error) bool {
		if alive {
			return true
		}
		w.mu.Lock()
		grace := gracePeriod(w.pod)
		w.mu.Unlock()
		if pr.TerminationGracePeriodSeconds != nil {
			grace = time.Duration(*pr.TerminationGracePeriodSeconds) * time.Second
		}
		w.log.Info("liveness probe failed: stopping the container", "container", c.spec.Name, "err", err)
		proc.Stop(ctx, grace)
		return false
	})
}

// probeEvery runs probe pr against the instance proc, from
// initialDelaySeconds every periodSeconds, on the node's clock, and hands
// verdict the probe's standing after each run (initial before the first;
// it changes after successThreshold successes or failureThreshold failures
// in a row) with the run's error. It returns when proc exits, the pod is
// destroyed, or verdict returns false.
func (w *podWorker) probeEvery(c *ctr, proc *container.Process, pr *corev1.Probe, initial bool, verdict func(ok bool, err error) bool) {
	r := readiness{s: settingsOf(pr), ready: initial}
	t := w.clock().NewTimer(r.s.delay)
	defer t.Stop()
	for {
		select {
		case <-t.C():
		case <-proc.Done():
			return
		case <-w.destroyed:
			return
		}
		err := w.probeOnce(c, proc, pr, r.s.timeout)
		if !verdict(r.observe(err == nil), err) {
			return
		}
		t.Reset(r.s.period)
	}
}

// probeOnce runs the probe's handler once: an HTTP GET answered with a status
// from 200 to 399 (HTTPS without verifying the certificate, as the kubelet),
// a TCP connection that opens, or a command exec'd in the container that
// exits 0. A gRPC probe is not run: it passes.
func (w *podWorker) probeOnce(c *ctr, proc *container.Process, pr *corev1.Probe, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	w.mu.Lock()
	podIP := w.pod.Status.PodIP
	w.mu.Unlock()
	if podIP == "" {
		podIP = "127.0.0.1"
	}
	switch h := pr.ProbeHandler; {
	case h.Exec != nil:
		code, err := proc.Exec(ctx, h.Exec.Command, nil, io.Discard, io.Discard)
		if err == nil && code != 0 {
			err = fmt.Errorf("exit code %d", code)
		}
		return err
	case h.HTTPGet != nil:
		port, err := probePort(&c.spec, h.HTTPGet.Port)
		if err != nil {
			return err
		}
		host := h.HTTPGet.Host
		if host == "" {
			host = podIP
		}
		scheme := "http"
		if h.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+net.JoinHostPort(host, strconv.Itoa(port))+h.HTTPGet.Path, nil)
		if err != nil {
			return err
		}
		req.Header.Set("User-Agent", "kube-probe/"+KubeletVersion)
		for _, hd := range h.HTTPGet.HTTPHeaders {
			req.Header.Add(hd.Name, hd.Value)
		}
		resp, err := probeClient.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
		_ = resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return nil
	case h.TCPSocket != nil:
		port, err := probePort(&c.spec, h.TCPSocket.Port)
		if err != nil {
			return err
		}
		host := h.TCPSocket.Host
		if host == "" {
			host = podIP
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return nil
}

// probeClient is the kubelet's: no keep-alive, certificates not verified.
var probeClient = &http.Client{Transport: &http.Transport{
	DisableKeepAlives: true,
	TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet does not verify probe targets either
}}

// probePort resolves a probe's port: a number, or the name of one of the
// container's ports.
func probePort(c *corev1.Container, p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("probe port %q: the container has no port of that name", p.StrVal)
}
