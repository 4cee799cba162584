package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
	"github.com/kubetask/kubetask/test/faults/chaos/history"
)

// TestChaosClusters is issue 35's chaos run over several clusters: one
// `kubetask serve` (the built binary, PostgreSQL store) given two real
// clusters, east (the shared one) and west (clustertest.Another: its own
// etcd, kube-apiserver, scheduler and kwok nodes), each API server writing
// its audit log. A stream of kwok tasks (main exits, sidecar runs on) goes
// on while west suffers, one after another:
//
//   - a partition that looks alive: west's kube-apiserver SIGSTOPped until
//     the service says west is Unreachable, and a while longer;
//   - an API server down: west's kube-apiserver stopped for a minute, then
//     started again;
//   - credentials revoked: the service reaches west as a ServiceAccount
//     whose ClusterRoleBinding is deleted (every request refused, 403),
//     then rotated: the kubeconfig rewritten with another ServiceAccount's
//     token, which the service takes without a restart;
//   - removed from the configuration: the service restarted without west
//     while tasks run there (west Unreachable, NotConfigured; its tasks
//     keep their state), then with west again;
//   - a loss and a return: three long tasks placed on west (east drained
//     meanwhile), west's kube-apiserver SIGSTOPped, west declared lost
//     through the API, the tasks' next attempts run on east, then west
//     answers again and the service takes it back (Returning, then Ready
//     once its lost pods are stopped).
//
// Then the history checker judges both audit logs merged
// (history.Merge), the store's records and both clusters' pods left:
// no attempt ran twice or on two clusters (invariant 1, across clusters),
// none ran after its outcome, no two pods of a task ran at once unless an
// attempt was declared lost (at least once by design, docs/multicluster.md),
// every task ended with its main container's outcome, nothing is left.
// About 3 minutes.
func TestChaosClusters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second cluster")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "kubetask-chaos-clusters-")
	if err != nil {
		t.Fatal(err)
	}
	env := clustertest.New(t)
	west := clustertest.Another(t, env, clustertest.Options{SimNodes: 2, LocalNodes: -1, Audit: true})
	defer func() {
		if t.Failed() || os.Getenv("KUBETASK_CHAOS_KEEP") != "" {
			_ = copyFile(env.Cluster.AuditLogPath(), filepath.Join(dir, "audit-east.log"))
			_ = copyFile(west.Cluster.AuditLogPath(), filepath.Join(dir, "audit-west.log"))
			_ = os.Remove(filepath.Join(dir, "kubetask"))
			t.Logf("kept the run directory (service log, audit logs): %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()

	pg, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pg.Stop() }()
	_, url, err := pg.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bin, err := clustertest.BuildKubetask(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	c := &clusterChaos{t: t, west: west, westKubeconfig: filepath.Join(dir, "west-sa.kubeconfig")}
	c.serviceAccount(ctx, saName)
	westKubeconfig := c.westKubeconfig
	cfg := filepath.Join(dir, "serve.yaml")
	c.configure = func(withWest bool) {
		doc := fmt.Sprintf("unreachableAfter: 5s\nreloadInterval: 1s\nclusters:\n- {name: east, kubeconfig: %q}\n", env.Kubeconfig)
		if withWest {
			doc += fmt.Sprintf("- {name: west, kubeconfig: %q}\n", westKubeconfig)
		}
		if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c.configure(true)
	g := &group{tb: t, env: env, bin: bin, dir: dir, storeURL: url, name: "chaos-clusters", lease: lease,
		extra: []string{"--config", cfg}, replicas: map[string]*replicaProc{}}
	defer g.stopAll()
	svc, err := g.start(ctx, replicaIDs[0]) // live() knows the replicas by these names
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenPostgres(ctx, url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	w := &workload{g: g, ns: env.Namespace, rng: rand.New(rand.NewPCG(seed, seed)), byKind: map[string]int{}}
	quick := kinds[0] // kwok: main exits 0, sidecar keeps running

	// The stream: two tasks a second, placed by the service, until the
	// faults are done.
	faultsDone := make(chan struct{})
	var wg sync.WaitGroup
	var streamErr error
	wg.Go(func() {
		for {
			if _, err := w.submit(ctx, 2, &quick); err != nil {
				streamErr = err
				return
			}
			select {
			case <-faultsDone:
				return
			case <-time.After(time.Second): // the stream's pace
			}
		}
	})

	c.svc, c.g = svc.client, g
	begin := time.Now()
	// KUBETASK_CHAOS_CLUSTER_FAULTS: some of partition, down, revoke, removed (all
	// by default) before the loss, which always comes last.
	faults := map[string]func(context.Context, *workload){"partition": c.partition, "down": c.down, "revoke": c.revoke, "removed": c.removed}
	names := []string{"partition", "down", "revoke", "removed"}
	if v, ok := os.LookupEnv("KUBETASK_CHAOS_CLUSTER_FAULTS"); ok {
		names = strings.FieldsFunc(v, func(r rune) bool { return r == ',' })
	}
	for _, n := range names {
		f, ok := faults[n]
		if !ok {
			t.Fatalf("KUBETASK_CHAOS_CLUSTER_FAULTS: no fault %q (want some of partition, down, revoke, removed)", n)
		}
		c.pause(ctx, 10*time.Second)
		f(ctx, w)
	}
	c.pause(ctx, 10*time.Second)
	long := c.loseAndReturn(ctx, w)
	close(faultsDone)
	wg.Wait()
	if streamErr != nil {
		t.Errorf("submitting: %v", streamErr)
	}
	t.Logf("faults done after %s", time.Since(begin).Round(time.Second))

	ids := w.all()
	if err := waitFor(ctx, 3*time.Minute, func(ctx context.Context) error { return terminal(ctx, st, ids) }); err != nil {
		t.Logf("waiting for every task to finish: %v (the checker reports them)", err)
	}
	envs := map[string]*clustertest.Env{"east": env, "west": west}
	for name, e := range envs {
		pods := e.Client.CoreV1().Pods(e.Namespace)
		if err := waitFor(ctx, 3*time.Minute, func(ctx context.Context) error {
			l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
			if err == nil && len(l.Items) > 0 {
				err = fmt.Errorf("%d task pods left on %s", len(l.Items), name)
			}
			return err
		}); err != nil {
			t.Logf("waiting for the task pods to go: %v (the checker reports them)", err)
		}
	}
	for _, id := range c.stayed {
		rec, err := st.Get(ctx, id)
		switch {
		case err != nil:
			t.Errorf("task %s: %v", id, err)
		case len(rec.Attempts) != 1 || rec.Attempts[0].Cluster != "west" || rec.Phase != "Succeeded":
			t.Errorf("task %s, running on west when it went quiet: %s/%s on %q, attempts %+v; want one attempt, Succeeded on west", id, rec.Phase, rec.Reason, rec.Cluster, rec.Attempts)
		}
	}
	for _, id := range long {
		rec, err := st.Get(ctx, id)
		switch {
		case err != nil:
			t.Errorf("long task %s: %v", id, err)
		case len(rec.Attempts) < 2 || rec.Attempts[0].Reason != "ClusterLost" || rec.Attempts[0].Cluster != "west" || rec.Cluster != "east" || rec.Phase != "Succeeded":
			t.Errorf("long task %s: %s/%s on %q, attempts %+v; want attempt 0 lost on west, the last Succeeded on east", id, rec.Phase, rec.Reason, rec.Cluster, rec.Attempts)
		}
	}
	g.stopAll()

	// The history, from the outside: both API servers' audit logs, the
	// store, both clusters' pods left.
	audits := map[string]*history.Audit{}
	in := history.Input{Namespaces: []string{env.Namespace}}
	for name, e := range envs {
		f, err := os.Open(e.Cluster.AuditLogPath())
		if err != nil {
			t.Fatal(err)
		}
		a, err := history.ReadAudit(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		audits[name] = a
		l, err := e.Client.CoreV1().Pods(e.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if err != nil {
			t.Fatal(err)
		}
		in.Left = append(in.Left, l.Items...)
	}
	in.Audit = history.Merge(audits)
	if in.Tasks, err = history.ReadStore(ctx, st); err != nil {
		t.Fatal(err)
	}
	rep := history.Check(in)
	ran := map[string]int{}
	for _, p := range in.Audit.Order {
		if p.Namespace == env.Namespace && p.Ran() {
			ran[p.Cluster]++
		}
	}
	t.Logf("%d tasks; pods that ran: %d on east, %d on west\n%s", len(ids), ran["east"], ran["west"], rep.Table())
	if len(rep.Violations) > 0 {
		t.Errorf("%d violations:\n%s", len(rep.Violations), rep.Examples(10))
	}
	if ran["east"] == 0 || ran["west"] == 0 {
		t.Errorf("pods ran %d on east and %d on west: the run did not spread tasks over both clusters", ran["east"], ran["west"])
	}
	if rep.Lost < len(long) {
		t.Errorf("%d attempts declared lost, want at least the %d long tasks' on west", rep.Lost, len(long))
	}
	if len(in.Tasks) != len(ids) {
		t.Errorf("the store has %d records, %d tasks were submitted", len(in.Tasks), len(ids))
	}
	if t.Failed() {
		if err := history.SaveInput(dir, in); err != nil {
			t.Logf("saving the checker's input: %v", err)
		}
	}
}

// clusterChaos injects TestChaosClusters' faults into west and waits for
// the service (svc) to see them.
type clusterChaos struct {
	t    *testing.T
	svc  *client.Client
	west *clustertest.Env
	// stayed are the tasks running on west when a fault that is not a
	// loss began: each must end with one attempt, on west.
	stayed []string
	// g is the service's group (one replica) and configure writes its
	// configuration, with west or without.
	g         *group
	configure func(withWest bool)
	// westKubeconfig is the service's kubeconfig of west (a
	// ServiceAccount's token), rewritten when revoke rotates it.
	westKubeconfig string
	rotations      int
}

func (c *clusterChaos) pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d): // the gap between faults: tasks run meanwhile
	}
}

// reason is why the service says west is in its state.
func (c *clusterChaos) reason(ctx context.Context) string {
	l, err := c.svc.Clusters(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, cl := range l.Items {
		if cl.Name == "west" {
			return cl.Reason
		}
	}
	return ""
}

// state waits until the service says west is in state, up to timeout.
func (c *clusterChaos) state(ctx context.Context, state string, timeout time.Duration) error {
	var last string
	err := waitFor(ctx, timeout, func(ctx context.Context) error {
		l, err := c.svc.Clusters(ctx)
		if err != nil {
			return err
		}
		for _, cl := range l.Items {
			if cl.Name == "west" {
				last = cl.State
			}
		}
		if last != state {
			return fmt.Errorf("west is %s", last)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("waiting for west to be %s: %w", state, err)
	}
	return nil
}

// apiserver signals west's kube-apiserver.
func (c *clusterChaos) apiserver(sig syscall.Signal) {
	c.t.Helper()
	for _, p := range c.west.Cluster.Processes() {
		if p.Name == "kube-apiserver" {
			if err := syscall.Kill(p.PID, sig); err != nil {
				c.t.Fatalf("signalling west's kube-apiserver: %v", err)
			}
			return
		}
	}
	c.t.Fatal("west's kube-apiserver does not run")
}

// partition SIGSTOPs west's kube-apiserver (its port accepts connections,
// nothing answers) until the service says Unreachable, 5 s more, then
// SIGCONTs it and waits for Ready.
func (c *clusterChaos) partition(ctx context.Context, w *workload) {
	c.t.Helper()
	c.onWest(ctx, w, 3, "8s")
	start := time.Now()
	c.apiserver(syscall.SIGSTOP)
	err := c.state(ctx, "Unreachable", time.Minute)
	if err == nil {
		if got := c.reason(ctx); got != "NotAnswering" {
			c.t.Errorf("partition: west Unreachable because %q, want NotAnswering", got)
		}
	}
	c.pause(ctx, 5*time.Second)
	c.apiserver(syscall.SIGCONT)
	if err != nil {
		c.t.Fatalf("partition: %v", err)
	}
	if err := c.state(ctx, "Ready", 2*time.Minute); err != nil {
		c.t.Fatalf("after the partition: %v", err)
	}
	c.t.Logf("fault: west's kube-apiserver SIGSTOPped: Unreachable, then Ready again, %s in all", time.Since(start).Round(time.Second))
}

// downFor is how long down keeps west's kube-apiserver stopped: the
// issue's minute, twelve times unreachableAfter.
const downFor = 60 * time.Second

// down stops west's kube-apiserver for downFor (at least 5 s past the
// service's Unreachable), then starts it again and waits for Ready.
func (c *clusterChaos) down(ctx context.Context, w *workload) {
	c.t.Helper()
	c.onWest(ctx, w, 3, "8s")
	start := time.Now()
	if err := c.west.Cluster.StopAPIServer(ctx); err != nil {
		c.t.Fatal(err)
	}
	err := c.state(ctx, "Unreachable", time.Minute)
	c.pause(ctx, max(downFor-time.Since(start), 5*time.Second))
	if serr := c.west.Cluster.StartAPIServer(ctx); serr != nil {
		c.t.Fatal(serr)
	}
	if err != nil {
		c.t.Fatalf("API server down: %v", err)
	}
	if err := c.state(ctx, "Ready", 2*time.Minute); err != nil {
		c.t.Fatalf("after the API server's return: %v", err)
	}
	c.t.Logf("fault: west's kube-apiserver stopped: Unreachable, then Ready again, %s in all", time.Since(start).Round(time.Second))
}

// onWest places n tasks whose main container exits after exitAfter on
// west (east drained meanwhile) and waits until they run there: the tasks
// a fault of west meets.
func (c *clusterChaos) onWest(ctx context.Context, w *workload, n int, exitAfter string) []string {
	c.t.Helper()
	if _, err := c.svc.DrainCluster(ctx, "east", true); err != nil {
		c.t.Fatal(err)
	}
	k := kind{name: "kwok: main exits 0 after " + exitAfter + ", on west", make: func(_ *rand.Rand, name string) *task.Task {
		return retries(exectest.SimTask(name, map[string]string{kwokstages.ExitContainer: "main", kwokstages.ExitAfter: exitAfter}))
	}}
	ids, err := w.submit(ctx, n, &k)
	if _, derr := c.svc.DrainCluster(ctx, "east", false); derr != nil {
		c.t.Fatal(derr)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	if err := waitFor(ctx, time.Minute, func(ctx context.Context) error {
		for _, id := range ids {
			tk, err := c.svc.Get(ctx, id)
			if err != nil {
				return err
			}
			if tk.Cluster != "west" || tk.Phase != "Running" {
				return fmt.Errorf("%s is %s on %q", id, tk.Phase, tk.Cluster)
			}
		}
		return nil
	}); err != nil {
		c.t.Fatalf("the tasks to run on west: %v", err)
	}
	c.stayed = append(c.stayed, ids...)
	return ids
}

// loseAndReturn places three long tasks on west (onWest), SIGSTOPs west's
// kube-apiserver, declares west lost, waits until the tasks' next
// attempts finished on east, then SIGCONTs west and waits for Ready
// (Returning first). It returns the long tasks.
func (c *clusterChaos) loseAndReturn(ctx context.Context, w *workload) []string {
	c.t.Helper()
	start := time.Now()
	ids := c.onWest(ctx, w, 3, "15s")
	c.stayed = c.stayed[:len(c.stayed)-len(ids)] // these move: west is lost
	var err error
	c.apiserver(syscall.SIGSTOP)
	_, err = c.svc.LoseCluster(ctx, "west")
	if err == nil {
		err = waitFor(ctx, 2*time.Minute, func(ctx context.Context) error {
			for _, id := range ids {
				tk, err := c.svc.Get(ctx, id)
				if err != nil {
					return err
				}
				if !tk.Terminal || !slices.ContainsFunc(tk.Attempts, func(a api.Attempt) bool { return a.Reason == "ClusterLost" }) {
					return fmt.Errorf("%s is %s/%s on %q", id, tk.Phase, tk.Reason, tk.Cluster)
				}
			}
			return nil
		})
	}
	c.apiserver(syscall.SIGCONT)
	if err != nil {
		c.t.Fatalf("after west was declared lost: %v", err)
	}
	if err := c.state(ctx, "Ready", 3*time.Minute); err != nil {
		c.t.Fatalf("after west returned: %v", err)
	}
	c.t.Logf("fault: west declared lost with 3 tasks running there, SIGSTOPped; their next attempts ran on east; west Ready again, %s in all", time.Since(start).Round(time.Second))
	return ids
}

// saName is the ServiceAccount the service first reaches west as.
const saName = "kubetask-chaos"

// serviceAccount makes the service's credentials for west ServiceAccount
// name's token, bound to cluster-admin by a ClusterRoleBinding of that
// name (revoke deletes the first one's): it writes westKubeconfig (whole,
// then renamed, as a Secret's volume swaps its files).
func (c *clusterChaos) serviceAccount(ctx context.Context, name string) {
	c.t.Helper()
	cs := c.west.Client
	if _, err := cs.CoreV1().ServiceAccounts("kube-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	c.bind(ctx, name)
	tok, err := cs.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["west"] = &clientcmdapi.Cluster{Server: c.west.Config.Host, CertificateAuthorityData: c.west.Cluster.CAData()}
	kc.AuthInfos["west"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	kc.Contexts["west"] = &clientcmdapi.Context{Cluster: "west", AuthInfo: "west"}
	kc.CurrentContext = "west"
	if err := clientcmd.WriteToFile(*kc, c.westKubeconfig+".new"); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(c.westKubeconfig+".new", c.westKubeconfig); err != nil {
		c.t.Fatal(err)
	}
}

// bind grants ServiceAccount name cluster-admin on west.
func (c *clusterChaos) bind(ctx context.Context, name string) {
	c.t.Helper()
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: "kube-system"}},
	}
	if _, err := c.west.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// revoke deletes the ClusterRoleBinding of the service's ServiceAccount
// on west (every request of the service there is then refused, 403) until
// the service says Unreachable, 5 s more, then rotates the credentials:
// the kubeconfig the service reads is rewritten with another
// ServiceAccount's token (bound), and the service, not restarted, is
// Ready there again.
func (c *clusterChaos) revoke(ctx context.Context, w *workload) {
	c.t.Helper()
	c.onWest(ctx, w, 3, "8s")
	start := time.Now()
	if err := c.west.Client.RbacV1().ClusterRoleBindings().Delete(ctx, saName, metav1.DeleteOptions{}); err != nil {
		c.t.Fatal(err)
	}
	err := c.state(ctx, "Unreachable", time.Minute)
	if err == nil {
		if got := c.reason(ctx); got != "CredentialsRefused" {
			c.t.Errorf("credentials revoked: west Unreachable because %q, want CredentialsRefused", got)
		}
	}
	c.pause(ctx, 5*time.Second)
	c.rotations++
	c.serviceAccount(ctx, fmt.Sprintf("%s-%d", saName, c.rotations))
	if err != nil {
		c.t.Fatalf("credentials revoked: %v", err)
	}
	if err := c.state(ctx, "Ready", 3*time.Minute); err != nil {
		c.t.Fatalf("after the credentials were rotated: %v", err)
	}
	c.t.Logf("fault: the service's credentials on west revoked: Unreachable, then rotated in its kubeconfig, Ready again without a restart, %s in all", time.Since(start).Round(time.Second))
}

// removed restarts the service without west in its configuration while
// three tasks run there: west is listed Unreachable/NotConfigured and its
// tasks show ClusterUnreachable, keeping their state; then the service is
// restarted with west again, which is Ready once its instance answers, and
// the tasks end there.
func (c *clusterChaos) removed(ctx context.Context, w *workload) {
	c.t.Helper()
	ids := c.onWest(ctx, w, 3, "8s")
	start := time.Now()
	restart := func(withWest bool) {
		c.t.Helper()
		c.configure(withWest)
		if _, err := c.g.stop(replicaIDs[0], syscall.SIGTERM); err != nil {
			c.t.Fatal(err)
		}
		r, err := c.g.start(ctx, replicaIDs[0])
		if err != nil {
			c.t.Fatal(err)
		}
		c.svc = r.client
	}
	restart(false)
	if err := c.state(ctx, "Unreachable", time.Minute); err != nil {
		c.t.Fatalf("west removed from the configuration: %v", err)
	}
	for _, id := range ids {
		tk, err := c.svc.Get(ctx, id)
		if err != nil {
			c.t.Fatal(err)
		}
		if tk.Reason != "ClusterUnreachable" || tk.Cluster != "west" || tk.Terminal {
			c.t.Errorf("task %s on west, not configured: %s/%s on %q (%s); want ClusterUnreachable, unfinished", id, tk.Phase, tk.Reason, tk.Cluster, tk.Message)
		}
	}
	c.pause(ctx, 5*time.Second)
	restart(true)
	if err := c.state(ctx, "Ready", 3*time.Minute); err != nil {
		c.t.Fatalf("west configured again: %v", err)
	}
	c.t.Logf("fault: the service restarted without west, 3 tasks running there: Unreachable/NotConfigured, then configured again and Ready, %s in all", time.Since(start).Round(time.Second))
}
