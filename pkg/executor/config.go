package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/pkg/attempt"
	"github.com/kubetask/kubetask/pkg/store"
)

// Config configures an Executor. New validates it and fills defaults.
type Config struct {
	// RESTConfig reaches the cluster. Required unless Client and Execer are
	// both set. Its QPS and Burst are replaced by QPS and Burst below.
	RESTConfig *rest.Config
	// Client, when set, is used instead of a clientset built from RESTConfig.
	Client kubernetes.Interface
	// Execer reads File results from result holders. Default: exec through
	// the API server (attempt.NewExecer over RESTConfig).
	Execer attempt.Execer
	// InstanceID names this executor; its pods carry it in a label. Required;
	// a valid label value. Keep it across restarts to adopt its own pods. Two
	// processes never run the same InstanceID at once: Start holds a Lease for
	// it (see LeaseNamespace).
	InstanceID string
	// Cluster names the Kubernetes cluster Client reaches, when the Store
	// holds tasks of several (docs/multicluster.md): the instance takes only
	// records placed on it (Record.Cluster), records each attempt's outcome
	// with it (AttemptOutcome.Cluster), and takes a pod for a record's only
	// when the record names this cluster with the pod's UID, so that two
	// clusters that mint one UID are never confused. "" (the default) is the
	// one cluster of a service without clusters: records with no cluster.
	// A valid cluster name (store.ValidateClusterName) when set.
	Cluster string
	// Namespaces to run and watch tasks in; empty means all namespaces.
	// A task without a namespace runs in DefaultNamespace.
	Namespaces []string
	// DefaultNamespace for tasks that name none. Default "default".
	DefaultNamespace string
	// AdoptFrom lists instance IDs of executors that are gone and whose
	// unfinished tasks (in the shared Store) and pods this one takes over.
	AdoptFrom []string
	// Parallelism caps the task pods that exist at once, counted from the pod
	// cache (a pod counts from its creation until it is gone or released).
	// Waiting tasks take free slots in the order SlotOrder says. Default 100.
	Parallelism int
	// NamespaceParallelism caps the task pods of each namespace named here
	// at once, beside Parallelism (which caps all namespaces together):
	// a namespace at its limit waits (WaitingForSlot, "namespace team-a at
	// its limit of 20") while the others take the free slots. Each value is
	// at least 1.
	NamespaceParallelism map[string]int
	// DefaultNamespaceParallelism is the limit of every namespace that
	// NamespaceParallelism does not name; 0 (default): such namespaces are
	// capped by Parallelism only.
	DefaultNamespaceParallelism int
	// LimitShards, when above 1, says that Parallelism,
	// NamespaceParallelism and DefaultNamespaceParallelism are this
	// executor's part of limits that LimitShards executors divide among
	// them (kubetask serve --shards: each shard's part, rounded up): a
	// waiting task's message says so ("namespace team-a at its limit of 2
	// in this task's shard (the namespace's limit divided among 12
	// shards)"). 0 (default): they are this executor's own.
	LimitShards int
	// NamespaceWeights are the namespaces' shares of the slots under
	// SlotOrderFair: a namespace of weight 2 holds up to twice the slots of
	// one of weight 1 while both have waiting tasks. Each value is at least
	// 1; a namespace not named has weight 1.
	NamespaceWeights map[string]int
	// SlotOrder says which waiting task takes the next free slot:
	// SlotOrderFair (default) shares the slots between the namespaces that
	// have waiting tasks, SlotOrderFIFO keeps one line for all. Within a
	// namespace, tasks start by spec.priority (higher first), then in
	// submission order.
	SlotOrder SlotOrder
	// CreateConcurrency caps concurrent pod creations. Default 8. Creations
	// run outside the workers, so a backlog of creations never delays the
	// report of a finished task.
	CreateConcurrency int
	// Workers is the number of reconcile workers. Default 16.
	Workers int
	// QPS and Burst limit the executor's API client. Defaults DefaultQPS
	// and DefaultBurst. A negative QPS (Unlimited) turns the client-side
	// limit off, as in client-go's rest.Config; the API server's priority
	// and fairness still apply.
	QPS   float32
	Burst int
	// Store keeps task records. Default: an in-memory store, with which the
	// pods of tasks a previous process ran are deleted at start (nobody could
	// report them); use a durable store to survive restarts.
	Store store.Store
	// OnEvent, when set, receives every state change, in order per task,
	// from the worker that recorded it; it must not block for long.
	OnEvent func(Event)
	// Recorder, when set, records Kubernetes Events on each attempt's pod
	// for what a person looks for with kubectl describe (PodEventReasons:
	// the outcome decided from the main container, the result read,
	// sidecars stopped, the pod released once its logs are archived, a
	// retry scheduled, a retry waiting for a slot). Use client-go's
	// recorder (record.NewBroadcaster: its correlator rate-limits and
	// aggregates them); it must not block. They are for people: kubetask
	// never reads them back, and a lost one loses nothing.
	Recorder record.EventRecorder
	// Tracer, when set, makes one OpenTelemetry trace per task
	// (docs/tracing.md): the task's trace context is stored with the task
	// at submission (task.AnnotationTraceparent), each attempt's pod gets
	// its attempt's (the TRACEPARENT variable of its main container), and
	// each step's span is made, once, with the times of its facts. Nil
	// (the default): no trace, and no cost but a nil check.
	Tracer *Tracer
	// OnPodChange, when set, is called from the pod caches' event handlers for
	// every add, update and delete of a pod this executor watches; it must not
	// block. Read the pod with CachedPod.
	OnPodChange func(namespace, name string)
	// OnLeading, when set, runs each time Start takes the instance Lease
	// (again), while the pod caches make their first list and before the
	// workers act, for recovery work that must not race another process
	// with the same InstanceID (Submit may be called from it). An error ends
	// Start with that error.
	OnLeading func(ctx context.Context) error
	// Hold, when set, is asked before the executor stops, deletes or releases
	// the pod of an attempt whose outcome is recorded; while it returns true
	// the pod is left as it is, at most HoldTimeout after the outcome, so that
	// an embedding can finish reading it (the rest of a log, its events).
	// Call Resync(id) when the answer changes.
	Hold        func(id string, attempt int) bool
	HoldTimeout time.Duration
	// CaptureLogs, when set, archives logs: the executor runs it for each
	// container whose log the task keeps (spec.logs.containers, the main
	// container by default), once per attempt, from the time the attempt's
	// pod exists. It must return nil once the container's log is archived
	// completely (logcapture.Run does), or ctx's error. The executor removes
	// an attempt's pod's finalizer only after every capture of the attempt
	// returned nil, so a deletion, an eviction or a restart of the process
	// cannot take a line with it; a capture that fails is started again.
	CaptureLogs func(ctx context.Context, c LogCapture) error
	// ExecTimeout bounds one exec into a result holder. Default 30s.
	ExecTimeout time.Duration
	// ResultTimeout bounds the time, from the main container's exit, during
	// which a File result that could not be read for a passing reason is read
	// again; then the attempt ends Failed/ResultFailed. Default 2 minutes.
	ResultTimeout time.Duration
	// Clock is injected for tests. Default the real clock.
	Clock clock.WithTicker
	// Logger is the structured logger. Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the executor's metrics. Default: none registered.
	Registerer prometheus.Registerer
	// LivenessTimeout: Healthy fails when a pod cache has been blind (unable
	// to LIST or WATCH since its last success) for this long, when the caches
	// have not synced this long after Start, or when the executor has not
	// acted on pods for this long (the instance Lease). Default 2 minutes.
	LivenessTimeout time.Duration
	// WatchBackoff is the pod caches' delay before they list and watch again
	// after a failed or ended list-and-watch (410 Expired, a refused
	// connection, an API server restart): Duration at first, multiplied by
	// Factor at each further failure, plus up to Jitter times that at random,
	// and never longer than Cap, jitter included. It starts again from
	// Duration once a list-and-watch stayed up for 10 seconds. Steps is
	// ignored. Default 100ms doubling to 2s, jitter 0.5: a cache lists again
	// at most 150 ms after a first failure and never waits more than 2 s.
	// When set, Duration and Cap (at least Duration) are required, Factor is
	// 0 (constant) or at least 1, and Jitter is not negative.
	WatchBackoff wait.Backoff
	// WatchTimeout, when set, bounds each pod WATCH request; the cache then
	// resumes from its last resourceVersion (or relists on 410 Expired). Zero
	// leaves client-go's default of 5 to 10 minutes. Short values keep
	// connections fresh where a middlebox may silently stall them.
	WatchTimeout time.Duration
	// PlainList makes the pod caches list pods with a LIST request rather
	// than a streaming list (a WATCH with sendInitialEvents, client-go's
	// default where the client supports it). A streaming list keeps the
	// API server's memory flat for large lists, but the API server answers
	// it only once its watch cache is known to be current, and when another
	// consistent read asked for that less than 100 ms before (its progress
	// request period), it waits for the rest of the period: measured, 7 of
	// 20 streaming lists of one pod took 56-131 ms, the LISTs 1-11 ms. For
	// an executor that tracks a few pods and starts often (kubetask run).
	PlainList bool
	// ResyncPeriod re-reconciles every task this often, a safety net.
	// Default 5 minutes.
	ResyncPeriod time.Duration
	// LeaseNamespace holds the instance Lease (coordination.k8s.io) named by
	// LeaseName(InstanceID). Default DefaultNamespace.
	LeaseNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go
	// leaderelection's. Defaults 15s, 10s and 2s. A process killed without
	// releasing its Lease delays the next one with the same InstanceID by at
	// most LeaseDuration.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// LeaseClient, when set, is used for the instance Lease instead of the
	// executor's client, so that renewing it never waits behind pod
	// requests for the client's rate limit (several executors sharing one
	// client, say).
	LeaseClient kubernetes.Interface
	// EphemeralLease makes the instance Lease exist only while Start holds
	// it: Start creates it when there is none, which takes a free instance in
	// one request (leaderelection reads, then writes), and deletes it when
	// it lets it go (one request; leaderelection reads, then writes a
	// released record), so that no Lease is left behind per instance ID.
	// A process killed without letting go leaves its Lease, which the next
	// one takes once it expired, as without this option. For short-lived
	// executors with an instance ID per run: kubetask run.
	EphemeralLease bool
	// LeaseHolder names this process in the Lease. Default host name, process
	// ID and a random suffix.
	LeaseHolder string
	// RecordOnly makes an executor that records tasks for the instance that
	// runs them elsewhere (a replica's view of a shard another replica owns):
	// Submit and Cancel write the Store and queue nothing, Get reads the
	// Store, and Start refuses to run. The owner learns of the change from
	// the Store (store.Changes) or its resync. It needs no RESTConfig or
	// Client: the instance may run in a cluster this process cannot reach
	// (a cluster run by an agent).
	RecordOnly bool
}

