package executor

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// DefaultQPS and DefaultBurst limit an executor's API client unless
// Config.QPS and Config.Burst say otherwise.
const (
	DefaultQPS   = 50
	DefaultBurst = 100
)

// Unlimited as a QPS turns the client-side rate limit off (client-go's
// rest.Config does the same for any negative QPS).
const Unlimited = -1

// NewClient returns a clientset for rc limited to qps and burst (zero: the
// defaults, DefaultQPS and DefaultBurst; a negative qps: no limit) whose requests count into
// kubetask_api_requests_total of reg (none when reg is nil): the client of
// executors that share one, as the shards of a replica do (Config.Client),
// so that their QPS is the process's and their requests are counted as an
// executor's own client's are.
func NewClient(rc *rest.Config, qps float32, burst int, reg prometheus.Registerer) (kubernetes.Interface, error) {
	if qps == 0 {
		qps = DefaultQPS
	}
	if burst == 0 {
		burst = DefaultBurst
	}
	return newCountingClient(rc, qps, burst, newMetrics(reg).apiRequests)
}

// countingConfig is rc at qps and burst, counting each request into n.
func countingConfig(rc *rest.Config, qps float32, burst int, n prometheus.Counter) *rest.Config {
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = qps, burst
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			n.Inc()
			return rt.RoundTrip(r)
		})
	})
	return rc
}

func newCountingClient(rc *rest.Config, qps float32, burst int, n prometheus.Counter) (kubernetes.Interface, error) {
	c, err := kubernetes.NewForConfig(countingConfig(rc, qps, burst, n))
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	return c, nil
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
