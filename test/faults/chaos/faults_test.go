package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/faults/chaos/history"
)

// Fault kinds.
const (
	faultStop      = "SIGSTOP past the lease, SIGCONT"
	faultKill      = "SIGKILL a replica, restart it"
	faultTerm      = "SIGTERM a replica, restart it"
	faultAPIServer = "kube-apiserver restart"
	faultStorm     = "410 storm (etcd compacted every 1 s)"
	faultPostgres  = "PostgreSQL stopped and started"
	faultForce     = "pods force-deleted"
	faultEvict     = "pods evicted"
	faultNode      = "a kwok node deleted"
)

// faultKinds are the kinds drawn at random (SIGSTOP is also planned on
// purpose, see planFaults).
var faultKinds = []string{faultStop, faultKill, faultTerm, faultAPIServer, faultStorm, faultPostgres, faultForce, faultEvict, faultNode}

// faultNames are the kinds' short names, for KUBETASK_CHAOS_FAULTS.
var faultNames = map[string]string{"stop": faultStop, "kill": faultKill, "term": faultTerm, "apiserver": faultAPIServer,
	"storm": faultStorm, "postgres": faultPostgres, "force": faultForce, "evict": faultEvict, "node": faultNode}

// fault is one injected fault: what, when (from the run's start) and what
// it did.
type fault struct {
	kind       string
	start, end time.Duration
	note       string
	err        error
	// fence is what a SIGSTOP's resumed replica had the fence refuse
	// (nil for the other kinds).
	fence *stopFence
}

// stopFence is what the fence refused after a SIGSTOP: from the resumed
// replica's log, and the gated pods of its shards never bound (from the
// audit log, once the run is over).
type stopFence struct {
	victim    string
	executors []string
	log       history.FenceEvents
	gated     int
}

// exercised reports whether the fence refused anything.
func (f *stopFence) exercised() bool { return f.log.Total()+f.gated > 0 }

// injector injects faults into a running group.
type injector struct {
	g     *group
	w     *workload
	c     *localcluster.Cluster
	pg    *pgtest.Server
	st    store.Store
	rng   *rand.Rand
	begin time.Time
	burst int // tasks submitted right before each SIGSTOP
}

// inject runs one fault of kind, with its recovery, and returns its record.
func (in *injector) inject(ctx context.Context, kind string) fault {
	f := fault{kind: kind, start: time.Since(in.begin)}
	switch kind {
	case faultStop:
		f.fence = &stopFence{}
		f.note, f.err = in.sigstop(ctx, f.fence)
	case faultKill:
		f.note, f.err = in.restartAfter(ctx, syscall.SIGKILL)
	case faultTerm:
		f.note, f.err = in.restartAfter(ctx, syscall.SIGTERM)
	case faultAPIServer:
		f.err = in.c.RestartAPIServer(ctx)
	case faultStorm:
		f.note, f.err = in.storm(ctx)
	case faultPostgres:
		f.note, f.err = in.postgres(ctx)
	case faultForce, faultEvict:
		f.note, f.err = in.pods(ctx, kind)
	case faultNode:
		f.note, f.err = in.node(ctx)
	default:
		f.err = fmt.Errorf("no fault %q", kind)
	}
	f.end = time.Since(in.begin)
	return f
}

