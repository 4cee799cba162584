package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/internal/placement"
	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// target is one cluster the service runs tasks on: its name ("" for the
// one cluster of a service without Clusters), labels and connection.
type target struct {
	name   string
	labels map[string]string
	rc     *rest.Config
	// remote: another process runs it (an agent; in an agent, every
	// cluster but its own); rc is nil.
	remote bool
	// agent: the configuration marks it agent.
	agent bool
	// creds follow the changes of its kubeconfig (nil: in-cluster, or
	// remote).
	creds *liveCredentials
}

// targets returns the clusters cfg runs tasks on: cfg.Clusters, each
// reached through its kubeconfig and context, or the one cluster of rc.
func targets(cfg Config, rc *rest.Config) ([]target, error) {
	if len(cfg.Clusters) == 0 {
		return []target{{rc: rc}}, nil
	}
	out := make([]target, 0, len(cfg.Clusters))
	for i, c := range cfg.Clusters {
		if cfg.Agent != c.Name && (cfg.Agent != "" || c.Agent) {
			out = append(out, target{name: c.Name, labels: c.Labels, remote: true, agent: c.Agent})
			continue
		}
		crc, creds, err := liveRESTConfig(c, filepath.Join(cfg.StateDir, "clusters", c.Name))
		if err != nil {
			return nil, fmt.Errorf("clusters[%d] (%s): %w", i, c.Name, err)
		}
		out = append(out, target{name: c.Name, labels: c.Labels, rc: crc, agent: c.Agent, creds: creds})
	}
	return out, nil
}

// clusterRESTConfig loads the client configuration of c: its kubeconfig
// (default $KUBECONFIG, else ~/.kube/config) at its context (default the
// current one).
func clusterRESTConfig(c ClusterConfig) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if c.Kubeconfig != "" {
		rules.ExplicitPath = c.Kubeconfig
	}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: c.Context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %q, context %q: %w", c.Kubeconfig, c.Context, err)
	}
	return rc, nil
}

// clusterRun is the runner of one cluster of a service with several.
type clusterRun struct {
	name   string
	labels map[string]string
	// instance is the cluster's executor instance; with shards, instances
	// are the shard instances of its replica group and instanceFor says
	// which runs a task (instance is then the group's name).
	instance    string
	instances   []string
	instanceFor func(id string) string
	run         *runner
	// free is the executor's Free (executor.Executor.Free).
	free func(ns string) int
	// resync brings a task placed on the cluster to its executor's notice
	// (executor.Executor.Resync); nil in tests.
	resync func(id string)
	// resyncAll brings every task of a single executor (not a replica
	// group's, which follows the store's changes itself) to its notice
	// again; nil otherwise.
	resyncAll func(ctx context.Context) error
	// stranded is the executor's Stranded.
	stranded func(ctx context.Context) (int, error)
	// nextInLine is the executor's NextInLine (nil: its lines are not
	// offered to other clusters).
	nextInLine func(n int, room func(ns string) int, skip func(id string) bool) []string
	// pinned are the tasks of its lines found to be kept on it by their
	// placement, for each other cluster (rebalance skips them).
	pinned map[string]map[string]bool
	// client is the service's own client of the cluster (the events of a
	// Pending task's pod; nil in tests).
	client kubernetes.Interface
	// probe asks the cluster's API server something only the service's
	// credentials allow (nil: never asked); checkClusters asks a quiet
	// cluster, to tell refused credentials from silence.
	probe func(ctx context.Context) error
	// remote: another process runs the cluster's executors (an agent, or,
	// in an agent, every cluster but its own): the run is a remoteCluster.
	remote bool
	// byAgent: the configuration marks it agent (its row's mode).
	byAgent bool
	// quietSince is when the instance was first seen not answering since
	// it last did (zero: it answers); only the router's loop uses it.
	quietSince time.Time
}

// has reports whether instance is one of c's executor instances.
func (c *clusterRun) has(instance string) bool {
	if c.instances == nil {
		return instance == c.instance
	}
	return slices.Contains(c.instances, instance)
}

// all returns c's executor instances.
func (c *clusterRun) all() []string {
	if c.instances == nil {
		return []string{c.instance}
	}
	return c.instances
}

// target is the instance of c that runs task id.
func (c *clusterRun) target(id string) string {
	if c.instanceFor == nil {
		return c.instance
	}
	return c.instanceFor(id)
}

// router is the server.Executor of a service with several clusters: it
// places each new task on a cluster (internal/placement: Check refuses a
// placement no cluster could meet, Choose takes the Ready cluster allowed
// with the most free slots, Queue the shortest line when none has one)
// and sends every other call to the executor instance the task's record
// names. The record's Executor and Cluster are written with the record
// itself, by the chosen cluster's executor, in the store's one Create.
// Every checkInterval it decides the clusters' states (checkClusters),
// moves the tasks without a pod off an Unreachable cluster (moveQuiet),
// and gives free slots to the tasks waiting in other clusters' lines
// (rebalance); every placeInterval it places the unplaced (placeUnplaced).
type router struct {
	st       store.Store
	rows     store.Clusters // nil: every cluster is Ready
	clusters []*clusterRun
	// instanceID is the service's: a cluster's executor instance is
	// instanceID-NAME (instanceOf), with shards that group's ShardIDs.
	instanceID string
	shards     int
	// agent is the cluster this process is the agent of ("": the
	// service): it checks that cluster only, and places nothing.
	agent string
	// groups keeps the heartbeats of the processes that run clusters
	// (nil: a store without groups; then no cluster is remote).
	groups store.Groups
	// identity and leaseNamespace name this process in them.
	identity, leaseNamespace string
	// reloaders read the clusters' kubeconfigs again (Run runs them).
	reloaders []*reloader
	// leader: this process makes the router's decisions (leads; with
	// replicas, elect sets it).
	leader atomic.Bool
	// defaultNamespace is the namespace of a task that names none.
	defaultNamespace string
	log              *slog.Logger
	// unreachableAfter is how long a Ready cluster's instance may not
	// answer before the cluster is Unreachable.
	unreachableAfter time.Duration
	// placements times each submission's placement (nil: not timed).
	placements prometheus.Observer
	// publish sends an event to the watches (nil: none): what the router
	// itself changes of tasks (a declaration of loss) and how it shows them
	// (ClusterUnreachable while their cluster does not answer).
	publish func(executor.Event)

	mu sync.Mutex
	// states are the clusters' rows as last read (refreshStates); a
	// cluster without one is Ready.
	states map[string]store.Cluster
}

