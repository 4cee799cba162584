// Package replica runs several `kubetask serve` replicas (the built
// binary) on one PostgreSQL store and the local cluster's kwok nodes, and
// proves the promises of docs/replicas.md: shards balanced among replicas,
// takeover after a SIGKILL within the lease duration plus 2 s, hand-over on
// SIGTERM, no duplicate pod or outcome even in a forced split brain, and a
// replica cut off from PostgreSQL that stops acting and recovers; and one
// trace per task across a hand-over (docs/tracing.md).
//
// In short: proves docs/replicas.md's promises (balance, takeover,
// hand-over, no duplicate in a split brain); about 2.5 min in `go test ./...`
// on the 2-core CI machine.
package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

func TestMain(m *testing.M) {
	code := clustertest.Run(m, clustertest.Options{SimNodes: 4, LocalNodes: -1})
	if err := pgtest.StopShared(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func kubetaskBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		binPath, binErr = clustertest.BuildKubetask(ctx, filepath.Join(filepath.Dir(clustertest.Cluster().Dir()), "e2ereplica"))
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// group is a replica group under test: its settings and its processes.
type group struct {
	t        *testing.T
	env      *clustertest.Env
	storeURL string
	name     string
	shards   int
	lease    time.Duration
	environ  []string // added to the replicas' environment
	replicas map[string]*replicaProc
}

type replicaProc struct {
	id     string
	cmd    *exec.Cmd
	out    *syncBuffer
	done   chan struct{}
	url    string
	client *client.Client
}

func newGroup(t *testing.T, env *clustertest.Env, storeURL string, shards int, lease time.Duration) *group {
	return &group{t: t, env: env, storeURL: storeURL, name: "g-" + env.Namespace[len(env.Namespace)-6:], shards: shards, lease: lease, replicas: map[string]*replicaProc{}}
}

var addrLine = regexp.MustCompile(`kubetask serve: (https?://[^ ]+)/api/v1`)

// start starts replica id and waits until it is ready.
func (g *group) start(id string, extra ...string) *replicaProc {
	t := g.t
	t.Helper()
	r := g.launch(id, extra...)
	clustertest.Eventually(t, time.Minute, "replica "+id+" to serve", func(context.Context) error {
		select {
		case <-r.done:
			t.Fatalf("replica %s exited: %v\n%s", id, r.cmd.ProcessState, r.out)
		default:
		}
		m := addrLine.FindStringSubmatch(r.out.String())
		if m == nil {
			return fmt.Errorf("no address yet")
		}
		r.url = m[1]
		return nil
	})
	c, err := client.New(r.url, client.WithRetryBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r.client = c
	clustertest.Eventually(t, time.Minute, "replica "+id+" to be ready", func(context.Context) error {
		return r.ready()
	})
	return r
}

// launch starts replica id without waiting for it.
func (g *group) launch(id string, extra ...string) *replicaProc {
	t := g.t
	t.Helper()
	args := append([]string{"serve", "--kubeconfig", g.env.Kubeconfig, "--namespaces", g.env.Namespace, "-n", g.env.Namespace,
		"--listen", "127.0.0.1:0", "--auth", "none", "--state-dir", t.TempDir(), "--store", "postgres",
		"--instance-id", g.name, "--shards", strconv.Itoa(g.shards), "--replica-id", id,
		"--lease-namespace", g.env.Namespace, "--lease-duration", g.lease.String()}, extra...)
	r := &replicaProc{id: id, out: &syncBuffer{}, done: make(chan struct{})}
	r.cmd = exec.Command(kubetaskBin(t), args...)
	r.cmd.Env = append(append(os.Environ(), "KUBETASK_STORE_URL="+g.storeURL), g.environ...)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	g.replicas[id] = r
	t.Cleanup(func() { g.stop(id, syscall.SIGTERM) })
	return r
}

func (r *replicaProc) ready() error {
	resp, err := http.Get(r.url + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz: %s", resp.Status)
	}
	return nil
}

// stop signals replica id and waits for it to exit (SIGKILL after 30 s).
func (g *group) stop(id string, sig syscall.Signal) time.Duration {
	r := g.replicas[id]
	select {
	case <-r.done:
		return 0
	default:
	}
	start := time.Now()
	_ = r.cmd.Process.Signal(sig)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		g.t.Errorf("replica %s did not stop on %v within 30 s", id, sig)
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	if g.t.Failed() || os.Getenv("KUBETASK_E2E_VERBOSE") != "" {
		g.t.Logf("replica %s output:\n%s", id, r.out)
	}
	return time.Since(start)
}

// shardLease reads shard k's Lease.
func (g *group) shardLease(ctx context.Context, k int) (*coordinationv1.Lease, error) {
	return g.env.Client.CoordinationV1().Leases(g.env.Namespace).Get(ctx, executor.LeaseName(replica.ShardID(g.name, k)), metav1.GetOptions{})
}

// holders returns the holder of every shard Lease ("" when none holds it).
func (g *group) holders(ctx context.Context) (map[int]string, error) {
	out := map[int]string{}
	for k := range g.shards {
		l, err := g.shardLease(ctx, k)
		if err != nil {
			out[k] = ""
			continue
		}
		if l.Spec.HolderIdentity != nil {
			out[k] = *l.Spec.HolderIdentity
		}
	}
	return out, nil
}

// acquiredAfter returns how long after at the last of the shard Leases
// was acquired by its holder (the Lease's acquireTime); it fails the test
// when one cannot be read or was not acquired after at.
func (g *group) acquiredAfter(shards []int, at time.Time) time.Duration {
	g.t.Helper()
	var last time.Duration
	for _, k := range shards {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		l, err := g.shardLease(ctx, k)
		cancel()
		if err != nil {
			g.t.Fatalf("reading shard %d's Lease: %v", k, err)
		}
		if l.Spec.AcquireTime == nil || !l.Spec.AcquireTime.After(at) {
			g.t.Fatalf("shard %d's Lease was not acquired after %s: acquireTime %v", k, at.Format(time.RFC3339Nano), l.Spec.AcquireTime)
		}
		last = max(last, l.Spec.AcquireTime.Sub(at))
	}
	return last
}

// waitBalanced waits until every shard Lease is held by one of ids and each
// holds shards/len(ids) of them, rounded down or up; it returns the time it
// took and the holders.
func (g *group) waitBalanced(timeout time.Duration, ids ...string) (time.Duration, map[int]string) {
	start := time.Now()
	var hs map[int]string
	clustertest.Eventually(g.t, timeout, fmt.Sprintf("shards balanced among %v", ids), func(ctx context.Context) error {
		var err error
		if hs, err = g.holders(ctx); err != nil {
			return err
		}
		load := map[string]int{}
		for k, h := range hs {
			if !slices.Contains(ids, h) {
				return fmt.Errorf("shard %d held by %q", k, h)
			}
			load[h]++
		}
		lo, hi := g.shards/len(ids), (g.shards+len(ids)-1)/len(ids)
		for _, id := range ids {
			if load[id] < lo || load[id] > hi {
				return fmt.Errorf("loads %v", load)
			}
		}
		return nil
	})
	return time.Since(start), hs
}

// syncBuffer is a bytes.Buffer safe for a writer and a concurrent reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// podLog records every task pod the namespace ever had, from a pod
// informer: the UIDs per (run, attempt) and when each run's first pod was
// seen.
type podLog struct {
	mu    sync.Mutex
	uids  map[string]map[string]bool // "run/attempt" -> UIDs of its pods that were scheduled (ran)
	gated map[string]map[string]bool // "run/attempt" -> UIDs of its pods never seen scheduled
	first map[string]time.Time       // run -> first pod seen
}

func watchPods(t *testing.T, env *clustertest.Env) *podLog {
	p := &podLog{uids: map[string]map[string]bool{}, gated: map[string]map[string]bool{}, first: map[string]time.Time{}}
	f := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace(env.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = task.LabelManagedBy + "=" + task.ManagedByValue }))
	inf := f.Core().V1().Pods().Informer()
	note := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		key := pod.Labels[task.LabelRun] + "/" + pod.Labels[task.LabelAttempt]
		p.mu.Lock()
		defer p.mu.Unlock()
		// A pod runs only once it is scheduled; a creation the fence
		// discarded (gated, never scheduled) never ran.
		m := p.uids
		if pod.Spec.NodeName == "" {
			m = p.gated
		} else {
			delete(p.gated[key], string(pod.UID))
		}
		if p.uids[key][string(pod.UID)] {
			m = p.uids
		}
		if m[key] == nil {
			m[key] = map[string]bool{}
		}
		m[key][string(pod.UID)] = true
		if _, ok := p.first[pod.Labels[task.LabelRun]]; !ok {
			p.first[pod.Labels[task.LabelRun]] = time.Now()
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: note, UpdateFunc: func(_, o any) { note(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			note(o)
		}})
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	return p
}

// unrun counts the pods that were never scheduled (the fence discarded
// them before they could run).
func (p *podLog) unrun() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, u := range p.gated {
		n += len(u)
	}
	return n
}

// duplicates returns the (run, attempt) keys that had more than one pod
// that ran (was scheduled).
func (p *podLog) duplicates() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for k, u := range p.uids {
		if len(u) > 1 {
			out = append(out, fmt.Sprintf("%s (%d pods)", k, len(u)))
		}
	}
	sort.Strings(out)
	return out
}

func (p *podLog) firstSeen(run string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.first[run]
	return at, ok
}

// simTaskDoc is a task for the kwok nodes whose main container exits 0
// after d while its sidecar keeps running (kubetask stops it).
func simTaskDoc(t *testing.T, name string, d time.Duration) []byte {
	tk := exectest.SimTask(name, map[string]string{kwokstages.ExitContainer: "main", kwokstages.ExitAfter: d.String()})
	b, err := json.Marshal(tk)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// percentile of sorted durations.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}
