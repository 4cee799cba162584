package server_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
)

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr      string
		tls, auth bool
		ok        bool
	}{
		{"127.0.0.1:8080", false, false, true},
		{"[::1]:8080", false, false, true},
		{"localhost:8080", false, false, true},
		{"0.0.0.0:8080", false, true, false},
		{":8080", true, false, false},
		{"10.0.0.1:8443", true, true, true},
		{"example.com:8443", false, true, false},
		{"nonsense", true, true, false},
	} {
		err := server.CheckListen(tc.addr, tc.tls, tc.auth)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, tls %v, auth %v) = %v, want ok %v", tc.addr, tc.tls, tc.auth, err, tc.ok)
		}
	}
	err := server.CheckListen("0.0.0.0:8080", false, false)
	if err == nil || !strings.Contains(err.Error(), "TLS") || !strings.Contains(err.Error(), "authentication") {
		t.Errorf("the refusal names neither TLS nor authentication: %v", err)
	}
}

func TestConfigIsChecked(t *testing.T) {
	_, err := server.New(server.Config{MaxBodyBytes: -1})
	for _, want := range []string{"Executor is required", "Pager is required", "MaxBodyBytes must not be negative"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v, want it to say %q", err, want)
		}
	}
}

func TestHealthReadyAndMetrics(t *testing.T) {
	ready := errors.New("informers not synced")
	reg := prometheus.NewRegistry()
	h := newHarness(t, func(c *server.Config) {
		c.Ready = func() error { return ready }
		c.Registry = reg
	})
	// The executor is not started: not healthy.
	if resp, b := h.do(http.MethodGet, "/healthz", nil); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "not started") {
		t.Errorf("healthz: %s %s", resp.Status, b)
	}
	if resp, b := h.do(http.MethodGet, "/readyz", nil); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "informers not synced") {
		t.Errorf("readyz: %s %s", resp.Status, b)
	}
	ready = nil
	if resp, _ := h.do(http.MethodGet, "/readyz", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("readyz once ready: %s", resp.Status)
	}
	h.mustSubmit("default", taskDoc("hello"))
	resp, b := h.do(http.MethodGet, "/metrics", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %s", resp.Status)
	}
	for _, want := range []string{
		`kubetask_http_requests_total{code="201",method="POST",route="POST /api/v1/namespaces/{ns}/tasks"} 1`,
		`kubetask_http_requests_total{code="503",method="GET",route="GET /readyz"} 1`,
		"kubetask_http_request_duration_seconds_bucket",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// A second server cannot register the same metrics.
	if _, err := server.New(server.Config{Executor: h.exec, Pager: pagerOf(h.store), Registry: reg}); err == nil {
		t.Error("metrics registered twice")
	}
}

func TestServeShutsDownGracefully(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.ShutdownTimeout = 2 * time.Second })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Serve(ctx, l) }()
	base := "http://" + l.Addr().String()
	resp, err := http.Get(base + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz: %v %v", resp, err)
	}
	resp.Body.Close()
	// An open watch does not hold the shutdown up.
	watch, err := http.Get(base + api.Prefix + "/watch")
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if _, err := http.Get(base + "/readyz"); err == nil {
		t.Error("still serving after the shutdown")
	}
}

func TestServeRefusesAnExposedListenerWithoutTLSAndAuth(t *testing.T) {
	h := newHarness(t, nil)
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Skip("cannot listen on every interface:", err)
	}
	defer l.Close()
	if err := h.srv.Serve(context.Background(), l); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Fatalf("Serve: %v", err)
	}
}

// The web page (Config.UI) is served without a token for GET and HEAD of
// paths outside the API; the API, /metrics and other methods still need one,
// and without a UI an unknown path is a 404 problem.
func TestUI(t *testing.T) {
	auth, err := server.NewTokenAuth([]server.Token{{Token: "root", Subject: "root", Namespaces: server.Namespaces{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("page " + r.URL.Path)) })
	with := newHarness(t, func(c *server.Config) { c.Auth, c.UI = auth, ui })
	without := newHarness(t, func(c *server.Config) { c.Auth = auth })
	for _, tc := range []struct {
		h            *harness
		method, path string
		status       int
		body         string
	}{
		{with, http.MethodGet, "/", http.StatusOK, "page /"},
		{with, http.MethodGet, "/tasks/t1", http.StatusOK, "page /tasks/t1"},
		{with, http.MethodHead, "/app.js", http.StatusOK, ""},
		{with, http.MethodPost, "/", http.StatusUnauthorized, ""},
		{with, http.MethodGet, api.Prefix + "/tasks", http.StatusUnauthorized, ""},
		{with, http.MethodGet, api.Prefix, http.StatusUnauthorized, ""},
		{with, http.MethodGet, "/metrics", http.StatusUnauthorized, ""},
		{without, http.MethodGet, "/", http.StatusUnauthorized, ""},
	} {
		resp, b := tc.h.do(tc.method, tc.path, nil)
		if resp.StatusCode != tc.status || (tc.body != "" && string(b) != tc.body) {
			t.Errorf("%s %s (UI %v): %s %q, want %d %q", tc.method, tc.path, tc.h == with, resp.Status, b, tc.status, tc.body)
		}
	}
}