var _ server.Executor = (*router)(nil)

// ensureRows writes a Ready row for every configured cluster that has
// none, so that the store lists every cluster the service runs tasks on
// (and an operator's later change of state has a row to change).
func (r *router) ensureRows(ctx context.Context) error {
	if r.rows == nil {
		return nil
	}
	for _, c := range r.clusters {
		mode := store.ClusterPush
		if c.byAgent {
			mode = store.ClusterAgent
		}
		row, err := r.rows.GetCluster(ctx, c.name)
		if err == nil {
			if row.Mode != mode { // the configuration changed how it runs
				row.Mode = mode
				if _, err := r.rows.PutCluster(ctx, row); err != nil && !errors.Is(err, store.ErrConflict) {
					return fmt.Errorf("writing cluster %s: %w", c.name, err)
				}
			}
			continue
		}
		if !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("reading cluster %s: %w", c.name, err)
		}
		_, err = r.rows.PutCluster(ctx, store.Cluster{Name: c.name, State: store.ClusterReady, Labels: c.labels, Mode: mode})
		if err != nil && !errors.Is(err, store.ErrConflict) { // another process wrote it first
			return fmt.Errorf("writing cluster %s: %w", c.name, err)
		}
	}
	if err := r.markUnconfigured(ctx); err != nil {
		return err
	}
	return r.refreshStates(ctx)
}

// instanceOf is the executor instance of cluster name (with shards: its
// replica group).
func (r *router) instanceOf(name string) string { return r.instanceID + "-" + name }

// unconfigured is what the router knows of cluster name when it is not
// configured: its instances by the service's naming.
func (r *router) unconfigured(name string) *clusterRun {
	c := &clusterRun{name: name, instance: r.instanceOf(name)}
	if r.shards > 0 {
		for k := range r.shards {
			c.instances = append(c.instances, replica.ShardID(c.instance, k))
		}
	}
	return c
}

// strandedPods counts, from cluster c's API server, the tasks of which c
// shows pods of its instances (every shard's) while their records are
// placed on another cluster or on none: what executor.Stranded counts in
// one instance's caches (pods of lost attempts, or of attempts moved away
// before their pods were recorded), for a replica group whose shards other
// processes run too. namespaces are the executors' (none: all).
func (r *router) strandedPods(ctx context.Context, c *clusterRun, namespaces []string) (int, error) {
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	// Not released: as the executors' caches select (a kept pod, released,
	// is done with).
	unreleased, err := labels.NewRequirement(task.LabelReleased, selection.DoesNotExist, nil)
	if err != nil {
		return 0, err
	}
	sel := task.ManagedSelector().Add(*unreleased).String()
	runs := map[string]bool{}
	for _, ns := range namespaces {
		list, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return 0, fmt.Errorf("listing the task pods of cluster %s: %w", c.name, err)
		}
		for i := range list.Items {
			pod := &list.Items[i]
			if !c.has(pod.Labels[task.LabelExecutor]) {
				continue
			}
			if id, _, err := task.IdentityFromPod(pod); err == nil {
				runs[id.RunID] = true
			}
		}
	}
	n := 0
	for id := range runs {
		rec, err := r.st.Get(ctx, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue
		case err != nil:
			return n, fmt.Errorf("reading task %s: %w", id, err)
		}
		if rec.Cluster != c.name {
			n++
		}
	}
	return n, nil
}

// tasksOn lists the unfinished tasks placed on cluster c's instances.
func (r *router) tasksOn(ctx context.Context, c *clusterRun) ([]store.Record, error) {
	recs, err := r.st.List(ctx, store.ListOptions{Cluster: c.name, NonTerminal: true})
	if err != nil {
		return nil, fmt.Errorf("listing the tasks of cluster %s: %w", c.name, err)
	}
	return slices.DeleteFunc(recs, func(rec store.Record) bool { return !c.has(rec.Executor) }), nil
}

// markUnconfigured marks each cluster the store has a row of, but the
// configuration no longer names, Unreachable with reason NotConfigured
// (one Lost stays Lost), and logs the unfinished tasks placed on it: they
// keep their state, and nothing of them starts elsewhere (their pods may
// run there), until the cluster is configured again (its instance then
// answers, and the checks make it Ready) or an operator declares it lost
// (Lose works on such a cluster: the loss is the store's).
func (r *router) markUnconfigured(ctx context.Context) error {
	list, err := r.rows.ListClusters(ctx)
	if err != nil {
		return fmt.Errorf("reading the clusters: %w", err)
	}
	for _, row := range list {
		if r.byName(row.Name) != nil || row.State == store.ClusterLost {
			continue
		}
		if row.State != store.ClusterUnreachable || row.Reason != placement.ReasonNotConfigured {
			row.State, row.Since, row.Reason = store.ClusterUnreachable, time.Time{}, placement.ReasonNotConfigured
			row.Message = fmt.Sprintf("not in the service's configuration: the tasks placed on it keep their state until it is configured again or declared lost (kubetask clusters lose %s --yes)", row.Name)
			if _, err := r.rows.PutCluster(ctx, row); err != nil && !errors.Is(err, store.ErrConflict) { // another replica marked it
				return fmt.Errorf("writing cluster %s: %w", row.Name, err)
			}
		}
		recs, err := r.st.List(ctx, store.ListOptions{Cluster: row.Name, NonTerminal: true})
		if err != nil {
			return fmt.Errorf("listing the tasks of cluster %s: %w", row.Name, err)
		}
		if len(recs) > 0 {
			ids := make([]string, 0, min(len(recs), 10))
			for _, rec := range recs[:cap(ids)] {
				ids = append(ids, rec.ID)
			}
			r.log.Warn("a cluster not in the configuration has unfinished tasks: they keep their state until it is configured again, or declared lost",
				"cluster", row.Name, "tasks", len(recs), "first", ids, "declare it lost", "kubetask clusters lose "+row.Name+" --yes")
		}
	}
	return nil
}

