package replica

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinformers "k8s.io/client-go/informers/coordination/v1"
	"k8s.io/client-go/kubernetes"
	coordlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Config configures a Replica.
type Config struct {
	// Client reaches the cluster for the Leases (membership and shards);
	// give it a rate limit of its own, so that renewals never wait behind
	// the executors' pod requests. Required.
	Client kubernetes.Interface
	// Namespace holds the membership and shard Leases. Required.
	Namespace string
	// Group names the replica group: the replicas sharing a store and its
	// tasks. The shards' instance IDs are ShardID(Group, k). Required.
	Group string
	// Identity names this replica, unique in the group. Default host name,
	// process ID and a random suffix.
	Identity string
	// Shards is the fixed number of shards. Required; every replica of a
	// group must use the same number (Groups refuses a mix).
	Shards int
	// LeaseDuration of the membership and shard Leases, and RetryPeriod, the
	// period of renewals and of retries to acquire. Defaults 15s and 2s.
	LeaseDuration, RetryPeriod time.Duration
	// Executor returns the configuration of shard k's executor; the replica
	// sets its InstanceID, its Lease fields and RecordOnly.
	Executor func(k int) executor.Config
	// Changes, when set, tells the owner of a shard promptly about records
	// another replica created or cancelled (the store's).
	Changes store.Changes
	// Groups, when set (the store's), is where replicas register (with
	// their Shards) and check, before they join, that the group's settings
	// agree: no unfinished record belongs to a shard of Shards or more
	// (their executors would never run), no live member holds its Leases in
	// another namespace (it would not see this one's, and both would act),
	// and no live member that joined before this one runs with another
	// shard count: until none does, this one runs no shard and is not
	// ready (MixedShardsError).
	Groups store.Groups
	// Registerer receives the replica's metrics. Default: none.
	Registerer prometheus.Registerer
	Clock      clock.WithTicker
	Logger     *slog.Logger
}

func (c *Config) defaults() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("config field Client is required"))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("config field Namespace (of the Leases) is required"))
	}
	if c.Shards <= 0 {
		errs = append(errs, fmt.Errorf("config field Shards must be positive, got %d", c.Shards))
	}
	if c.Executor == nil {
		errs = append(errs, errors.New("config field Executor is required"))
	}
	if c.Group == "" {
		errs = append(errs, errors.New("config field Group is required"))
	} else if c.Shards > 0 {
		for _, msg := range validation.IsValidLabelValue(ShardID(c.Group, c.Shards-1)) {
			errs = append(errs, fmt.Errorf("config field Group %q: its shard IDs (%s) must be label values: %s", c.Group, ShardID(c.Group, c.Shards-1), msg))
		}
	}
	if c.Identity == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.Identity = fmt.Sprintf("%s_%d_%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 15 * time.Second
	}
	if c.RetryPeriod == 0 {
		c.RetryPeriod = 2 * time.Second
	}
	if c.LeaseDuration < time.Second || c.RetryPeriod*3 > c.LeaseDuration {
		errs = append(errs, fmt.Errorf("need LeaseDuration (%s) >= 1s and >= 3 x RetryPeriod (%s)", c.LeaseDuration, c.RetryPeriod))
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("replica config: %w", err)
	}
	return nil
}

// Replica runs the shards it owns and records tasks of every shard. It
// serves the whole API: Submit, Get and Cancel of any task (as the server's
// Executor).
type Replica struct {
	cfg     Config
	log     *slog.Logger
	records []*executor.Executor // RecordOnly, one per shard
	owned   prometheus.Gauge

	mu        sync.Mutex
	running   map[int]*shardRun
	byID      map[string]int // shard instance ID -> shard
	leaving   bool
	renewedAt time.Time     // last renewal of the membership Lease
	joined    int64         // place in the store's join order (Groups.Join)
	waiting   error         // why this replica may not run shards, if it may not
	obs       *observations // of the Leases, while Run runs
	stops     sync.WaitGroup
	beat      sync.Mutex // held by the heartbeat in flight (Config.Groups)

	// settle, when set (tests), replaces rebalance: it is given the shards
	// to run and the live members after every look at the Leases.
	settle func(ctx context.Context, want []int, live []string)
}