// sigstop is defect 1's scenario (issue 20): the replica holding the most
// shards stalls for 2.5 s (less than the lease: a long GC pause, a
// throttled CPU) while a burst of quick tasks is submitted to the others;
// it resumes and admits its share all at once, more creations than its
// client's rate limiter lets out at once; as soon as the first of them has
// made its pod it is SIGSTOPped again, kept stopped until the others hold
// its shards, have finished every task of them and their pods are gone,
// then SIGCONTed. As it resumes it is also handed one task of each shard it
// held, submitted to it alone: its stale term of the shard admits it, and
// the fence must refuse the creation. What the fence refused from then on
// (its log) goes into fence.
func (in *injector) sigstop(ctx context.Context, fence *stopFence) (string, error) {
	live := in.g.live()
	if len(live) < 2 {
		return "", errors.New("fewer than 2 live replicas")
	}
	holders := in.g.holders(ctx)
	victim := mostShards(holders, live)
	var executors, others []string
	var held []int
	for k, h := range holders {
		if h == victim {
			executors = append(executors, replica.ShardID(in.g.name, k))
			held = append(held, k)
		}
	}
	fence.victim, fence.executors = victim, executors
	for _, r := range live {
		if r.id != victim {
			others = append(others, r.id)
		}
	}
	jobs, err := in.w.prepare(in.burst, &quick)
	if err != nil {
		return "", err
	}
	burst := ids(jobs)
	var mine []string
	for _, id := range burst {
		if slices.Contains(executors, replica.ShardID(in.g.name, replica.ShardOf(id, in.g.shards))) {
			mine = append(mine, id)
		}
	}
	cont := func() { _ = in.g.signal(victim, syscall.SIGCONT) }

	// The stall, while the burst is submitted to the others.
	if err := in.g.signal(victim, syscall.SIGSTOP); err != nil {
		return "", err
	}
	sent := make(chan struct{})
	var sendErr error
	go func() {
		defer close(sent)
		sendErr = in.w.send(ctx, jobs, func() []*replicaProc {
			var out []*replicaProc
			for _, r := range in.g.live() {
				if r.id != victim {
					out = append(out, r)
				}
			}
			return out
		})
	}()
	select {
	case <-sent:
	case <-time.After(2500 * time.Millisecond): // the stall's length: the rest of the burst comes later
	}
	cont()

	// The pause, once the victim's creations have begun.
	sel := fmt.Sprintf("%s=%s,%s in (%s)", task.LabelManagedBy, task.ManagedByValue, task.LabelExecutor, strings.Join(executors, ","))
	pods := in.g.env.Client.CoreV1().Pods(in.g.env.Namespace)
	withPod := func(ctx context.Context) (int, error) {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return 0, err
		}
		n := 0
		for _, p := range l.Items {
			if slices.Contains(mine, p.Labels[task.LabelRun]) {
				n++
			}
		}
		return n, nil
	}
	err = waitEvery(ctx, 30*time.Second, 10*time.Millisecond, func(ctx context.Context) error {
		n, err := withPod(ctx)
		if err == nil && n == 0 {
			err = errors.New("no pod of the victim's share yet")
		}
		return err
	})
	if err != nil {
		return "", err
	}
	if err := in.g.signal(victim, syscall.SIGSTOP); err != nil {
		return "", err
	}
	stopped := time.Now()
	had, _ := withPod(ctx)
	<-sent
	// The tasks of its shards submitted so far.
	var theirs []string
	for _, id := range in.w.all() {
		if slices.Contains(executors, replica.ShardID(in.g.name, replica.ShardOf(id, in.g.shards))) {
			theirs = append(theirs, id)
		}
	}
	if sendErr != nil {
		cont()
		return "", sendErr
	}
	if err := in.g.waitHeldBy(ctx, 3*in.g.lease+time.Minute, others...); err != nil {
		cont()
		return "", fmt.Errorf("the others did not take %s's shards: %w", victim, err)
	}
	takeover := time.Since(stopped)
	// Every one of those finished by the others and its pod gone (a row the
	// victim locked, a log the node does not serve would hold some: go on
	// after 2 minutes).
	_ = waitFor(ctx, 2*time.Minute, func(ctx context.Context) error {
		if err := terminal(ctx, in.st, theirs); err != nil {
			return err
		}
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if err != nil {
			return err
		}
		for _, p := range l.Items {
			if slices.Contains(theirs, p.Labels[task.LabelRun]) {
				return fmt.Errorf("pod %s is still there", p.Name)
			}
		}
		return nil
	})
	paused := time.Since(stopped)

	// The resumed replica's stale terms, handed work: one task of each
	// shard it held, sent while it is still stopped so that it reads them
	// as it resumes, before it finds out that it lost the shards' Leases.
	logPath := filepath.Join(in.g.dir, victim+".log")
	from := fileSize(logPath)
	probes, err := in.w.prepareWhere(len(held), &quick, inShards(held, in.g.shards))
	if err != nil {
		cont()
		return "", err
	}
	probed := make(chan error, 1)
	go func() { probed <- in.submitTo(ctx, victim, probes) }()
	cont()
	err = waitFor(ctx, 2*time.Minute, func(context.Context) error { return in.g.get(victim).ready() })
	if perr := <-probed; err == nil {
		err = perr
	}
	// What the fence refused, as its log tells (the suite fails the run
	// when neither it nor the audit log shows a refusal).
	_ = waitFor(ctx, time.Minute, func(context.Context) error {
		seen, rerr := fenceEventsSince(logPath, from)
		fence.log = seen
		if rerr == nil && seen.Total() == 0 {
			rerr = errors.New("no refusal of the fence in its log yet")
		}
		return rerr
	})
	return fmt.Sprintf("%s (%d of %d shards; %d of the burst's %d tasks, %d with a pod at SIGSTOP): the others held its shards %s later; SIGCONT after %s, once its shards' %d tasks were finished and their pods gone; its log from then, at the first refusal: %s",
		victim, len(executors), in.g.shards, len(mine), len(burst), had, secs(takeover), secs(paused), len(theirs), fence.log), err
}

