package executor

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/pkg/store"
)

// Config configures an Executor. New validates it and fills defaults.
type Config struct {
	// RESTConfig reaches the cluster. Required. Its QPS and Burst are replaced
	// by QPS and Burst below.
	RESTConfig *rest.Config
	// Client, when set, is used instead of a clientset built from RESTConfig
	// (RESTConfig is still needed to exec into result holders).
	Client kubernetes.Interface
	// InstanceID names this executor; its pods carry it in a label. Required;
	// a valid label value. Keep it across restarts to adopt its own pods.
	InstanceID string
	// Namespaces to run and watch tasks in; empty means all namespaces.
	// A task without a namespace runs in DefaultNamespace.
	Namespaces []string
	// DefaultNamespace for tasks that name none. Default "default".
	DefaultNamespace string
	// AdoptFrom lists instance IDs of executors that are gone and whose
	// unfinished tasks (in the shared Store) and pods this one takes over.
	AdoptFrom []string
	// Parallelism caps the task pods that exist at once. Default 100.
	Parallelism int
	// CreateConcurrency caps concurrent pod creations. Default 8. It must be
	// below Workers: the workers not busy creating pods record outcomes, so a
	// backlog of creations never delays the report of a finished task.
	CreateConcurrency int
	// Workers is the number of reconcile workers. Default 16.
	Workers int
	// QPS and Burst limit the executor's API client. Defaults 50 and 100.
	QPS   float32
	Burst int
	// Store keeps task records. Default: an in-memory store.
	Store store.Store
	// OnEvent, when set, receives every state change, in order per task,
	// from the worker that recorded it; it must not block for long.
	OnEvent func(Event)
	// Clock is injected for tests. Default the real clock.
	Clock clock.WithTicker
	// Logger is the structured logger. Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the executor's metrics. Default: none registered.
	Registerer prometheus.Registerer
	// LivenessTimeout: Healthy fails when the pod informers have not been
	// able to list for this long. Default 2 minutes.
	LivenessTimeout time.Duration
	// WatchTimeout, when set, bounds each pod WATCH request; the informer then
	// resumes from its last resourceVersion (or relists on 410 Expired). Zero
	// leaves client-go's default of 5 to 10 minutes. Short values keep
	// connections fresh where a middlebox may silently stall them.
	WatchTimeout time.Duration
	// ResyncPeriod re-reconciles every task this often, a safety net.
	// Default 5 minutes.
	ResyncPeriod time.Duration
}

func (c *Config) defaults() error {
	var errs []error
	if c.RESTConfig == nil {
		errs = append(errs, errors.New("RESTConfig is required"))
	}
	if c.InstanceID == "" {
		errs = append(errs, errors.New("InstanceID is required: name this executor instance (a label value) and keep it across restarts"))
	}
	for _, msg := range validation.IsValidLabelValue(c.InstanceID) {
		errs = append(errs, fmt.Errorf("InstanceID %q: %s", c.InstanceID, msg))
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
	if c.QPS < 0 {
		errs = append(errs, fmt.Errorf("QPS must not be negative, got %v", c.QPS))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("executor config: %w", err)
	}
	if c.DefaultNamespace == "" {
		c.DefaultNamespace = "default"
	}
	if c.Parallelism == 0 {
		c.Parallelism = 100
	}
	if c.CreateConcurrency == 0 {
		c.CreateConcurrency = 8
	}
	if c.Workers == 0 {
		c.Workers = max(16, c.CreateConcurrency+4)
	}
	if c.CreateConcurrency >= c.Workers {
		return fmt.Errorf("executor config: CreateConcurrency (%d) must be below Workers (%d): workers busy creating pods would leave none to record outcomes", c.CreateConcurrency, c.Workers)
	}
	if c.QPS == 0 {
		c.QPS = 50
	}
	if c.Burst == 0 {
		c.Burst = 100
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
	if c.LivenessTimeout == 0 {
		c.LivenessTimeout = 2 * time.Minute
	}
	if c.ResyncPeriod == 0 {
		c.ResyncPeriod = 5 * time.Minute
	}
	return nil
}
