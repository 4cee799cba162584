package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
)

// runner is what runs the tasks: one executor, or a replica of a group.
type runner struct {
	api   server.Executor
	start func(context.Context) error
	ready func() error
}

// newRunner builds the executor of a single process, or the replica of a
// group when cfg.Shards is set (its shards' executors share one client at the
// executor's QPS, and divide Parallelism).
func newRunner(cfg Config, ec executor.Config, rc *rest.Config, st store.Store, reg prometheus.Registerer, log *slog.Logger) (*runner, error) {
	leaseSettings(cfg, &ec)
	if cfg.Shards == 0 {
		ec.InstanceID = cfg.InstanceID
		ex, err := executor.New(ec)
		if err != nil {
			return nil, err
		}
		return singleRunner(ex), nil
	}
	r, err := newReplica(cfg, ec, rc, cfg.InstanceID, st, reg, log)
	if err != nil {
		return nil, err
	}
	return &runner{api: r, start: r.Run, ready: r.Ready}, nil
}

// newReplica builds this process's replica of group, whose shards'
// executors are ec's on rc's cluster (their Leases there too).
func newReplica(cfg Config, ec executor.Config, rc *rest.Config, group string, st store.Store, reg prometheus.Registerer, log *slog.Logger) (*replica.Replica, error) {
	// The shards' executors share one client at the executor's QPS, beside
	// the service's own (dry runs, logs, auth reviews), as a single
	// executor has its own: the same QPS per process either way.
	exClient, err := executor.NewClient(rc, ec.QPS, ec.Burst, reg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for the executors: %w", err)
	}
	ec.Client = exClient
	if ec.Parallelism == 0 {
		ec.Parallelism = 100
	}
	ec.Parallelism = (ec.Parallelism + cfg.Shards - 1) / cfg.Shards
	ec.NamespaceParallelism, ec.DefaultNamespaceParallelism = shardLimits(ec.NamespaceParallelism, ec.DefaultNamespaceParallelism, cfg.Shards)
	ec.LimitShards = cfg.Shards // a waiting task's message says its limit is its shard's part
	changes, _ := st.(store.Changes)
	// The Leases get a client of their own: renewals never queue behind
	// pod requests for the executors' rate limit.
	lrc := rest.CopyConfig(rc)
	lrc.QPS, lrc.Burst = 20, 40
	leaseClient, err := kubernetes.NewForConfig(lrc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for leases: %w", err)
	}
	repc := replica.Config{
		Client: leaseClient, Namespace: cfg.LeaseNamespace, Group: group, Identity: cfg.ReplicaID,
		Shards: cfg.Shards, LeaseDuration: ec.LeaseDuration, RetryPeriod: ec.RetryPeriod,
		Executor: func(int) executor.Config { return ec },
		Changes:  changes, Registerer: reg, Logger: log,
	}
	repc.Groups, _ = st.(store.Groups)
	return replica.New(repc)
}

// leaseSettings sets ec's Lease fields from cfg.
func leaseSettings(cfg Config, ec *executor.Config) {
	ec.LeaseNamespace = cfg.LeaseNamespace
	ec.LeaseDuration = cfg.LeaseDuration.Get()
	if ec.LeaseDuration > 0 {
		ec.RenewDeadline = ec.LeaseDuration * 2 / 3
		ec.RetryPeriod = max(ec.LeaseDuration/7, 500*time.Millisecond)
	}
}

// singleRunner runs one executor, which holds its instance Lease.
func singleRunner(ex *executor.Executor) *runner {
	return &runner{api: ex, start: ex.Start, ready: func() error {
		if !ex.Ready() {
			return errors.New("the executor has not synced its pod caches or does not hold its instance lease")
		}
		return nil
	}}
}

// shardLimits divides the namespaces' limits among shards, as Parallelism
// is (rounded up: a namespace's tasks are spread over the shards by ID).
func shardLimits(limits map[string]int, def, shards int) (map[string]int, int) {
	per := func(n int) int { return (n + shards - 1) / shards }
	out := make(map[string]int, len(limits))
	for ns, n := range limits {
		out[ns] = per(n)
	}
	return out, per(def)
}
