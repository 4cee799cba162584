package executor

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubetask/kubetask/pkg/podstate"
)

// Queue states of an unfinished task (kubetask_tasks_queued's state label),
// in the order a task goes through them.
const (
	// QueueWaiting: no pod and none being created: the task waits for a
	// parallelism slot, its retry backoff, the previous attempt's pod to
	// stop, or a failed creation's retry (Kueue's pending workloads).
	QueueWaiting = "waiting"
	// QueueCreating: a slot is given and the pod's creation is under way.
	QueueCreating = "creating"
	// QueuePending: the pod exists and its main container has not started
	// (scheduling, image pulls, init containers, configuration errors).
	QueuePending = "pending"
	// QueueRunning: the main container started (Kueue's admitted active
	// workloads).
	QueueRunning = "running"
)

// queueState is the queue state of a task in phase with reason, "" for a
// finished one.
func queueState(phase, reason string) string {
	switch phase {
	case string(podstate.Running):
		return QueueRunning
	case string(podstate.Pending):
	default:
		return ""
	}
	switch reason {
	case reasonCreating:
		return QueueCreating
	case reasonSubmitted, reasonWaitingForSlot, reasonWaitingForStop, reasonRetryBackoff, reasonCreateFailed,
		string(podstate.ReasonClusterLost), string(podstate.ReasonClusterUnreachable):
		return QueueWaiting
	}
	return QueuePending
}

// taskClass is what the scrape-time gauges need of one task: its
// namespace, phase and reason, interned as one string (a taskMemo keeps it
// in the 8 bytes the phase alone took).
func taskClass(namespace, phase, reason string) interned {
	return intern(namespace + "\x00" + phase + "\x00" + reason)
}

// split returns the namespace, phase and reason of a taskClass.
func (c interned) split() (namespace, phase, reason string) {
	namespace, rest, _ := strings.Cut(c.String(), "\x00")
	phase, reason, _ = strings.Cut(rest, "\x00")
	return namespace, phase, reason
}

// queueCollector exports kubetask_tasks_queued and kubetask_pending_tasks,
// computed at each scrape from the unfinished tasks the running executors
// sharing it hold (their taskMemo classes): nothing is counted on the
// submission and sync paths. An executor counts from the start of its
// Start until Start returns, and only while its term is on (it holds its
// instance Lease): a shard handed to another replica, or a term lost, is
// counted by whoever runs it now, not twice.
type queueCollector struct {
	queued, pending *prometheus.Desc

	mu        sync.Mutex
	executors map[*Executor]struct{}
}

func newQueueCollector() *queueCollector {
	return &queueCollector{
		queued: prometheus.NewDesc("kubetask_tasks_queued",
			"Unfinished tasks of the running executors, by namespace and queue state (waiting: for a slot, a backoff or a previous pod; creating; pending: the pod exists, the main container has not started; running). Computed at scrape time.",
			[]string{"namespace", "state"}, nil),
		pending: prometheus.NewDesc("kubetask_pending_tasks",
			"Pending tasks of the running executors, by namespace and reason (WaitingForSlot, RetryBackoff, Scheduling, Unschedulable, ImagePullFailed, ConfigError, ...). Computed at scrape time.",
			[]string{"namespace", "reason"}, nil),
		executors: map[*Executor]struct{}{},
	}
}

var _ prometheus.Collector = (*queueCollector)(nil)

// Describe sends the two gauges' descriptions.
func (q *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- q.queued
	ch <- q.pending
}

// add makes e's tasks counted; remove stops counting them.
func (q *queueCollector) add(e *Executor) {
	q.mu.Lock()
	q.executors[e] = struct{}{}
	q.mu.Unlock()
}

func (q *queueCollector) remove(e *Executor) {
	q.mu.Lock()
	delete(q.executors, e)
	q.mu.Unlock()
}

// queueKey is one series of either gauge: a namespace and a state or a
// reason.
type queueKey struct{ namespace, value string }

// Collect counts the tasks: one walk of each executor's memos under its
// lock, a few steps per unfinished task, once per scrape.
func (q *queueCollector) Collect(ch chan<- prometheus.Metric) {
	q.mu.Lock()
	executors := make([]*Executor, 0, len(q.executors))
	for e := range q.executors {
		executors = append(executors, e)
	}
	q.mu.Unlock()
	queued, pending := map[queueKey]int{}, map[queueKey]int{}
	for _, e := range executors {
		e.countQueue(queued, pending)
	}
	for k, n := range queued {
		ch <- prometheus.MustNewConstMetric(q.queued, prometheus.GaugeValue, float64(n), k.namespace, k.value)
	}
	for k, n := range pending {
		ch <- prometheus.MustNewConstMetric(q.pending, prometheus.GaugeValue, float64(n), k.namespace, k.value)
	}
}

// countQueue adds e's unfinished tasks to queued (by namespace and queue
// state) and its Pending ones to pending (by namespace and reason), while
// its term is on.
func (e *Executor) countQueue(queued, pending map[queueKey]int) {
	if e.epoch.Load() == 0 {
		return // between terms: another process may run these tasks now
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.memos {
		if !m.hasPhase {
			continue
		}
		ns, phase, reason := m.phase.split()
		state := queueState(phase, reason)
		if state == "" {
			continue
		}
		queued[queueKey{ns, state}]++
		if phase == string(podstate.Pending) {
			pending[queueKey{ns, reason}]++
		}
	}
}
