package executor

import (
	"context"
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

// countingConfig is rc at qps and burst, counting each request into n. A
// request whose context carries a check (withSendCheck) is sent only if the
// check passes when the request leaves the client: after the client-side
// rate limiter, which a request may wait in for long (and a paused process
// for longer still).
func countingConfig(rc *rest.Config, qps float32, burst int, n prometheus.Counter) *rest.Config {
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = qps, burst
	// Uncompressed responses: kube-apiserver gzips a streaming list (the
	// pod caches' WatchListClient) for as long as the watch stays open,
	// each flush of events in a gzip stream of its own, and so spends CPU
	// on every pod change for the life of the executor, and the executor
	// again to inflate it (the CPU profiles of `make bench`'s pairs,
	// KUBETASK_BENCH_PROFILES, show both); the only answers compression
	// would shrink are the pod lists of a relist.
	rc.DisableCompression = true
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if check, ok := r.Context().Value(sendCheckKey{}).(func(context.Context) error); ok {
				if err := check(r.Context()); err != nil {
					return nil, err
				}
			}
			n.Inc()
			return rt.RoundTrip(r)
		})
	})
	return rc
}

type sendCheckKey struct{}

// withSendCheck returns ctx with check, which a client of countingConfig
// runs right before it sends a request made with the context; a request
// whose check fails is not sent and fails with the check's error.
func withSendCheck(ctx context.Context, check func(context.Context) error) context.Context {
	return context.WithValue(ctx, sendCheckKey{}, check)
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