// view is what placement knows of the clusters for a task of namespace
// ns: the configured labels, the stored states (Ready without a row), and
// each executor's free slots for ns.
func (r *router) view(_ context.Context, ns string) ([]placement.Cluster, error) {
	r.mu.Lock()
	states := r.states
	r.mu.Unlock()
	out := make([]placement.Cluster, 0, len(r.clusters))
	for _, c := range r.clusters {
		st := store.ClusterReady
		if row, ok := states[c.name]; ok {
			st = row.State
		}
		out = append(out, placement.Cluster{Name: c.name, Labels: c.labels, State: st, Free: c.free(ns)})
	}
	return out, nil
}

// refreshStates reads the clusters' states from their rows into the copy
// placements read: a submission's placement reads no store (on SQLite a
// read of the rows could queue behind the writes: 100 ms at p99 under 16
// clients, BenchmarkServeClusters at 4b58a28). The copy is as of the last
// check (checkInterval) for changes of other processes; this process's own
// writes (drain, resume, loss, the checks) refresh it at once.
func (r *router) refreshStates(ctx context.Context) error {
	if r.rows == nil {
		return nil
	}
	rows, err := r.rows.ListClusters(ctx)
	if err != nil {
		return fmt.Errorf("reading the clusters' states: %w", err)
	}
	states := make(map[string]store.Cluster, len(rows))
	for _, row := range rows {
		states[row.Name] = row
	}
	r.mu.Lock()
	r.states = states
	r.mu.Unlock()
	return nil
}

// setState notes cluster row as this process just wrote it.
func (r *router) setState(row store.Cluster) {
	r.mu.Lock()
	defer r.mu.Unlock()
	states := maps.Clone(r.states)
	if states == nil {
		states = map[string]store.Cluster{}
	}
	states[row.Name] = row
	r.states = states
}

// rowOf returns cluster name's row as last read, if there is one.
func (r *router) rowOf(name string) (store.Cluster, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	row, ok := r.states[name]
	return row, ok
}

// place returns the cluster a task of namespace ns asking want goes to.
func (r *router) place(ctx context.Context, ns string, want placement.Want) (*clusterRun, error) {
	view, err := r.view(ctx, ns)
	if err != nil {
		return nil, err
	}
	if err := placement.Check(want, view); err != nil {
		return nil, fmt.Errorf("%w: %w", executor.ErrInvalidTask, err)
	}
	name, ok := placement.Choose(want, view)
	if !ok {
		name, ok = placement.Queue(want, view)
	}
	if !ok {
		var states []string
		for _, c := range view {
			states = append(states, c.Name+" "+string(c.State))
		}
		return nil, fmt.Errorf("%w: no cluster the task's spec.placement allows is Ready (%s): submit it again later", server.ErrUnavailable, strings.Join(states, ", "))
	}
	return r.byName(name), nil
}

func (r *router) byName(name string) *clusterRun {
	for _, c := range r.clusters {
		if c.name == name {
			return c
		}
	}
	return nil
}

func (r *router) byInstance(instance string) *clusterRun {
	for _, c := range r.clusters {
		if c.has(instance) {
			return c
		}
	}
	return nil
}

// SubmitCreated places the task, then submits it to the chosen cluster's
// executor. A retry of an ID already stored gets the stored record,
// wherever it was placed.
func (r *router) SubmitCreated(ctx context.Context, id string, t *task.Task, opts ...executor.SubmitOption) (store.Record, bool, error) {
	ns := t.Namespace
	if ns == "" {
		ns = r.defaultNamespace
	}
	var want placement.Want
	if t.Spec.Placement != nil {
		want = *t.Spec.Placement
	}
	start := time.Now()
	c, err := r.place(ctx, ns, want)
	if r.placements != nil {
		r.placements.Observe(time.Since(start).Seconds())
	}
	if err != nil {
		return store.Record{}, false, err
	}
	return c.run.api.SubmitCreated(ctx, id, t, opts...)
}

// Get returns the record as the executor that runs the task shows it (its
// live progress), or as stored when no configured cluster's does.
func (r *router) Get(ctx context.Context, id string) (store.Record, error) {
	rec, err := r.st.Get(ctx, id)
	if err != nil {
		return rec, err
	}
	c := r.byInstance(rec.Executor)
	if c == nil || rec.Terminal {
		// As stored; placed on a cluster no longer configured, with why
		// nothing changes.
		return r.Shown(rec), nil
	}
	if rec, err = c.run.api.Get(ctx, id); err != nil {
		return rec, err
	}
	return r.Shown(rec), nil
}

// Shown is rec as the service shows it (Get, lists): an unfinished task
// placed on a cluster that is Unreachable (or no longer configured) keeps
// its last known state, with reason ClusterUnreachable and a message that
// says since when; every other record is as given.
func (r *router) Shown(rec store.Record) store.Record {
	if rec.Terminal || rec.Cluster == "" {
		return rec
	}
	c := r.byName(rec.Cluster)
	if c == nil {
		c = r.unconfigured(rec.Cluster)
	}
	if !c.has(rec.Executor) {
		return rec
	}
	if row, ok := r.rowOf(rec.Cluster); ok && row.State == store.ClusterUnreachable {
		return unreachable(rec, row)
	}
	return rec
}

// Client is the service's client of cluster name, nil when it is not
// configured.
func (r *router) Client(name string) kubernetes.Interface {
	if c := r.byName(name); c != nil && c.client != nil {
		return c.client
	}
	return nil
}

// unreachable is rec, unfinished and placed on cluster row, which does not
// answer, as Get shows it: its attempt keeps its state (the record is not
// written), and the reason says why nothing changes.
func unreachable(rec store.Record, row store.Cluster) store.Record {
	since := row.Since.UTC().Format(time.RFC3339)
	why, until := "has not answered since "+since, "until it does"
	if row.Reason == placement.ReasonNotConfigured {
		why = "is not in the service's configuration since " + since
		until = "until it is configured again, or declared lost (kubetask clusters lose " + row.Name + " --yes)"
	}
	rec.Message = fmt.Sprintf("cluster %s %s; the attempt keeps its last known state, %s/%s, %s (its pod, if any, may still run there)",
		row.Name, why, rec.Phase, rec.Reason, until)
	rec.Reason = string(podstate.ReasonClusterUnreachable)
	return rec
}

// Cancel asks the executor that runs the task to stop it; a task that no
// configured cluster's executor runs is cancelled in the store by the
// first's (a compare-and-swap that any instance may write).
func (r *router) Cancel(ctx context.Context, id string, opts ...executor.CancelOption) error {
	rec, err := r.st.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("cancelling task %s: %w", id, err)
	}
	c := r.byInstance(rec.Executor)
	if c == nil {
		c = r.clusters[0]
	}
	return c.run.api.Cancel(ctx, id, opts...)
}