// shardRun is a started executor of one owned shard.
type shardRun struct {
	ex     *executor.Executor
	cancel context.CancelFunc
	done   chan struct{}
}

// New validates cfg and builds the replica's record-only executors.
func New(cfg Config) (*Replica, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	r := &Replica{
		cfg: cfg, log: cfg.Logger.With("replica", cfg.Identity),
		running: map[int]*shardRun{}, byID: map[string]int{},
		owned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kubetask_replica_shards", Help: "Shards this replica runs now."}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(r.owned)
	}
	for k := range cfg.Shards {
		ec := r.shardConfig(k)
		ec.RecordOnly = true
		ex, err := executor.New(ec)
		if err != nil {
			return nil, fmt.Errorf("shard %d: %w", k, err)
		}
		r.records = append(r.records, ex)
		r.byID[ec.InstanceID] = k
	}
	return r, nil
}

func (r *Replica) shardConfig(k int) executor.Config {
	ec := r.cfg.Executor(k)
	ec.InstanceID = ShardID(r.cfg.Group, k)
	ec.LeaseNamespace = r.cfg.Namespace
	ec.LeaseHolder = r.cfg.Identity
	ec.LeaseClient = r.cfg.Client
	ec.LeaseDuration = r.cfg.LeaseDuration
	ec.RetryPeriod = r.cfg.RetryPeriod
	ec.RenewDeadline = r.cfg.LeaseDuration * 2 / 3
	ec.Logger = r.log.With("shard", k)
	return ec
}

// Run joins the group and runs the owned shards until ctx ends; then it
// leaves: it deletes its membership Lease, stops its executors (each
// releases its shard Lease) and returns once they stopped.
//
// Another member, or a shard's holder, counts as gone once this process
// has not seen its Lease renewed for the Lease's duration, from the moment
// the renewal reached this process's informer; the membership loop looks
// at that very moment (a timer set to the next expiry), never earlier. The
// membership Lease is renewed by a goroutine of its own, so that a slow API
// server (or store) delays neither the look at the others' expiry nor the
// time a renewal is seen.
func (r *Replica) Run(ctx context.Context) error {
	// Every Lease of the namespace: the members' and the shards'.
	// (client-go's constructor for the one informer, not a
	// SharedInformerFactory: see internal/localnode's nodeInformers.)
	leaseInformer := coordinformers.NewLeaseInformer(r.cfg.Client, r.cfg.Namespace, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	leases := coordlisters.NewLeaseLister(leaseInformer.GetIndexer())
	obs := r.newObservations()
	r.mu.Lock()
	r.obs = obs
	r.mu.Unlock()
	kick := make(chan struct{}, 1)
	poke := func(obj any) {
		obs.note(obj)
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	_, _ = leaseInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: func(any) { poke(nil) },
	})
	infCtx, stopInformer := context.WithCancel(context.WithoutCancel(ctx))
	informerDone := make(chan struct{})
	go func() {
		defer close(informerDone)
		leaseInformer.RunWithContext(infCtx)
	}()
	defer func() {
		stopInformer()
		<-informerDone
	}()

	if err := r.checkGroup(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	var member *coordinationv1.Lease
	for member == nil {
		var err error
		if member, err = r.renewMember(ctx, nil); err != nil {
			r.log.Warn("joining the replica group", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-r.cfg.Clock.After(r.cfg.RetryPeriod):
			}
		}
	}
	r.noteRenewed()
	r.heartbeat(ctx)
	r.log.Info("joined the replica group", "group", r.cfg.Group, "lease", r.cfg.Namespace+"/"+member.Name, "shards", r.cfg.Shards)
	renewing := make(chan struct{})
	go func() {
		defer close(renewing)
		r.keepMember(ctx, member)
	}()
	// No renewal after the leave's delete: it would create the Lease again.
	defer func() { <-renewing; r.leave(member) }()
	if !cache.WaitForCacheSync(ctx.Done(), leaseInformer.HasSynced) {
		return nil
	}
	if r.cfg.Changes != nil {
		go func() { _ = r.cfg.Changes.WatchChanges(ctx, func(c store.Change) { r.changed(ctx, c) }) }()
	}
	settle := r.settle
	if settle == nil {
		settle = r.rebalance
	}
	for {
		now := r.cfg.Clock.Now()
		obs.mu.Lock()
		memberLeases := r.listMembers(leases)
		live := liveMembers(memberLeases, obs.members, r.cfg.Identity, false, now)
		expired, waiting := r.expiredShards(leases, obs.shards, live, now)
		next := obs.nextExpiry(now)
		obs.mu.Unlock()
		same, blocker := peers(r.self(), live, memberLeases)
		var want []int
		if r.mayRun(blocker) {
			want = Owned(Assign(same, r.cfg.Shards), r.cfg.Identity)
		}
		// Also when this replica's executor of k already runs: it waits
		// in leaderelection, which judges expiry from its own first sight
		// of the Lease, a whole lease duration more (takeovers took two
		// leases when the member's Lease expired before the shard's).
		var free []*coordinationv1.Lease
		for _, k := range want {
			if l := expired[k]; l != nil {
				free = append(free, l)
			}
		}
		r.freeShards(ctx, free)
		settle(ctx, startable(want, waiting, r.Shards()), live)
		// Expiry is a matter of time, not of events: look again when the
		// next Lease expires, on a change, and at least every RetryPeriod
		// (an executor that stopped is started again).
		wait := r.cfg.RetryPeriod
		if !next.IsZero() {
			wait = min(wait, next.Sub(now))
		}
		timer := r.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-kick:
		case <-timer.C():
		}
		timer.Stop()
		if ctx.Err() != nil {
			return nil
		}
	}
}

