package executor

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
