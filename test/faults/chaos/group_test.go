package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/executor"
)

// group is the replica group under test: `kubetask serve` processes (the
// built binary) of one instance ID on one PostgreSQL database, as an
// operator runs them.
type group struct {
	tb       testing.TB
	env      *clustertest.Env
	bin      string
	dir      string // replicas' logs and state
	storeURL string
	name     string
	shards   int
	lease    time.Duration
	extra    []string

	mu       sync.Mutex
	replicas map[string]*replicaProc
}

// replicaProc is one process of a replica; a restart makes a new one.
type replicaProc struct {
	id     string
	cmd    *exec.Cmd
	done   chan struct{}
	url    string
	client *client.Client
	// stopped is set while the process is SIGSTOPped.
	stopped bool
}

var addrLine = regexp.MustCompile(`kubetask serve: (https?://[^ ]+)/api/v1`)

// start starts replica id (again, after it exited) and waits until it is
// ready. Its output is appended to <dir>/<id>.log.
func (g *group) start(ctx context.Context, id string) (*replicaProc, error) {
	args := []string{"serve", "--kubeconfig", g.env.Kubeconfig, "--namespaces", g.env.Namespace, "-n", g.env.Namespace,
		"--listen", "127.0.0.1:0", "--auth", "none", "--state-dir", filepath.Join(g.dir, id), "--store", "postgres",
		"--instance-id", g.name, "--lease-namespace", g.env.Namespace, "--lease-duration", g.lease.String()}
	if g.shards > 0 { // a group of replicas; none: one service (of several clusters)
		args = append(args, "--shards", strconv.Itoa(g.shards), "--replica-id", id)
	}
	args = append(args, g.extra...)
	logPath := filepath.Join(g.dir, id+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "\n=== %s starting replica %s\n", time.Now().Format(time.RFC3339Nano), id)
	addr := newAddrWriter()
	r := &replicaProc{id: id, done: make(chan struct{})}
	r.cmd = exec.Command(g.bin, args...)
	r.cmd.Env = append(os.Environ(), "KUBETASK_STORE_URL="+g.storeURL)
	r.cmd.Stdout = multi{f, addr}
	r.cmd.Stderr = r.cmd.Stdout
	// Its own process group: a signal for the test binary is not the replica's.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting replica %s: %w", id, err)
	}
	go func() { _ = r.cmd.Wait(); f.Close(); close(r.done) }()
	g.mu.Lock()
	g.replicas[id] = r
	g.mu.Unlock()
	select {
	case url := <-addr.found:
		g.mu.Lock()
		r.url = url
		g.mu.Unlock()
	case <-r.done:
		return nil, fmt.Errorf("replica %s exited at start (%v); see %s", id, r.cmd.ProcessState, logPath)
	case <-time.After(2 * time.Minute):
		return nil, fmt.Errorf("replica %s printed no address within 2 minutes; see %s", id, logPath)
	}
	c, err := client.New(r.url, client.WithRetryBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	r.client = c // from now on live: the stream submits to it
	g.mu.Unlock()
	err = waitFor(ctx, 2*time.Minute, func(context.Context) error {
		select {
		case <-r.done:
			return errTerminal{fmt.Errorf("replica %s exited (%v); see %s", id, r.cmd.ProcessState, logPath)}
		default:
		}
		return r.ready()
	})
	if err != nil {
		return nil, fmt.Errorf("replica %s not ready: %w", id, err)
	}
	return r, nil
}

func (r *replicaProc) ready() error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(r.url + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz: %s", resp.Status)
	}
	return nil
}

func (r *replicaProc) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// get returns replica id's current process.
func (g *group) get(id string) *replicaProc {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.replicas[id]
}

// live returns the replicas that run, are not stopped and have a client
// (a replica that is starting has none yet).
func (g *group) live() []*replicaProc {
	g.mu.Lock()
	defer g.mu.Unlock()
	return liveOf(g.replicas)
}