// startable is want without the shards whose Lease a gone holder still
// holds unexpired (waiting) and whose executor does not run yet (running):
// each starts once its Lease expired and was freed, and its leaderelection
// then takes the Lease on its first try. One that runs keeps running.
func startable(want []int, waiting map[int]bool, running []int) []int {
	var out []int
	for _, k := range want {
		if !waiting[k] || slices.Contains(running, k) {
			out = append(out, k)
		}
	}
	return out
}

// keepMember renews the membership Lease every RetryPeriod (and tells the
// store this replica runs) until ctx ends. A renewal that takes longer
// than a period delays the next, never the membership loop.
func (r *Replica) keepMember(ctx context.Context, member *coordinationv1.Lease) {
	tick := r.cfg.Clock.NewTicker(r.cfg.RetryPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		// Given up after the executors' RenewDeadline: the next try
		// starts afresh rather than waiting on a stuck connection.
		rctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseDuration*2/3)
		l, err := r.renewMember(rctx, member)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("renewing the membership lease", "err", err)
			}
		} else {
			member = l
			r.noteRenewed()
		}
		r.heartbeat(ctx)
	}
}

// freeShards frees the Leases (freeShard) at once, in parallel: each is an
// API call, and a slow API server would otherwise add them up.
func (r *Replica) freeShards(ctx context.Context, free []*coordinationv1.Lease) {
	var wg sync.WaitGroup
	for _, l := range free {
		wg.Go(func() { r.freeShard(ctx, l) })
	}
	wg.Wait()
}