// Healthy is every cluster's executor's liveness.
func (r *router) Healthy() error {
	var errs []error
	for _, c := range r.clusters {
		if err := c.run.api.Healthy(); err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", c.name, err))
		}
	}
	return errors.Join(errs...)
}

// ready is nil while some cluster's executor (or replica) is ready: the
// service places tasks on the clusters that answer, so one cluster that
// does not (Unreachable) must not take the whole service out of its
// load balancer; the error names every cluster's when none is.
func (r *router) ready() error {
	var errs []error
	for _, c := range r.clusters {
		err := c.run.ready()
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("cluster %s: %w", c.name, err))
	}
	return errors.Join(errs...)
}

// start runs every cluster's executor until ctx ends; the first that ends
// with an error while ctx lasts stops the others and is returned.
func (r *router) start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(r.clusters))
	for _, c := range r.clusters {
		go func() {
			err := c.run.start(ctx)
			if err != nil {
				err = fmt.Errorf("cluster %s: %w", c.name, err)
			}
			errs <- err
		}()
	}
	if r.agent != "" || slices.ContainsFunc(r.clusters, func(c *clusterRun) bool { return c.remote }) {
		go r.remoteEvery(ctx)
		if ch, ok := r.st.(store.Changes); ok {
			go r.followChanges(ctx, ch)
		}
	}
	if r.shards > 0 && r.groups != nil {
		elect := func(ctx context.Context) error { return r.elect(ctx) }
		if err := elect(ctx); err != nil {
			r.log.Warn("electing the router's leader", "err", err)
		}
		go r.every(ctx, checkInterval, "electing the router's leader", elect)
	}
	if r.rows != nil && r.agent == "" { // an agent places nothing
		go r.every(ctx, placeInterval, "placing the unplaced tasks", func(ctx context.Context) error {
			if !r.leads() {
				return nil
			}
			n, err := r.placeUnplaced(ctx)
			if n > 0 {
				r.log.Info("placed unplaced tasks", "tasks", n)
			}
			return err
		})
	}
	if r.rows != nil {
		go r.every(ctx, checkInterval, "checking the clusters", func(ctx context.Context) error { return r.checkClusters(ctx, time.Now()) })
	}
	var all []error
	for range r.clusters {
		if err := <-errs; err != nil {
			all = append(all, err)
			cancel()
		}
	}
	return errors.Join(all...)
}

// newRouter builds the executors of cfg.Clusters, one instance each
// (InstanceID-NAME, its metrics labelled cluster=NAME), writes the
// clusters' rows the store lacks, and returns the router and the first
// cluster's client, which the server's dry runs and event reads use.
func newRouter(ctx context.Context, cfg Config, st store.Store, reg prometheus.Registerer, log *slog.Logger,
	exConfig func(*rest.Config, kubernetes.Interface) executor.Config) (*router, *kubernetes.Clientset, error) {
	tgts, err := targets(cfg, nil)
	if err != nil {
		return nil, nil, err
	}
	r := &router{st: st, instanceID: cfg.InstanceID, shards: cfg.Shards, defaultNamespace: cfg.DefaultNamespace, log: log, unreachableAfter: cfg.UnreachableAfter.Get(),
		agent: cfg.Agent, identity: processIdentity(cfg), leaseNamespace: cfg.LeaseNamespace}
	r.groups, _ = st.(store.Groups)
	placements, err := newPlacementMetric(reg)
	if err != nil {
		return nil, nil, err
	}
	r.placements = placements
	r.rows, _ = st.(store.Clusters)
	var first *kubernetes.Clientset
	for _, tg := range tgts {
		if tg.creds != nil {
			r.reloaders = append(r.reloaders, newReloader("the kubeconfig of cluster "+tg.name, []string{tg.creds.kubeconfig}, tg.creds.reload, clock.RealClock{}, log.With("cluster", tg.name)))
		}
		if tg.remote {
			if r.groups == nil {
				return nil, nil, fmt.Errorf("cluster %s is run by an agent: the store must keep groups (PostgreSQL)", tg.name)
			}
			ec := exConfig(nil, nil)
			ec.Registerer, ec.Logger = nil, log.With("cluster", tg.name)
			c, _, err := r.newRemoteCluster(cfg, tg.name, tg.labels, ec)
			if err != nil {
				return nil, nil, err
			}
			c.byAgent = tg.agent
			r.clusters = append(r.clusters, c)
			continue
		}
		client, err := serviceClient(cfg, tg.rc)
		if err != nil {
			return nil, nil, fmt.Errorf("kubernetes client of cluster %s: %w", tg.name, err)
		}
		if first == nil {
			first = client
		}
		ccfg := cfg
		ccfg.InstanceID = cfg.InstanceID + "-" + tg.name
		ec := exConfig(tg.rc, client)
		leaseSettings(ccfg, &ec)
		ec.Cluster = tg.name
		ec.Registerer = prometheus.WrapRegistererWith(prometheus.Labels{"cluster": tg.name}, reg)
		ec.Logger = log.With("cluster", tg.name)
		ec.InstanceID = ccfg.InstanceID
		probeNS := metav1.NamespaceAll // the instance's first namespace: one its credentials must cover
		if len(ec.Namespaces) > 0 {
			probeNS = ec.Namespaces[0]
		}
		probe := func(ctx context.Context) error { // a list of one pod: what the instance's caches need
			_, err := client.CoreV1().Pods(probeNS).List(ctx, metav1.ListOptions{Limit: 1})
			return err
		}
		if cfg.Shards > 0 {
			// A replica group per cluster: its shard instances, their
			// Leases and the members' in that cluster.
			rep, err := newReplica(ccfg, ec, tg.rc, ccfg.InstanceID, st, ec.Registerer, ec.Logger)
			if err != nil {
				return nil, nil, fmt.Errorf("replica of cluster %s: %w", tg.name, err)
			}
			c := &clusterRun{name: tg.name, labels: tg.labels, instance: ccfg.InstanceID, byAgent: tg.agent,
				instances: rep.Instances(), instanceFor: rep.Instance, run: &runner{api: rep, start: rep.Run, ready: rep.Ready}, client: client,
				free: rep.Free, resync: rep.Resync, nextInLine: rep.NextInLine, probe: probe}
			// This replica runs some of the group's shards: what is
			// stranded there is read from the cluster's pods, all shards'.
			c.stranded = func(ctx context.Context) (int, error) { return r.strandedPods(ctx, c, ec.Namespaces) }
			r.clusters = append(r.clusters, c)
			continue
		}
		ex, err := executor.New(ec)
		if err != nil {
			return nil, nil, fmt.Errorf("executor of cluster %s: %w", tg.name, err)
		}
		r.clusters = append(r.clusters, &clusterRun{name: tg.name, labels: tg.labels, instance: ccfg.InstanceID, byAgent: tg.agent, run: singleRunner(ex), client: client,
			free: ex.Free, resync: ex.Resync, resyncAll: ex.ResyncAll, stranded: ex.Stranded, nextInLine: ex.NextInLine, probe: probe})
	}
	if err := r.ensureRows(ctx); err != nil {
		return nil, nil, err
	}
	return r, first, nil
}