// inShards is whether a task ID falls in one of shards (of n), each shard
// taken once: the IDs it accepts are one per shard.
func inShards(shards []int, n int) func(id string) bool {
	left := slices.Clone(shards)
	return func(id string) bool {
		i := slices.Index(left, replica.ShardOf(id, n))
		if i < 0 {
			return false
		}
		left = slices.Delete(left, i, i+1)
		return true
	}
}

// submitTo submits jobs to replica id alone, whether it is stopped or not
// (a stopped one reads them when it resumes), for a minute at most; then,
// if that failed, to the live replicas: a task the workload drew must
// exist.
func (in *injector) submitTo(ctx context.Context, id string, jobs []job) error {
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := in.w.send(sctx, jobs, func() []*replicaProc {
		if r := in.g.get(id); r != nil && r.client != nil && !r.exited() {
			return []*replicaProc{r}
		}
		return nil
	})
	if err != nil {
		err = in.w.send(ctx, jobs, in.g.live)
	}
	return err
}

// fenceEventsSince counts the fence's refusals in a replica's log from
// offset from on.
func fenceEventsSince(path string, from int64) (history.FenceEvents, error) {
	f, err := os.Open(path)
	if err != nil {
		return history.FenceEvents{}, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return history.FenceEvents{}, err
	}
	return history.ReadFenceEvents(f)
}

// fileSize is the size of the file at path (0 when it cannot tell).
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// restartAfter ends a random live replica with sig, waits until the others
// hold its shards, and starts it again.
func (in *injector) restartAfter(ctx context.Context, sig syscall.Signal) (string, error) {
	live := in.g.live()
	if len(live) < 2 {
		return "", errors.New("fewer than 2 live replicas")
	}
	victim := live[in.rng.IntN(len(live))].id
	took, err := in.g.stop(victim, sig)
	if err != nil {
		return "", err
	}
	var others []string
	for _, r := range in.g.live() {
		others = append(others, r.id)
	}
	start := time.Now()
	held := in.g.waitHeldBy(ctx, 3*in.g.lease+time.Minute, others...)
	takeover := time.Since(start)
	// Restarted in any case: the run goes on with three replicas.
	if _, err := in.g.start(ctx, victim); err != nil {
		return "", err
	}
	if held != nil {
		return fmt.Sprintf("%s exited %s after the signal; restarted", victim, secs(took)), fmt.Errorf("the others did not take %s's shards: %w", victim, held)
	}
	return fmt.Sprintf("%s exited %s after the signal; the others held its shards %s later", victim, secs(took), secs(takeover)), nil
}