// checkGroup refuses to join a group whose settings this replica's
// disagree with (Config.Groups), with an error, when waiting would not
// help: unfinished records of shards beyond Shards, or a live member that
// joined before this one under another lease namespace. It registers this
// replica in the store first (Groups.Join), then looks at the members: while
// a live member that joined before this one runs with another shard count
// (shardConflict), it waits, not ready (Ready returns a MixedShardsError),
// and joins and looks again every RetryPeriod. It returns nil once this
// replica may run shards, or when ctx ends (having left the store).
func (r *Replica) checkGroup(ctx context.Context) error {
	g := r.cfg.Groups
	if g == nil {
		return nil
	}
	counts, err := retryStoreCall(ctx, r, func(ctx context.Context) (map[string]int, error) { return g.UnfinishedByExecutor(ctx) })
	if err != nil {
		return nil // ctx ended
	}
	if err := beyondShards(counts, r.cfg.Group, r.cfg.Shards); err != nil {
		return err
	}
	var waitingFor store.Member
	for {
		members, err := retryStoreCall(ctx, r, func(ctx context.Context) ([]store.Member, error) {
			return g.Join(ctx, r.cfg.Group, r.member(), 2*r.cfg.LeaseDuration)
		})
		if err != nil { // ctx ended
			if waitingFor.Identity != "" {
				r.forget()
			}
			return nil
		}
		self := r.member()
		for _, m := range members {
			if m.Identity == self.Identity {
				self.Joined = m.Joined
			}
		}
		if err := otherNamespace(self, members, r.cfg.Group); err != nil {
			r.forget()
			return err
		}
		other := shardConflict(self, members)
		if other == nil {
			r.mu.Lock()
			r.joined, r.waiting = self.Joined, nil
			r.mu.Unlock()
			var unknown []string
			for _, m := range members {
				if m.Identity != self.Identity && m.Shards == 0 {
					unknown = append(unknown, m.Identity)
				}
			}
			if len(unknown) > 0 {
				r.log.Warn("live members of the replica group registered by an older kubetask, whose shard count is unknown: they must run with the same --shards",
					"members", unknown, "shards", r.cfg.Shards)
			}
			return nil
		}
		werr := &MixedShardsError{Group: r.cfg.Group, Shards: r.cfg.Shards, Other: *other}
		r.mu.Lock()
		r.waiting = werr
		r.mu.Unlock()
		if other.Identity != waitingFor.Identity || other.Shards != waitingFor.Shards {
			r.log.Error("not joining the replica group", "err", werr)
			waitingFor = *other
		}
		select {
		case <-ctx.Done():
			r.forget()
			return nil
		case <-r.cfg.Clock.After(r.cfg.RetryPeriod):
		}
	}
}

// otherNamespace fails when a member of members that joined before self
// holds its Leases in another namespace than self: neither would see the
// other's Leases, and both would act.
func otherNamespace(self store.Member, members []store.Member, group string) error {
	for _, m := range members {
		if m.Identity != self.Identity && m.LeaseNamespace != self.LeaseNamespace && joinedBefore(m, self) {
			return fmt.Errorf("replica %s of group %s holds its Leases in namespace %q (heard of %s ago), this one in %q: "+
				"replicas of one group must use one lease namespace, or they cannot see each other and both act: "+
				"start this one with --lease-namespace %s, or stop that one first",
				m.Identity, group, m.LeaseNamespace, m.Age.Round(time.Second), self.LeaseNamespace, m.LeaseNamespace)
		}
	}
	return nil
}

// forget removes this replica's entry from the store after it gave up
// joining, so that it keeps no later replica waiting (the entry would
// otherwise age out after two lease durations).
func (r *Replica) forget() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.cfg.Groups.Leave(ctx, r.cfg.Group, r.cfg.Identity); err != nil {
		r.log.Warn("leaving the group in the store (the entry ages out)", "err", err)
	}
}

// beyondShards fails when counts (unfinished records by executor) has
// records of group's shards numbered shards or more: with fewer shards
// nobody would run them.
func beyondShards(counts map[string]int, group string, shards int) error {
	prefix := group + "-shard-"
	most, n := -1, 0
	for exec, c := range counts {
		k, err := strconv.Atoi(strings.TrimPrefix(exec, prefix))
		if !strings.HasPrefix(exec, prefix) || err != nil || k < shards {
			continue
		}
		most, n = max(most, k), n+c
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d unfinished tasks of group %s belong to shards up to %d, beyond the %d of --shards: nobody would run them; "+
		"start with --shards %d (or more) until they finished", n, group, most, shards, most+1)
}

// retryStoreCall calls fn until it succeeds or ctx ends, logging failures.
func retryStoreCall[T any](ctx context.Context, r *Replica, fn func(context.Context) (T, error)) (T, error) {
	for {
		v, err := fn(ctx)
		if err == nil {
			return v, nil
		}
		r.log.Warn("checking the group in the store", "err", err)
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-r.cfg.Clock.After(r.cfg.RetryPeriod):
		}
	}
}

