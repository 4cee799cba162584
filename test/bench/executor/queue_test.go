package executor

import (
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// queueTimes is a workqueue.MetricsProvider that keeps every observation
// of the executor's queue: how long each key waited in the queue before a
// worker took it, and how long each pass took. An outcome's lag is the
// time its key waits plus the pass that decides it; these two tell which
// of them a tail is made of. TestMain installs it (client-go allows one
// provider per process, set before the first queue).
type queueTimes struct {
	mu     sync.Mutex
	waits  []time.Duration
	passes []time.Duration
}

// executorQueue is the name the executor gives its queue.
const executorQueue = "kubetask-executor"

var queueMetrics = &queueTimes{}

// take returns the observations since the last take and starts again.
func (q *queueTimes) take() (waits, passes []time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	waits, passes = q.waits, q.passes
	q.waits, q.passes = nil, nil
	return waits, passes
}

type observe func(float64)

func (o observe) Observe(v float64) { o(v) }

type noMetric struct{}

func (noMetric) Inc()        {}
func (noMetric) Dec()        {}
func (noMetric) Set(float64) {}

func (q *queueTimes) sink(name string, into *[]time.Duration) workqueue.HistogramMetric {
	if name != executorQueue {
		return observe(func(float64) {})
	}
	return observe(func(s float64) {
		q.mu.Lock()
		*into = append(*into, time.Duration(s*float64(time.Second)))
		q.mu.Unlock()
	})
}

func (q *queueTimes) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return q.sink(name, &q.waits)
}

func (q *queueTimes) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return q.sink(name, &q.passes)
}

func (q *queueTimes) NewDepthMetric(string) workqueue.GaugeMetric     { return noMetric{} }
func (q *queueTimes) NewAddsMetric(string) workqueue.CounterMetric    { return noMetric{} }
func (q *queueTimes) NewRetriesMetric(string) workqueue.CounterMetric { return noMetric{} }
func (q *queueTimes) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noMetric{}
}
func (q *queueTimes) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noMetric{}
}