// newPlacementMetric registers the router's kubetask_placement_seconds in
// reg.
func newPlacementMetric(reg prometheus.Registerer) (prometheus.Histogram, error) {
	placements := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kubetask_placement_seconds", Help: "Time of each submission's placement on a cluster (the clusters' states read, each executor's free slots, the choice), part of its store step.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
	})
	if err := reg.Register(placements); err != nil {
		return nil, fmt.Errorf("registering the placement metric: %w", err)
	}
	return placements, nil
}

var _ server.Clusters = (*router)(nil)

// ListClusters returns the configured clusters with their rows' states
// (Ready without a row: a store that keeps no clusters).
func (r *router) ListClusters(ctx context.Context) ([]api.Cluster, error) {
	rows := map[string]store.Cluster{}
	if r.rows != nil {
		list, err := r.rows.ListClusters(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the clusters: %w", err)
		}
		for _, row := range list {
			rows[row.Name] = row
		}
	}
	out := make([]api.Cluster, 0, len(r.clusters))
	for _, c := range r.clusters {
		row, ok := rows[c.name]
		if !ok {
			row = store.Cluster{Name: c.name, State: store.ClusterReady}
		}
		out = append(out, apiCluster(row, c.labels))
		delete(rows, c.name)
	}
	for _, row := range rows { // no longer configured (markUnconfigured)
		out = append(out, apiCluster(row, row.Labels))
	}
	slices.SortFunc(out, func(a, b api.Cluster) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Drain moves cluster name from Ready to Draining (draining) or back, by
// a compare-and-swap on its row; a cluster in the state asked already is
// returned as it is.
func (r *router) Drain(ctx context.Context, name string, draining bool) (api.Cluster, error) {
	c := r.byName(name)
	if c == nil {
		return api.Cluster{}, fmt.Errorf("cluster %s: %w", name, store.ErrNotFound)
	}
	if r.rows == nil {
		return api.Cluster{}, fmt.Errorf("%w: the store keeps no clusters' states (memory, SQLite and PostgreSQL do)", server.ErrClusterState)
	}
	from, to := store.ClusterReady, store.ClusterDraining
	if !draining {
		from, to = to, from
	}
	for {
		row, err := r.rows.GetCluster(ctx, name)
		if err != nil {
			return api.Cluster{}, fmt.Errorf("reading cluster %s: %w", name, err)
		}
		switch row.State {
		case to:
			return apiCluster(row, c.labels), nil
		case from:
		default:
			return api.Cluster{}, fmt.Errorf("%w: cluster %s is %s (since %s), not %s", server.ErrClusterState, name, row.State, row.Since.Format(time.RFC3339), from)
		}
		row.State, row.Since, row.Reason, row.Message = to, time.Time{}, "", ""
		if to == store.ClusterDraining {
			row.Reason, row.Message = "Drained", "drained by an operator: no new placement; running tasks finish"
		}
		row, err = r.rows.PutCluster(ctx, row)
		if errors.Is(err, store.ErrConflict) {
			continue // changed meanwhile: decide again
		}
		if err != nil {
			return api.Cluster{}, fmt.Errorf("writing cluster %s: %w", name, err)
		}
		r.setState(row)
		return apiCluster(row, c.labels), nil
	}
}

// apiCluster is row as the API shows it, with the configured labels.
func apiCluster(row store.Cluster, labels map[string]string) api.Cluster {
	return api.Cluster{Name: row.Name, State: string(row.State), Since: row.Since, Reason: row.Reason, Message: row.Message, Labels: labels, Mode: string(row.Mode)}
}

// Lose declares cluster name lost (docs/multicluster.md, "A cluster
// declared lost"), as the simulator's operator does (its clusters
// scenario explores this procedure against the executors' steps): the
// row becomes Lost, so that nothing is placed there; a new term of the
// cluster's instance begins in the store, so that no write of the
// instance's already on its way lands after the declaration; then each
// unfinished task placed there, from its record as it is now, either ends
// its attempt Failed/ClusterLost (its pod recorded: executor.LoseAttempt,
// an unfenced compare-and-swap; the next attempt waits unplaced) or, with
// no pod recorded, is moved (a compare-and-swap that sees no pod claimed).
// Last, the unplaced tasks are placed (placeUnplaced). It is at least once
// for the lost attempts: their pods may still run where nobody sees them,
// and are stopped and recorded as discarded if the cluster answers again.
// Calling it again sweeps again.
func (r *router) Lose(ctx context.Context, name string) (api.Cluster, error) {
	if r.rows == nil {
		return api.Cluster{}, fmt.Errorf("%w: the store keeps no clusters' states", server.ErrClusterState)
	}
	c := r.byName(name)
	if c == nil {
		// A cluster no longer configured, with a row: its loss is the
		// store's alone (a new term of its instance, its attempts lost).
		if _, err := r.rows.GetCluster(ctx, name); err != nil {
			return api.Cluster{}, fmt.Errorf("cluster %s: %w", name, err)
		}
		c = r.unconfigured(name)
	}
	row, err := r.markLost(ctx, name)
	if err != nil {
		return api.Cluster{}, err
	}
	for _, inst := range c.all() {
		if _, err := r.st.BeginTerm(ctx, inst); err != nil {
			return api.Cluster{}, fmt.Errorf("beginning a term of %s to fence it: %w", inst, err)
		}
	}
	lost, moved, err := r.sweepLost(ctx, c)
	if err != nil {
		return api.Cluster{}, err
	}
	placed, err := r.placeUnplaced(ctx)
	if err != nil {
		return api.Cluster{}, err
	}
	out := apiCluster(row, c.labels)
	out.Message = fmt.Sprintf("%s; this declaration: %d attempts lost, %d tasks moved, %d placed", out.Message, lost, moved, placed)
	return out, nil
}

// markLost sets cluster name's row Lost (from any other state), and
// returns it.
func (r *router) markLost(ctx context.Context, name string) (store.Cluster, error) {
	for {
		row, err := r.rows.GetCluster(ctx, name)
		if err != nil {
			return row, fmt.Errorf("reading cluster %s: %w", name, err)
		}
		if row.State == store.ClusterLost {
			r.setState(row)
			return row, nil
		}
		row.State, row.Since = store.ClusterLost, time.Time{}
		row.Reason, row.Message = "DeclaredLost", "declared lost by an operator: its attempts were ended ClusterLost and run again elsewhere"
		row, err = r.rows.PutCluster(ctx, row)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return row, fmt.Errorf("writing cluster %s: %w", name, err)
		}
		r.setState(row)
		return row, nil
	}
}

// sweepLost ends or moves every unfinished task of lost cluster c's
// instance, each from its record as it is now (a write that finds the
// record changed reads it again).
func (r *router) sweepLost(ctx context.Context, c *clusterRun) (lost, moved int, err error) {
	recs, err := r.tasksOn(ctx, c)
	if err != nil {
		return 0, 0, err
	}
	for _, rec := range recs {
		for tries := 0; ; tries++ {
			if rec.Terminal || !c.has(rec.Executor) {
				break // finished, or placed elsewhere, meanwhile
			}
			var err error
			if rec.PodCreated {
				var out store.Record
				if out, err = executor.LoseAttempt(rec, c.name, time.Now()); err == nil {
					out.Epoch = 0 // the declaration's write, unfenced: the version is its guard
					out, err = r.st.Update(ctx, out)
				}
				if err == nil {
					lost++
					r.publishLost(rec.Attempt, out)
				}
			} else {
				var to *clusterRun
				if to, err = r.placeFor(ctx, rec); err == nil && to != nil {
					err = r.move(ctx, rec, to)
				}
				if err == nil && to != nil {
					moved++
				}
			}
			if !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrClaimed) || tries > 10 {
				if err != nil && !errors.Is(err, executor.ErrNotLosable) {
					return lost, moved, fmt.Errorf("task %s: %w", rec.ID, err)
				}
				break
			}
			if rec, err = r.st.Get(ctx, rec.ID); err != nil {
				return lost, moved, fmt.Errorf("reading task %s again: %w", rec.ID, err)
			}
		}
	}
	return lost, moved, nil
}