// heartbeat tells the store that this replica runs (Config.Groups), in the
// background: a slow store never holds up the membership Lease's renewal,
// and while one heartbeat is in flight the next is skipped.
func (r *Replica) heartbeat(ctx context.Context) {
	if r.cfg.Groups == nil || !r.beat.TryLock() {
		return
	}
	go func() {
		defer r.beat.Unlock()
		err := r.cfg.Groups.Heartbeat(ctx, r.cfg.Group, r.member())
		if err != nil && ctx.Err() == nil {
			r.log.Warn("telling the store this replica runs", "err", err)
		}
	}()
}

// member is this replica as it registers in the store (Config.Groups).
func (r *Replica) member() store.Member {
	return store.Member{Identity: r.cfg.Identity, LeaseNamespace: r.cfg.Namespace, Shards: r.cfg.Shards}
}

// self is this replica as its membership Lease describes it: member with
// its place in the store's join order.
func (r *Replica) self() store.Member {
	m := r.member()
	r.mu.Lock()
	m.Joined = r.joined
	r.mu.Unlock()
	return m
}

// mayRun reports whether this replica may run shards: whether no live
// member of another shard count keeps it from it (blocker, see peers). If
// one does, Ready says so, and a change of blocker is logged.
func (r *Replica) mayRun(blocker *store.Member) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if blocker == nil {
		if r.waiting != nil {
			r.log.Info("no live member of the replica group runs with another shard count: running shards", "shards", r.cfg.Shards)
		}
		r.waiting = nil
		return true
	}
	var was *MixedShardsError
	if !errors.As(r.waiting, &was) || was.Other.Identity != blocker.Identity || was.Other.Shards != blocker.Shards {
		r.waiting = &MixedShardsError{Group: r.cfg.Group, Shards: r.cfg.Shards, Other: *blocker}
		r.log.Error("running no shard", "err", r.waiting)
	}
	return false
}