// liveOf is live over replicas, in the order of replicaIDs.
func liveOf(replicas map[string]*replicaProc) []*replicaProc {
	var out []*replicaProc
	for _, id := range replicaIDs {
		if r := replicas[id]; r != nil && r.client != nil && !r.exited() && !r.stopped {
			out = append(out, r)
		}
	}
	return out
}

// signal sends sig to replica id's process.
func (g *group) signal(id string, sig syscall.Signal) error {
	r := g.get(id)
	if r == nil || r.exited() {
		return fmt.Errorf("replica %s is not running", id)
	}
	g.mu.Lock()
	switch sig {
	case syscall.SIGSTOP:
		r.stopped = true
	case syscall.SIGCONT:
		r.stopped = false
	}
	g.mu.Unlock()
	return r.cmd.Process.Signal(sig)
}

// stop signals replica id (SIGTERM or SIGKILL) and waits until it exited
// (SIGKILL after 30 s); it returns how long that took.
func (g *group) stop(id string, sig syscall.Signal) (time.Duration, error) {
	r := g.get(id)
	if r == nil || r.exited() {
		return 0, nil
	}
	start := time.Now()
	if r.stopped {
		_ = g.signal(id, syscall.SIGCONT)
	}
	_ = r.cmd.Process.Signal(sig)
	select {
	case <-r.done:
		return time.Since(start), nil
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
		return time.Since(start), fmt.Errorf("replica %s did not exit within 30 s of %v", id, sig)
	}
}

// stopAll ends every replica with SIGTERM.
func (g *group) stopAll() {
	for _, id := range replicaIDs {
		if _, err := g.stop(id, syscall.SIGTERM); err != nil {
			g.tb.Errorf("stopping the group: %v", err)
		}
	}
}

// holders returns the holder of every shard Lease ("" when none holds it).
func (g *group) holders(ctx context.Context) map[int]string {
	out := map[int]string{}
	for k := range g.shards {
		out[k] = ""
		l, err := g.env.Client.CoordinationV1().Leases(g.env.Namespace).Get(ctx, executor.LeaseName(replica.ShardID(g.name, k)), metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil {
			out[k] = *l.Spec.HolderIdentity
		}
	}
	return out
}

// waitHeldBy waits until every shard Lease is held by one of ids.
func (g *group) waitHeldBy(ctx context.Context, timeout time.Duration, ids ...string) error {
	return waitFor(ctx, timeout, func(ctx context.Context) error {
		for k, h := range g.holders(ctx) {
			if !slices.Contains(ids, h) {
				return fmt.Errorf("shard %d held by %q", k, h)
			}
		}
		return nil
	})
}

// multi writes to both; the second never fails.
type multi struct {
	a *os.File
	b *addrWriter
}

func (m multi) Write(p []byte) (int, error) {
	_, _ = m.b.Write(p)
	return m.a.Write(p)
}

// addrWriter finds the serving address in a replica's output.
type addrWriter struct {
	mu    sync.Mutex
	buf   []byte
	done  bool
	found chan string
}

func newAddrWriter() *addrWriter { return &addrWriter{found: make(chan string, 1)} }

func (w *addrWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	if m := addrLine.FindSubmatch(w.buf); m != nil {
		w.done, w.buf = true, nil
		w.found <- string(m[1])
	} else if len(w.buf) > 1<<20 {
		w.buf = w.buf[len(w.buf)-4096:]
	}
	return len(p), nil
}

// errTerminal ends waitFor at once.
type errTerminal struct{ error }

// waitFor polls check every 200 ms until it succeeds, returns errTerminal,
// timeout passes or ctx ends.
func waitFor(ctx context.Context, timeout time.Duration, check func(context.Context) error) error {
	return waitEvery(ctx, timeout, 200*time.Millisecond, check)
}

// waitEvery is waitFor polling every interval.
func waitEvery(ctx context.Context, timeout, interval time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		err := check(cctx)
		ccancel()
		var term errTerminal
		switch {
		case err == nil:
			return nil
		case errors.As(err, &term):
			return term.error
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", timeout, err)
		case <-time.After(interval):
		}
	}
}