// publishLost tells the watches that attempt n of rec (as the declaration
// wrote it) ended ClusterLost: no executor does (the lost cluster's may
// never answer again, and the next attempt's runs elsewhere).
func (r *router) publishLost(n int, rec store.Record) {
	if r.publish == nil || n >= len(rec.Attempts) {
		return
	}
	a := rec.Attempts[n]
	pod := ""
	if a.Pod != "" {
		pod = rec.Namespace + "/" + a.Pod
	}
	r.publish(executor.Event{ID: rec.ID, Attempt: n, Type: executor.EventAttemptFinished, Pod: pod, Cluster: a.Cluster,
		Phase: a.Phase, Reason: a.Reason, Message: a.Message, Terminal: rec.Terminal, Time: a.FinishedAt})
}

// publishReach tells the watches how recs, the unfinished tasks of
// cluster c as listed, are shown now that it became Unreachable or answers again (Shown): a
// State event each, with the cluster's reason, or with the state its
// executor has for them again.
func (r *router) publishReach(ctx context.Context, c *clusterRun, recs []store.Record) {
	if r.publish == nil {
		return
	}
	now := time.Now()
	for _, rec := range recs {
		if shown, err := r.Get(ctx, rec.ID); err == nil && !shown.Terminal && c.has(shown.Executor) {
			rec = shown
		} else {
			continue // finished or moved meanwhile: its own events say so
		}
		r.publish(executor.Event{ID: rec.ID, Attempt: rec.Attempt, Type: executor.EventState, Cluster: c.name,
			Phase: rec.Phase, Reason: rec.Reason, Message: rec.Message, Time: now})
	}
}

// placeUnplaced places every unfinished task that names no instance (the
// next attempt of a lost one) on a Ready cluster it allows, the one with
// the most free slots (else the shortest line), and tells that cluster's
// executor; a task no Ready cluster may take stays unplaced until the
// next call. It returns how many it placed.
func (r *router) placeUnplaced(ctx context.Context) (int, error) {
	recs, err := r.st.List(ctx, store.ListOptions{NonTerminal: true})
	if err != nil {
		return 0, fmt.Errorf("listing the unfinished tasks: %w", err)
	}
	placed := 0
	for _, rec := range recs {
		if rec.Executor != "" {
			continue
		}
		to, err := r.placeFor(ctx, rec)
		if err != nil || to == nil {
			continue // cannot be placed now: the next call tries again
		}
		switch err := r.move(ctx, rec, to); {
		case err == nil:
			placed++
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrClaimed):
			// changed since the list: the next call reads it again
		default:
			return placed, err
		}
	}
	return placed, nil
}

// placeInterval is how often the router places the unplaced tasks (the
// next attempts of lost ones that no Ready cluster could take at the
// declaration, or whose move lost a race).
const placeInterval = 10 * time.Second

// every calls fn every interval until ctx ends, logging its error as
// what failed.
func (r *router) every(ctx context.Context, interval time.Duration, what string, fn func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn(what, "err", err)
		}
	}
}

// checkInterval is how often the router decides the clusters' states
// from what it sees of their instances (checkClusters).
const checkInterval = 2 * time.Second

// checkClusters writes each cluster's state as placement.Next decides it
// from what the router sees of its instance now (a compare-and-swap on the
// row: a row changed meanwhile is decided again at the next check), and
// moves off each Unreachable cluster the tasks placement.Movable allows:
// no pod claimed, none of a previous attempt that may still run there.
// probeTimeout bounds checkClusters' question to a quiet cluster.
const probeTimeout = 3 * time.Second