// rebalance starts the executors of the shards in want that do not run and
// stops the others.
func (r *Replica) rebalance(ctx context.Context, want []int, live []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var started, stopped []int
	for k, run := range r.running {
		if !slices.Contains(want, k) {
			r.stopLocked(k, run)
			stopped = append(stopped, k)
		}
	}
	for _, k := range want {
		if _, ok := r.running[k]; ok {
			continue
		}
		ec := r.shardConfig(k)
		ex, err := executor.New(ec)
		if err != nil {
			r.log.Error("shard executor", "shard", k, "err", err)
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		run := &shardRun{ex: ex, cancel: cancel, done: make(chan struct{})}
		r.running[k] = run
		started = append(started, k)
		go func() {
			defer close(run.done)
			if err := ex.Start(sctx); err != nil {
				r.log.Error("shard executor stopped", "shard", k, "err", err)
				r.mu.Lock()
				if r.running[k] == run {
					delete(r.running, k)
				}
				r.mu.Unlock()
			}
		}()
	}
	r.owned.Set(float64(len(r.running)))
	if len(started)+len(stopped) > 0 {
		slices.Sort(stopped)
		r.log.Info("shards changed", "members", len(live), "started", started, "stopped", stopped, "shards", r.ownedLocked())
	}
}

func (r *Replica) stopLocked(k int, run *shardRun) {
	delete(r.running, k)
	run.cancel()
	r.stops.Add(1)
	go func() {
		defer r.stops.Done()
		<-run.done
	}()
}

func (r *Replica) ownedLocked() []int {
	var out []int
	for k := range r.running {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Shards returns the shards this replica runs now.
func (r *Replica) Shards() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ownedLocked()
}

// leave hands the shards over: each executor stops and releases its shard
// Lease, then the membership Lease goes, so that the others, assigning the
// shards among themselves, find them free.
func (r *Replica) leave(member *coordinationv1.Lease) {
	r.mu.Lock()
	r.leaving = true
	for k, run := range r.running {
		r.stopLocked(k, run)
	}
	r.owned.Set(0)
	r.mu.Unlock()
	r.stops.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if member != nil {
		err := r.cfg.Client.CoordinationV1().Leases(r.cfg.Namespace).Delete(ctx, member.Name, metav1.DeleteOptions{})
		if err != nil {
			r.log.Warn("deleting the membership lease (the others wait for it to expire)", "err", err)
		}
	}
	if r.cfg.Groups != nil {
		r.beat.Lock() // a heartbeat after the leave would keep the entry
		defer r.beat.Unlock()
		if err := r.cfg.Groups.Leave(ctx, r.cfg.Group, r.cfg.Identity); err != nil {
			r.log.Warn("leaving the group in the store (the entry ages out)", "err", err)
		}
	}
	r.log.Info("left the replica group: shards released")
}

func (r *Replica) noteRenewed() {
	r.mu.Lock()
	r.renewedAt = r.cfg.Clock.Now()
	r.mu.Unlock()
}

// changed routes a store change to the owner's executor.
func (r *Replica) changed(ctx context.Context, c store.Change) {
	r.mu.Lock()
	var runs []*shardRun
	if c.ID == "" {
		// In shard order: one after the other, each a store read, in an
		// order that replays (the simulator's).
		for _, k := range slices.Sorted(maps.Keys(r.running)) {
			runs = append(runs, r.running[k])
		}
	} else if k, ok := r.byID[c.Executor]; ok && r.running[k] != nil {
		runs = append(runs, r.running[k])
	}
	r.mu.Unlock()
	for _, run := range runs {
		if c.ID != "" {
			run.ex.Resync(c.ID)
		} else if err := run.ex.ResyncAll(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("resync after the store's change feed reconnected", "err", err)
		}
	}
}

// executorOf returns the executor that answers for task id: the running one
// of its shard when this replica owns it, else the shard's record-only one.
func (r *Replica) executorOf(id string) *executor.Executor {
	k := ShardOf(id, r.cfg.Shards)
	r.mu.Lock()
	defer r.mu.Unlock()
	if run := r.running[k]; run != nil {
		return run.ex
	}
	return r.records[k]
}

// Submit records the task in its shard; the shard's owner runs it.
func (r *Replica) Submit(ctx context.Context, id string, t *task.Task, opts ...executor.SubmitOption) (store.Record, error) {
	return r.executorOf(id).Submit(ctx, id, t, opts...)
}

// SubmitCreated is Submit that also reports whether this call created the
// task's record (executor.Executor.SubmitCreated).
func (r *Replica) SubmitCreated(ctx context.Context, id string, t *task.Task, opts ...executor.SubmitOption) (store.Record, bool, error) {
	return r.executorOf(id).SubmitCreated(ctx, id, t, opts...)
}

// Get returns the task's record (with the live state when this replica runs
// its shard).
func (r *Replica) Get(ctx context.Context, id string) (store.Record, error) {
	return r.executorOf(id).Get(ctx, id)
}

// Cancel asks for the task to stop; its shard's owner stops it.
func (r *Replica) Cancel(ctx context.Context, id string, opts ...executor.CancelOption) error {
	return r.executorOf(id).Cancel(ctx, id, opts...)
}

// Healthy is nil while every executor this replica runs can see its pods.
func (r *Replica) Healthy() error {
	r.mu.Lock()
	var runs []*shardRun
	for _, run := range r.running {
		runs = append(runs, run)
	}
	r.mu.Unlock()
	var errs []error
	for _, run := range runs {
		errs = append(errs, run.ex.Healthy())
	}
	return errors.Join(errs...)
}

// Ready is nil while the replica is a member of its group: it renewed its
// membership Lease within the lease duration, is not leaving, and no live
// member with another shard count keeps it from running shards (then it
// returns a *MixedShardsError). Owning shards is not required: a replica
// waiting for a dead one's shard Leases to expire still serves the API.
func (r *Replica) Ready() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.leaving:
		return errors.New("leaving the replica group")
	case r.waiting != nil:
		return r.waiting
	case r.renewedAt.IsZero():
		return errors.New("not yet a member of the replica group")
	case r.cfg.Clock.Since(r.renewedAt) >= r.cfg.LeaseDuration:
		return fmt.Errorf("could not renew the membership lease since %s", r.renewedAt.Format(time.RFC3339))
	}
	return nil
}
