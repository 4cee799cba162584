package executor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestClientRateLimit: zero QPS and Burst are the defaults, a set limit is
// used as given, and Unlimited (any negative QPS) leaves the client without
// a client-side rate limiter.
func TestClientRateLimit(t *testing.T) {
	rc := &rest.Config{Host: "https://127.0.0.1:1"}
	for _, tc := range []struct {
		name      string
		qps       float32
		burst     int
		wantQPS   float32
		unlimited bool
	}{
		{name: "defaults", wantQPS: DefaultQPS},
		{name: "set", qps: 200, burst: 400, wantQPS: 200},
		{name: "unlimited", qps: Unlimited, unlimited: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(rc, tc.qps, tc.burst, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			rl := c.(*kubernetes.Clientset).CoreV1().RESTClient().GetRateLimiter()
			if tc.unlimited {
				if rl != nil {
					t.Fatalf("rate limiter %T (QPS %v), want none", rl, rl.QPS())
				}
				return
			}
			if rl == nil {
				t.Fatal("no rate limiter")
			}
			if rl.QPS() != tc.wantQPS {
				t.Errorf("QPS %v, want %v", rl.QPS(), tc.wantQPS)
			}
		})
	}
}

// TestClientAsksForUncompressedAnswers: the executor's client does not ask
// for gzip (Go's transport would, by itself), so that kube-apiserver does
// not gzip the pod caches' streaming lists event by event; a client built
// from the same rest.Config by anyone else still does.
func TestClientAsksForUncompressedAnswers(t *testing.T) {
	encodings := make(chan string, 2)
	// TLS, as every API server is: client-go gives a plain http:// host
	// Go's default transport, which ignores DisableCompression.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		encodings <- r.Header.Get("Accept-Encoding")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","items":[]}`))
	}))
	defer srv.Close()
	rc := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	ours, err := NewClient(rc, Unlimited, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		client kubernetes.Interface
		want   string
	}{{"the executor's client", ours, ""}, {"a plain client of the same config", plain, "gzip"}} {
		if _, err := c.client.CoreV1().Pods("ns").List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		if got := <-encodings; got != c.want {
			t.Errorf("%s sent Accept-Encoding %q, want %q", c.name, got, c.want)
		}
	}
	if rc.DisableCompression {
		t.Error("NewClient changed the caller's rest.Config")
	}
}