func (r *router) checkClusters(ctx context.Context, now time.Time) error {
	if !r.leads() {
		return r.refreshStates(ctx) // the leader's decisions, for placements
	}
	rows, err := r.rows.ListClusters(ctx)
	if err != nil {
		return fmt.Errorf("reading the clusters: %w", err)
	}
	byName := map[string]store.Cluster{}
	for _, row := range rows {
		byName[row.Name] = row
	}
	var errs []error
	for _, c := range r.clusters {
		row, ok := byName[c.name]
		if !ok || c.remote && r.agent != "" {
			continue // an agent checks its own cluster only
		}
		reach := false // became Unreachable, or answers again
		seen := placement.Seen{State: row.State, Answers: c.run.ready() == nil}
		if seen.Answers {
			c.quietSince = time.Time{}
		} else if c.quietSince.IsZero() {
			c.quietSince = now
		}
		seen.QuietSince = c.quietSince
		if !seen.Answers && row.State == store.ClusterReady && now.Sub(c.quietSince) >= r.unreachableAfter && c.probe != nil {
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			if err := c.probe(pctx); apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) {
				seen.Refused = err.Error()
			}
			cancel()
		}
		if seen.Answers && (row.State == store.ClusterLost || row.State == store.ClusterReturning) {
			switch {
			case c.remote:
				// What is stranded there only its agent sees: it makes
				// the cluster Ready once none is.
				seen.Stranded = 1
			case c.stranded != nil:
				if seen.Stranded, err = c.stranded(ctx); err != nil {
					errs = append(errs, fmt.Errorf("cluster %s: %w", c.name, err))
					continue
				}
			}
		}
		if state, reason, msg, change := placement.Next(seen, now, r.unreachableAfter); change {
			reach = row.State == store.ClusterUnreachable || state == store.ClusterUnreachable
			row.State, row.Since, row.Reason, row.Message = state, time.Time{}, reason, msg
			written, err := r.rows.PutCluster(ctx, row)
			switch {
			case errors.Is(err, store.ErrConflict):
				continue // changed meanwhile: decided again at the next check
			case err != nil:
				errs = append(errs, fmt.Errorf("writing cluster %s: %w", c.name, err))
				continue
			}
			r.log.Info("cluster state", "cluster", c.name, "state", state, "reason", reason)
			row = written
			byName[c.name] = written
			r.setState(written) // for the placements of the moves below
		}
		quiet := row.State == store.ClusterUnreachable && r.agent == "" // an agent moves nothing
		if !quiet && !reach {
			continue
		}
		// One list for the moves, the losses and the events: moveQuiet
		// takes only tasks without a pod, loseOverdue only tasks with one
		// (at the versions listed), and publishReach reads each again.
		recs, err := r.tasksOn(ctx, c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if quiet {
			if n, err := r.moveQuiet(ctx, recs); err != nil {
				errs = append(errs, err)
			} else if n > 0 {
				r.log.Info("moved tasks off an unreachable cluster", "cluster", c.name, "tasks", n)
			}
			if n, err := r.loseOverdue(ctx, c, recs, now); err != nil {
				errs = append(errs, err)
			} else if n > 0 {
				r.log.Info("gave up on attempts on an unreachable cluster (their tasks' spec.placement.lostAfter)", "cluster", c.name, "attempts", n)
			}
		}
		if reach { // after the moves: the tasks that stay
			r.publishReach(ctx, c, recs)
		}
	}
	// The states as this pass read and wrote them (no second read), for
	// the next placements and the moves below.
	r.mu.Lock()
	r.states = byName
	r.mu.Unlock()
	if r.agent == "" { // an agent places nothing
		if n, err := r.rebalance(ctx); err != nil {
			errs = append(errs, err)
		} else if n > 0 {
			r.log.Info("moved waiting tasks to clusters with free slots", "tasks", n)
		}
	}
	return errors.Join(errs...)
}

// rebalance gives each Ready cluster's free slots to the tasks waiting in
// the other clusters' lines (Ready or Draining ones; an Unreachable one's
// are moveQuiet's), the cluster with the most free slots first: the tasks
// each line's slot plan would start first (executor NextInLine: the fair
// share between namespaces, weights and priorities), within the free
// cluster's room for each namespace and what each task's spec.placement
// allows. So a task that found every cluster full waits for the first
// slot free on any cluster it may run on, not only on the one whose line
// it joined, and a Draining cluster's line empties into the others. Each
// move is the store's compare-and-swap that sees no pod claimed
// (placement.Movable first): a task whose executor admitted it meanwhile
// stays. Both executors are told (the first drops the task from its
// line). It returns how many tasks moved.
func (r *router) rebalance(ctx context.Context) (int, error) {
	r.mu.Lock()
	states := r.states
	r.mu.Unlock()
	stateOf := func(c *clusterRun) store.ClusterState {
		if row, ok := states[c.name]; ok {
			return row.State
		}
		return store.ClusterReady
	}
	type target struct {
		c    *clusterRun
		free int
	}
	var targets []target
	for _, c := range r.clusters {
		if stateOf(c) != store.ClusterReady || c.run.ready() != nil {
			continue
		}
		if n := c.free(""); n > 0 {
			targets = append(targets, target{c, n})
		}
	}
	slices.SortStableFunc(targets, func(a, b target) int { return b.free - a.free })
	moved := 0
	for _, to := range targets {
		n := to.free
		taken := map[string]int{} // moved to it in this pass, by namespace
		room := func(ns string) int { return to.c.free(ns) - taken[ns] }
		for _, from := range r.clusters {
			if n <= 0 {
				break
			}
			if from == to.c || from.nextInLine == nil || (stateOf(from) != store.ClusterReady && stateOf(from) != store.ClusterDraining) {
				continue
			}
			m, err := r.takeFrom(ctx, from, to.c, n, room, taken)
			moved += m
			n -= m
			if err != nil {
				return moved, err
			}
		}
	}
	return moved, nil
}

