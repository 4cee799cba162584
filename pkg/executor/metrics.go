package executor

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the executor's Prometheus metrics.
type metrics struct {
	tasks         *prometheus.GaugeVec
	podCreations  *prometheus.CounterVec
	lists         *prometheus.CounterVec
	watches       *prometheus.CounterVec
	watchErrors   *prometheus.CounterVec
	podCacheBlind *prometheus.GaugeVec
	reconcile     prometheus.Histogram
	outcomeLag    prometheus.Histogram
	outcomes      *prometheus.CounterVec
	apiRequests   prometheus.Counter
	// admissionWait, timeToStart and taskDuration observe each attempt's
	// (each task's) transition once, where the executor records it.
	admissionWait *prometheus.HistogramVec
	timeToStart   *prometheus.HistogramVec
	taskDuration  *prometheus.HistogramVec
	// queue counts the running executors' unfinished tasks at scrape time.
	queue *queueCollector
}

// Buckets of the latency histograms, in seconds: from 100 ms (a pod
// created at once) to about 3.6 hours (a task waiting in a long line).
var (
	waitBuckets     = []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 10800}
	durationBuckets = []float64{1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400}
)

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		tasks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubetask_tasks", Help: "Tasks known to this executor by phase.",
		}, []string{"phase"}),
		podCreations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubetask_pod_creations_total", Help: "Pod creations by result (created, exists, error).",
		}, []string{"result"}),
		lists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubetask_pod_lists_total", Help: "Lists of the pod caches (LIST requests or streaming watch-lists; the first per namespace, then one per relist and one per storm list: in a 410 storm, while a WATCH request is unanswered), by result.",
		}, []string{"result"}),
		watches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubetask_pod_watches_total", Help: "WATCH requests of the pod caches that resume from a resourceVersion (each restart of a watch), by result.",
		}, []string{"result"}),
		watchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubetask_watch_errors_total", Help: "Failed list-and-watch cycles of the pod caches and watches the API server ended with 410 Expired, by kind (expired: a request or a watch stream answered 410 Expired or Gone; other). Each is followed by a relist (kubetask_pod_lists_total) after the back-off.",
		}, []string{"kind"}),
		podCacheBlind: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubetask_pod_cache_blind", Help: "Pod caches, by namespace (\"\": all namespaces), that failed to list or watch since their last successful LIST or WATCH request: 1 while the executor's cache of that namespace cannot see the API server (summed over the executors sharing the registry).",
		}, []string{"namespace"}),
		reconcile: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubetask_reconcile_seconds", Help: "Duration of one reconcile pass of one task.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		outcomeLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubetask_outcome_lag_seconds", Help: "Time from the main container's termination to the recorded outcome.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubetask_attempt_outcomes_total", Help: "Recorded attempt outcomes by phase and reason.",
		}, []string{"phase", "reason"}),
		apiRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubetask_api_requests_total", Help: "Requests the executor's client sent to the API server.",
		}),
		admissionWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubetask_admission_wait_seconds", Help: "Time from an attempt's admission request (the task's submission; for a retry, the end of its backoff) to its pod's creation by this process, once per attempt, by namespace (Kueue's kueue_admission_wait_time_seconds).",
			Buckets: waitBuckets,
		}, []string{"namespace"}),
		timeToStart: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubetask_time_to_start_seconds", Help: "Time from an attempt's pod creation (creationTimestamp) to its main container's start (startedAt), once per attempt whose start this process sees, by namespace.",
			Buckets: waitBuckets,
		}, []string{"namespace"}),
		taskDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubetask_task_duration_seconds", Help: "Time from a task's submission to its recorded final outcome, once per task, by namespace and outcome phase (Succeeded, Failed).",
			Buckets: durationBuckets,
		}, []string{"namespace", "phase"}),
		queue: newQueueCollector(),
	}
	if reg != nil {
		// Several executors may share one registry (the shards of a
		// replica): the second one counts into the first one's collectors.
		m.tasks = register(reg, m.tasks)
		m.podCreations = register(reg, m.podCreations)
		m.lists = register(reg, m.lists)
		m.watches = register(reg, m.watches)
		m.watchErrors = register(reg, m.watchErrors)
		m.podCacheBlind = register(reg, m.podCacheBlind)
		m.reconcile = register(reg, m.reconcile)
		m.outcomeLag = register(reg, m.outcomeLag)
		m.outcomes = register(reg, m.outcomes)
		m.apiRequests = register(reg, m.apiRequests)
		m.admissionWait = register(reg, m.admissionWait)
		m.timeToStart = register(reg, m.timeToStart)
		m.taskDuration = register(reg, m.taskDuration)
		m.queue = register(reg, m.queue)
	}
	return m
}

// register registers c, or returns the collector of the same description
// that reg already has. It panics on a conflicting description, as
// MustRegister does.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic(err)
}