// storm restarts kube-apiserver (every watch resumes from an old version)
// and compacts etcd every second for 10 s, after two writes each time, so
// that every resumed or restarted pod watch meets 410 Expired.
func (in *injector) storm(ctx context.Context) (string, error) {
	if err := in.c.RestartAPIServer(ctx); err != nil {
		return "", err
	}
	cms := in.g.env.Client.CoreV1().ConfigMaps(in.g.env.Namespace)
	n := 0
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); n++ {
		for range 2 {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "storm-noise"}, Data: map[string]string{"at": time.Now().Format(time.RFC3339Nano)}}
			if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					return "", fmt.Errorf("writing noise: %w", err)
				}
			}
		}
		if _, err := in.c.CompactEtcd(ctx); err != nil {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return fmt.Sprintf("%d compactions", n), nil
}

// postgres stops the server at once (SIGQUIT) for 3-12 s.
func (in *injector) postgres(ctx context.Context) (string, error) {
	if err := in.pg.Crash(); err != nil {
		return "", err
	}
	down := time.Duration(3000+in.rng.IntN(9000)) * time.Millisecond
	select {
	case <-ctx.Done():
	case <-time.After(down): // the outage is the fault
	}
	return fmt.Sprintf("down %s", secs(down)), in.pg.Restart(context.WithoutCancel(ctx))
}

// pods force-deletes (grace 0) or evicts up to 3 random running task pods,
// once one runs (20 s at most: the stream's pace leaves moments with none).
func (in *injector) pods(ctx context.Context, kind string) (string, error) {
	pods := in.g.env.Client.CoreV1().Pods(in.g.env.Namespace)
	var (
		running []corev1.Pod
		listErr error
	)
	_ = waitFor(ctx, 20*time.Second, func(ctx context.Context) error {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if listErr = err; err != nil {
			return err
		}
		running = running[:0]
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running = append(running, p)
			}
		}
		if len(running) == 0 {
			return errors.New("no task pod is running")
		}
		return nil
	})
	if listErr != nil {
		return "", listErr
	}
	var err error
	in.rng.Shuffle(len(running), func(i, j int) { running[i], running[j] = running[j], running[i] })
	var done []string
	for _, p := range running[:min(3, len(running))] {
		if kind == faultForce {
			err = pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		} else {
			err = pods.EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
		}
		if err == nil {
			done = append(done, p.Name+" on "+p.Spec.NodeName)
		}
	}
	return fmt.Sprintf("%d of %d running: %s", len(done), len(running), strings.Join(done, ", ")), nil
}

// node deletes a random kwok node and adds a new one.
func (in *injector) node(ctx context.Context) (string, error) {
	nodes, err := in.g.env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: localcluster.SimNodeLabel + "=sim"})
	if err != nil {
		return "", err
	}
	if len(nodes.Items) == 0 {
		return "", errors.New("no kwok node")
	}
	n := nodes.Items[in.rng.IntN(len(nodes.Items))]
	pods, _ := in.g.env.Client.CoreV1().Pods(in.g.env.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err := in.g.env.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil {
		return "", err
	}
	if err := in.c.AddSimNodes(ctx, 1); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s with %d task pods", n.Name, len(pods.Items)), nil
}

// terminal is nil once every task of ids has a terminal record.
func terminal(ctx context.Context, st store.Store, ids []string) error {
	recs, err := st.List(ctx, store.ListOptions{NonTerminal: true})
	if err != nil {
		return err
	}
	n := 0
	for _, r := range recs {
		if slices.Contains(ids, r.ID) {
			n++
		}
	}
	if n > 0 {
		return fmt.Errorf("%d tasks not finished", n)
	}
	return nil
}

func mostShards(holders map[int]string, live []*replicaProc) string {
	best, n := live[0].id, -1
	for _, r := range live {
		if c := count(holders, r.id); c > n {
			best, n = r.id, c
		}
	}
	return best
}

func count(holders map[int]string, id string) int {
	n := 0
	for _, h := range holders {
		if h == id {
			n++
		}
	}
	return n
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }
