package service

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// The pods' events (--pod-events) are limited per cluster, when they are
// recorded: every event within podEventsQPS (burst podEventsBurst), a
// Normal one within podNormalEventsQPS (burst podNormalEventsBurst) too,
// so that under load the Warnings (an attempt failed, and why: what a
// person looks for) keep the rest of the rate. The events' client has
// the same overall limit, which they then never wait for.
const (
	podEventsQPS         = 5
	podEventsBurst       = 20
	podNormalEventsQPS   = 2
	podNormalEventsBurst = 10
)

// limitedRecorder records an event through its EventRecorder only within
// the rate limits (podEventsQPS ...), and drops it at once otherwise,
// counting it in dropped by type. Without it the events the client's rate
// limit holds back wait in client-go's recorder queue (1,000 events) and
// are written up to minutes late, about pods long gone, while each write
// costs the API server what the tasks' own requests need (make
// bench-observe). Events are for people, never state: a dropped one
// changes nothing kubetask decides.
type limitedRecorder struct {
	record.EventRecorder
	now         func() time.Time
	all, normal *rate.Limiter
	dropped     *prometheus.CounterVec
}

// newLimitedRecorder limits r with the pods' events' limits; now is the
// clock (time.Now).
func newLimitedRecorder(r record.EventRecorder, now func() time.Time, dropped *prometheus.CounterVec) *limitedRecorder {
	return &limitedRecorder{
		EventRecorder: r, now: now, dropped: dropped,
		all:    rate.NewLimiter(podEventsQPS, podEventsBurst),
		normal: rate.NewLimiter(podNormalEventsQPS, podNormalEventsBurst),
	}
}

// newDroppedEvents is the counter of the pods' events dropped by their
// rate limits (kubetask_pod_events_dropped_total{type}).
func newDroppedEvents(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kubetask_pod_events_dropped_total",
		Help: "Kubernetes Events on task pods (--pod-events) dropped by their rate limits, by type (Normal, Warning)."}, []string{"type"})
	reg.MustRegister(c)
	return c
}

// allow takes a token for an event of eventtype, or counts it dropped.
func (r *limitedRecorder) allow(eventtype string) bool {
	now := r.now()
	if eventtype != corev1.EventTypeWarning && !r.normal.AllowN(now, 1) || !r.all.AllowN(now, 1) {
		r.dropped.WithLabelValues(eventtype).Inc()
		return false
	}
	return true
}

func (r *limitedRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	if r.allow(eventtype) {
		r.EventRecorder.Event(obj, eventtype, reason, message)
	}
}

func (r *limitedRecorder) Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	if r.allow(eventtype) {
		r.EventRecorder.Eventf(obj, eventtype, reason, messageFmt, args...)
	}
}

func (r *limitedRecorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any) {
	if r.allow(eventtype) {
		r.EventRecorder.AnnotatedEventf(obj, annotations, eventtype, reason, messageFmt, args...)
	}
}