func (c *Config) defaults() error {
	var errs []error
	if c.RESTConfig == nil && (c.Client == nil || c.Execer == nil) && !c.RecordOnly {
		errs = append(errs, errors.New("RESTConfig is required (or both Client and Execer)"))
	}
	if c.InstanceID == "" {
		errs = append(errs, errors.New("InstanceID is required: name this executor instance (a label value) and keep it across restarts"))
	}
	for _, msg := range validation.IsValidLabelValue(c.InstanceID) {
		errs = append(errs, fmt.Errorf("InstanceID %q: %s", c.InstanceID, msg))
	}
	if c.Cluster != "" {
		if err := store.ValidateClusterName(c.Cluster); err != nil {
			errs = append(errs, fmt.Errorf("field Cluster: %w", err))
		}
	}
	for _, id := range c.AdoptFrom {
		for _, msg := range validation.IsValidLabelValue(id) {
			errs = append(errs, fmt.Errorf("AdoptFrom %q: %s", id, msg))
		}
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"Parallelism", c.Parallelism}, {"CreateConcurrency", c.CreateConcurrency}, {"Workers", c.Workers}, {"Burst", c.Burst}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (0 means the default), got %d", f.name, f.v))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"HoldTimeout", c.HoldTimeout}, {"ExecTimeout", c.ExecTimeout}, {"ResultTimeout", c.ResultTimeout},
		{"LivenessTimeout", c.LivenessTimeout}, {"WatchTimeout", c.WatchTimeout}, {"ResyncPeriod", c.ResyncPeriod},
		{"LeaseDuration", c.LeaseDuration}, {"RenewDeadline", c.RenewDeadline}, {"RetryPeriod", c.RetryPeriod}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (0 means the default), got %s", d.name, d.v))
		}
	}
	for ns, n := range c.NamespaceParallelism {
		if n < 1 {
			errs = append(errs, fmt.Errorf("NamespaceParallelism[%q] must be at least 1, got %d (leave the namespace out to cap it by DefaultNamespaceParallelism or Parallelism only)", ns, n))
		}
	}
	if c.DefaultNamespaceParallelism < 0 {
		errs = append(errs, fmt.Errorf("DefaultNamespaceParallelism must not be negative (0 means no limit of its own), got %d", c.DefaultNamespaceParallelism))
	}
	for ns, w := range c.NamespaceWeights {
		if w < 1 {
			errs = append(errs, fmt.Errorf("NamespaceWeights[%q] must be at least 1, got %d", ns, w))
		}
	}
	switch c.SlotOrder {
	case "", SlotOrderFair, SlotOrderFIFO:
	default:
		errs = append(errs, fmt.Errorf("SlotOrder %q: want %q or %q", c.SlotOrder, SlotOrderFair, SlotOrderFIFO))
	}
	if b := c.WatchBackoff; b != (wait.Backoff{}) && (b.Duration <= 0 || b.Cap < b.Duration || b.Factor < 0 || b.Factor > 0 && b.Factor < 1 || b.Jitter < 0) {
		errs = append(errs, fmt.Errorf("WatchBackoff needs Duration > 0, Cap >= Duration, Factor 0 or >= 1 and Jitter >= 0, got %+v", b))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("executor config: %w", err)
	}
	if c.DefaultNamespace == "" {
		c.DefaultNamespace = corev1.NamespaceDefault
	}
	if c.LeaseNamespace == "" {
		c.LeaseNamespace = c.DefaultNamespace
	}
	if c.Parallelism == 0 {
		c.Parallelism = 100
	}
	if c.SlotOrder == "" {
		c.SlotOrder = SlotOrderFair
	}
	if c.CreateConcurrency == 0 {
		c.CreateConcurrency = 8
	}
	if c.Workers == 0 {
		c.Workers = 16
	}
	if c.QPS == 0 {
		c.QPS = DefaultQPS
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	if c.Store == nil {
		c.Store = store.NewMemory()
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.WatchBackoff == (wait.Backoff{}) {
		c.WatchBackoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Cap: 2 * time.Second}
	}
	setDuration(&c.HoldTimeout, 30*time.Second)
	setDuration(&c.ExecTimeout, 30*time.Second)
	setDuration(&c.ResultTimeout, 2*time.Minute)
	setDuration(&c.LivenessTimeout, 2*time.Minute)
	setDuration(&c.ResyncPeriod, 5*time.Minute)
	setDuration(&c.LeaseDuration, 15*time.Second)
	setDuration(&c.RenewDeadline, 10*time.Second)
	setDuration(&c.RetryPeriod, 2*time.Second)
	if c.LeaseDuration <= c.RenewDeadline || c.RenewDeadline <= c.RetryPeriod*6/5 {
		return fmt.Errorf("executor config: need LeaseDuration (%s) > RenewDeadline (%s) > 1.2 x RetryPeriod (%s)", c.LeaseDuration, c.RenewDeadline, c.RetryPeriod)
	}
	return nil
}

func setDuration(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}