// takeFrom moves up to n tasks waiting in from's line to cluster to,
// within room (taken counts them by namespace), and returns how many it
// moved. The tasks whose placement keeps them off to are remembered in
// from.pinned and skipped from then on; the line is asked again after
// each round that found some (pinnedRounds at most).
func (r *router) takeFrom(ctx context.Context, from, to *clusterRun, n int, room func(string) int, taken map[string]int) (int, error) {
	pinned := from.pinned[to.name]
	seen := map[string]bool{} // this pass's pinned ones: the rest are gone
	defer func() {
		if from.pinned == nil {
			from.pinned = map[string]map[string]bool{}
		}
		from.pinned[to.name] = seen
	}()
	skip := func(id string) bool {
		if pinned[id] || seen[id] {
			seen[id] = true
			return true
		}
		return false
	}
	moved := 0
	for range pinnedRounds {
		found := 0
		for _, id := range from.nextInLine(n-moved, room, skip) {
			rec, err := r.st.Get(ctx, id)
			if err != nil {
				if errors.Is(err, store.ErrNotFound) {
					continue
				}
				return moved, fmt.Errorf("reading task %s: %w", id, err)
			}
			if !from.has(rec.Executor) || rec.Terminal || !placement.Movable(rec) || room(rec.Namespace) <= 0 {
				continue
			}
			if ok, err := r.allows(rec, to); err != nil || !ok {
				seen[id] = true
				found++
				continue
			}
			switch err := r.move(ctx, rec, to); {
			case err == nil:
				moved++
				taken[rec.Namespace]++
				if from.resync != nil {
					from.resync(id)
				}
			case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrClaimed):
				// admitted or changed since: it stays
			default:
				return moved, err
			}
		}
		if found == 0 || moved >= n {
			break
		}
	}
	return moved, nil
}

// pinnedRounds bounds how often takeFrom asks one line again after
// finding tasks its placement keeps where they are.
const pinnedRounds = 3

// allows reports whether rec's task's spec.placement allows cluster c.
func (r *router) allows(rec store.Record, c *clusterRun) (bool, error) {
	want, err := wantOf(rec)
	if err != nil {
		return false, err
	}
	_, ok := placement.Choose(want, []placement.Cluster{{Name: c.name, Labels: c.labels, State: store.ClusterReady, Free: 1}})
	return ok, nil
}

// wantOf is rec's task's spec.placement (none: any cluster).
func wantOf(rec store.Record) (placement.Want, error) {
	var t task.Task
	if err := json.Unmarshal(rec.Task, &t); err != nil {
		return placement.Want{}, fmt.Errorf("decoding task %s: %w", rec.ID, err)
	}
	if t.Spec.Placement == nil {
		return placement.Want{}, nil
	}
	return *t.Spec.Placement, nil
}

// moveQuiet moves those of recs, the unfinished tasks of a quiet cluster,
// that placement.Movable allows to a Ready cluster, and returns how many.
func (r *router) moveQuiet(ctx context.Context, recs []store.Record) (int, error) {
	moved := 0
	for _, rec := range recs {
		if !placement.Movable(rec) {
			continue
		}
		to, err := r.placeFor(ctx, rec)
		if err != nil || to == nil {
			continue
		}
		switch err := r.move(ctx, rec, to); {
		case err == nil:
			moved++
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrClaimed):
			// claimed or changed meanwhile: decided again at the next check
		default:
			return moved, err
		}
	}
	return moved, nil
}

// loseOverdue ends, as a declaration of loss would for their tasks alone,
// the attempts of recs (the unfinished tasks of Unreachable cluster c, as
// listed) whose tasks'
// spec.placement.lostAfter has passed by now since the cluster became
// Unreachable as this process saw it (quiet for unreachableAfter: a
// process that began to lead meanwhile counts from its own first look,
// later, never earlier): a new term of the task's
// instance first (a write of its already on its way is fenced), then
// executor.LoseAttempt (a compare-and-swap: a record changed meanwhile is
// looked at again at the next check); their next attempts are placed at
// once. A task without a pod recorded is moveQuiet's. It returns how many
// attempts it ended.
func (r *router) loseOverdue(ctx context.Context, c *clusterRun, recs []store.Record, now time.Time) (int, error) {
	if c.quietSince.IsZero() {
		return 0, nil // answers: Unreachable only until the next check
	}
	since := c.quietSince.Add(r.unreachableAfter)
	lost := 0
	termed := map[string]bool{}
	for _, rec := range recs {
		if !rec.PodCreated {
			continue
		}
		want, err := wantOf(rec)
		if err != nil || want.LostAfter == "" || now.Sub(since) < want.LostAfter.Get() {
			continue
		}
		if !termed[rec.Executor] {
			if _, err := r.st.BeginTerm(ctx, rec.Executor); err != nil {
				return lost, fmt.Errorf("beginning a term of %s to fence it: %w", rec.Executor, err)
			}
			termed[rec.Executor] = true
		}
		out, err := executor.LoseAttempt(rec, c.name, now)
		if err != nil {
			continue // finished meanwhile, or not this cluster's: nothing to give up
		}
		out.Epoch = 0 // unfenced, as a declaration's: the version is its guard
		written, err := r.st.Update(ctx, out)
		switch {
		case errors.Is(err, store.ErrConflict):
			continue // changed since the list: the next check reads it again
		case err != nil:
			return lost, fmt.Errorf("task %s: %w", rec.ID, err)
		}
		lost++
		r.log.Warn("gave up on an attempt: its cluster has not answered for its task's spec.placement.lostAfter; the next attempt runs elsewhere (at least once: the pod may still run there)",
			"task", rec.ID, "attempt", rec.Attempt, "cluster", c.name, "lostAfter", want.LostAfter)
		r.publishLost(rec.Attempt, written)
	}
	if lost > 0 {
		if _, err := r.placeUnplaced(ctx); err != nil {
			return lost, err
		}
	}
	return lost, nil
}

// placeFor returns the Ready cluster rec's task may go to now, nil when
// none.
func (r *router) placeFor(ctx context.Context, rec store.Record) (*clusterRun, error) {
	want, err := wantOf(rec)
	if err != nil {
		return nil, err
	}
	view, err := r.view(ctx, rec.Namespace)
	if err != nil {
		return nil, err
	}
	name, ok := placement.Choose(want, view)
	if !ok {
		name, ok = placement.Queue(want, view)
	}
	if !ok {
		return nil, nil
	}
	return r.byName(name), nil
}

// move places rec on cluster to (store Clusters.Move: a compare-and-swap
// that sees no pod claimed) and tells its executor.
func (r *router) move(ctx context.Context, rec store.Record, to *clusterRun) error {
	rec.Epoch = 0 // the placer's move is unfenced: the version is its guard
	out, err := r.rows.Move(ctx, rec, to.target(rec.ID), to.name)
	if err != nil {
		return err
	}
	if to.resync != nil {
		to.resync(out.ID)
	}
	return nil
}
