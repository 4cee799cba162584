package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/task"
)

// TestServeClusters: the built service given two clusters in its
// configuration (east, region eu; west, region us: two names for the
// local cluster, whose executor instances keep apart by their pods'
// executor label) places each task as its spec.placement asks, runs it
// with that cluster's instance (the pod's label, read from the API
// server), says the cluster in the task and its attempts, labels its
// metrics by cluster, and refuses at submission a placement no cluster
// meets, naming the field and listing the clusters.
func TestServeClusters(t *testing.T) {
	env := clustertest.New(t)
	s, team := startTwoClusters(t, env, env.Kubeconfig)
	instance := "serve-" + env.Namespace

	kept := func(name, placement string) []byte {
		d := strings.Replace(stepsTask(name, "data", 0), "  retries: {limit: 0}", "  retries: {limit: 0}\n  cleanup: Keep\n"+placement, 1)
		return []byte(d)
	}
	for _, c := range []struct {
		name, placement, cluster string
	}{
		{"to-west", "  placement: {cluster: west}", "west"},
		{"to-eu", "  placement: {clusterSelector: {matchLabels: {region: eu}}}", "east"},
	} {
		tk := s.submit(kept(c.name, c.placement))
		if tk.Cluster != c.cluster {
			t.Fatalf("%s: placed on %q, want %q", c.name, tk.Cluster, c.cluster)
		}
		tk = s.waitTask(tk.ID, 2*time.Minute, c.name+" to finish", func(tk api.Task) bool { return tk.Terminal })
		if tk.Phase != "Succeeded" || tk.Cluster != c.cluster || len(tk.Attempts) != 1 || tk.Attempts[0].Cluster != c.cluster {
			t.Fatalf("%s: %s/%s on %q, attempts %+v; want Succeeded on %s", c.name, tk.Phase, tk.Reason, tk.Cluster, tk.Attempts, c.cluster)
		}
		pod, err := env.Client.CoreV1().Pods(env.Namespace).Get(context.Background(), tk.Attempts[0].Pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := pod.Labels[task.LabelExecutor], instance+"-"+c.cluster; got != want {
			t.Errorf("%s: its pod ran under instance %q, want %q", c.name, got, want)
		}
	}

	for cl, want := range map[string]string{"west": "to-west", "east": "to-eu"} {
		resp, b := s.do(http.MethodGet, api.Prefix+"/tasks?cluster="+cl+"&namespace="+env.Namespace, "", nil)
		var list api.TaskList
		if err := json.Unmarshal(b, &list); resp.StatusCode != http.StatusOK || err != nil {
			t.Fatalf("list --cluster %s: %s %v", cl, resp.Status, err)
		}
		if len(list.Items) != 1 || list.Items[0].Name != want {
			t.Errorf("list --cluster %s: %+v, want only %s", cl, list.Items, want)
		}
	}
	resp, b := s.do(http.MethodPost, api.Prefix+"/namespaces/"+env.Namespace+"/tasks", "application/yaml", kept("to-north", "  placement: {cluster: north}"))
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(b), `spec.placement.cluster \"north\" matches none of the clusters: east (region=eu), west (region=us)`) {
		t.Errorf("a placement on no configured cluster: %s %s; want 422 naming the field and the clusters", resp.Status, b)
	}
	resp, b = s.do(http.MethodGet, "/metrics", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	if !regexp.MustCompile(`(?m)^kubetask_placement_seconds_count [1-9]`).Match(b) {
		t.Errorf("/metrics: no placement timed (kubetask_placement_seconds)")
	}
	for _, cl := range []string{"east", "west"} {
		re := regexp.MustCompile(`(?m)^kubetask_attempt_outcomes_total\{[^}]*cluster="` + cl + `"[^}]*\} 1$`)
		if !re.Match(b) {
			t.Errorf("/metrics: no kubetask_attempt_outcomes_total of cluster %s with 1 outcome", cl)
		}
	}

	// The clusters, and their drain: the CLI, as an operator (a token for
	// every namespace) and as a team (a token for one namespace: refused,
	// and nothing changes, as the next placement shows).
	if out := s.ok("clusters"); !regexp.MustCompile(`(?m)^east\s+Ready\s+\S+\s+region=eu`).MatchString(out) || !regexp.MustCompile(`(?m)^west\s+Ready\s+\S+\s+region=us`).MatchString(out) {
		t.Errorf("kubetask clusters:\n%s", out)
	}
	if r := team.cli(s.URL, "clusters", "drain", "east"); r.code == 0 || !strings.Contains(r.stderr, "team may not drain, resume or declare lost clusters") {
		t.Errorf("a team's token drains a cluster: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := team.cli(s.URL, "clusters"); r.code == 0 || !strings.Contains(r.stderr, "team may not list tasks in every namespace") {
		t.Errorf("a team's token lists the clusters: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The placements below that expect east count on a tie of free slots:
	// every earlier task's pod is released first (a kept pod leaves its
	// instance's count once labelled released).
	settled := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			s.waitTask(id, 2*time.Minute, id+" to finish", func(tk api.Task) bool { return tk.Terminal })
		}
		eventually(t, 2*time.Minute, "every task pod released", func() bool {
			list, err := env.Client.CoreV1().Pods(env.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
			if err != nil {
				return false
			}
			for _, p := range list.Items {
				if p.Labels[task.LabelReleased] != "true" {
					return false
				}
			}
			return true
		})
	}
	settled()
	var more []string // the tasks submitted below, waited for at the end
	if tk := s.submit(kept("after-refusal", "")); tk.Cluster != "east" {
		t.Errorf("after the team's refused drain of east: placed on %q, want east (free slots tie: the first name)", tk.Cluster)
	} else {
		more = append(more, tk.ID)
	}
	if out := s.ok("clusters", "drain", "east"); !strings.Contains(out, "cluster east: Draining since") {
		t.Errorf("kubetask clusters drain east: %s", out)
	}
	if tk := s.submit(kept("while-east-drains", "")); tk.Cluster != "west" {
		t.Errorf("while east drains: placed on %q, want west", tk.Cluster)
	} else {
		more = append(more, tk.ID)
	}
	resp, b = s.do(http.MethodPost, api.Prefix+"/namespaces/"+env.Namespace+"/tasks", "application/yaml", kept("east-only", "  placement: {cluster: east}"))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "east Draining, west Ready") {
		t.Errorf("a task for east only while east drains: %s %s; want 503 with Retry-After naming the states", resp.Status, b)
	}
	if out := s.ok("clusters", "resume", "east"); !strings.Contains(out, "cluster east: Ready since") {
		t.Errorf("kubetask clusters resume east: %s", out)
	}
	settled(more...)
	if tk := s.submit(kept("after-resume", "")); tk.Cluster != "east" {
		t.Errorf("after east resumed: placed on %q, want east", tk.Cluster)
	} else {
		more = append(more, tk.ID)
	}
	for _, id := range more {
		s.waitTask(id, 2*time.Minute, id+" to finish", func(tk api.Task) bool { return tk.Terminal })
	}
}

// startTwoClusters starts the built service with two clusters, east
// (env's cluster, region eu) and west (the cluster of westKubeconfig,
// region us: env's again, under another name, or another cluster), and
// tokens for an operator (every namespace: the service's own) and for a
// team (env's namespace only, the second service returned).
func startTwoClusters(t *testing.T, env *clustertest.Env, westKubeconfig string) (*service, *service) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	tokens := filepath.Join(t.TempDir(), "tokens.yaml")
	doc := fmt.Sprintf("clusters:\n- {name: east, kubeconfig: %q, labels: {region: eu}}\n- {name: west, kubeconfig: %q, labels: {region: us}}\n", env.Kubeconfig, westKubeconfig)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	toks := fmt.Sprintf("tokens:\n- {token: admin-token-0123456789, subject: admin, namespaces: \"*\"}\n- {token: team-token-0123456789, subject: team, namespaces: [%s]}\n", env.Namespace)
	if err := os.WriteFile(tokens, []byte(toks), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startService(t, env, "--config", cfg, "--token-file", tokens)
	s.Token = "admin-token-0123456789"
	teamProc := *s.process
	teamProc.Token = "team-token-0123456789"
	return s, &service{t: t, process: &teamProc}
}

// TestServeClusterLost: two clusters, each its own API server, etcd and
// node. With a task running on east, the operator declares east lost
// through the built CLI (refused without --yes). Its attempt 0
// ends Failed/ClusterLost on east and attempt 1 runs on west and succeeds;
// east's instance (its cluster answers: it is the local cluster) stops
// and releases the lost attempt's pod. From the two API servers: the
// task's attempt 0 had a pod on east only, attempt 1 on west only, and
// none is left. East, which answers, is Returning until that pod is gone,
// then Ready, and takes new tasks again.
func TestServeClusterLost(t *testing.T) {
	env := clustertest.New(t)
	west := clustertest.Another(t, env, clustertest.Options{})
	s, _ := startTwoClusters(t, env, west.Kubeconfig)
	instance := "serve-" + env.Namespace
	seenEast, seenWest := watchTaskPods(t, env), watchTaskPods(t, west)
	doc := strings.Replace(stepsTask("long", "data", 0), "for i in 1 2 3", "sleep 4; for i in 1 2 3", 1)
	tk := s.submit([]byte(doc))
	if tk.Cluster != "east" {
		t.Fatalf("placed on %q, want east (the first of a tie)", tk.Cluster)
	}
	s.waitTask(tk.ID, 2*time.Minute, "the task to run on east", func(tk api.Task) bool { return tk.Phase == "Running" })

	if r := s.cli(s.URL, "clusters", "lose", "east"); r.code == 0 || !strings.Contains(r.stderr, "add --yes") {
		t.Fatalf("lose without --yes: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if out := s.ok("clusters", "lose", "east", "--yes"); !strings.Contains(out, "cluster east: Lost since") || !strings.Contains(out, "1 attempts lost") {
		t.Fatalf("kubetask clusters lose east --yes: %s", out)
	}
	done := s.waitTask(tk.ID, 3*time.Minute, "the task to finish", func(tk api.Task) bool { return tk.Terminal })
	if done.Phase != "Succeeded" || done.Cluster != "west" || len(done.Attempts) != 2 ||
		done.Attempts[0].Reason != "ClusterLost" || done.Attempts[0].Cluster != "east" || done.Attempts[1].Cluster != "west" || done.Attempts[1].Phase != "Succeeded" {
		t.Fatalf("after the loss: %s/%s on %q, attempts %+v; want attempt 0 lost on east, attempt 1 Succeeded on west", done.Phase, done.Reason, done.Cluster, done.Attempts)
	}
	for _, e := range []*clustertest.Env{env, west} {
		eventually(t, 2*time.Minute, "no task pod left", func() bool {
			list, err := e.Client.CoreV1().Pods(e.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
			return err == nil && len(list.Items) == 0
		})
	}
	east, wpods := seenEast(), seenWest()
	if len(east) != 1 || east[done.Attempts[0].Pod] != instance+"-east" {
		t.Errorf("east's API server showed pods %v; want only attempt 0's, %s, under %s-east", east, done.Attempts[0].Pod, instance)
	}
	if len(wpods) != 1 || wpods[done.Attempts[1].Pod] != instance+"-west" {
		t.Errorf("west's API server showed pods %v; want only attempt 1's, %s, under %s-west", wpods, done.Attempts[1].Pod, instance)
	}

	// East answers (it is the local cluster): Returning, then Ready once
	// no pod of its lost attempt is left; then it takes tasks again.
	eventually(t, time.Minute, "east to be Ready again", func() bool {
		return regexp.MustCompile(`(?m)^east\s+Ready\s`).MatchString(s.ok("clusters"))
	})
	if tk := s.submit([]byte(stepsTask("after", "data", 0))); tk.Cluster != "east" {
		t.Errorf("a task after east returned: placed on %q, want east (the first of a tie)", tk.Cluster)
	} else {
		s.waitTask(tk.ID, 2*time.Minute, "the task after the return to finish", func(tk api.Task) bool { return tk.Phase == "Succeeded" })
	}
}

// watchTaskPods watches env's task pods from now until the test ends and
// returns a function that tells each pod seen and the executor instance
// its label named, as the API server showed them.
func watchTaskPods(t *testing.T, env *clustertest.Env) func() map[string]string {
	t.Helper()
	pods := map[string]string{}
	var mu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	w, err := env.Client.CoreV1().Pods(env.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop(); cancel() })
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				mu.Lock()
				pods[p.Name] = p.Labels[task.LabelExecutor]
				mu.Unlock()
			}
		}
	}()
	return func() map[string]string {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(pods)
	}
}

// partitionProxy forwards TCP connections to target until cut: then it
// closes every open connection and every new one at once (a cluster
// that does not answer), until healed.
type partitionProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
}

func startPartitionProxy(t *testing.T, target string) *partitionProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partitionProxy{l: l, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { _ = l.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *partitionProxy) serve(c net.Conn) {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	_ = c.Close()
	_ = up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// setCut cuts (true) or heals (false) the link.
func (p *partitionProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			_ = c.Close()
		}
	}
}

// TestServeClusterUnreachable: east is reached through a link the test
// cuts (its executor instance then loses its Lease). After unreachableAfter
// the service shows east Unreachable and moves to west the task that waited
// in east's line without a pod, while the task whose pod runs on east
// stays there; once the link heals, east is Ready again and that task's
// outcome is recorded from its pod, which finished meanwhile. From the API
// server: each task ran once, the moved one under west's instance, and no
// pod is left.
func TestServeClusterUnreachable(t *testing.T) {
	env := clustertest.New(t)
	raw, err := os.ReadFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	server := regexp.MustCompile(`server: https://(127\.0\.0\.1:\d+)`).FindSubmatch(raw)
	if server == nil {
		t.Fatalf("no server address in %s", env.Kubeconfig)
	}
	proxy := startPartitionProxy(t, string(server[1]))
	eastKubeconfig := filepath.Join(t.TempDir(), "east.kubeconfig")
	if err := os.WriteFile(eastKubeconfig, regexp.MustCompile(`server: https://127\.0\.0\.1:\d+`).ReplaceAll(raw, []byte("server: https://"+proxy.l.Addr().String())), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	doc := fmt.Sprintf("parallelism: 1\nleaseDuration: 3s\nunreachableAfter: 3s\nclusters:\n- {name: east, kubeconfig: %q}\n- {name: west, kubeconfig: %q}\n", eastKubeconfig, env.Kubeconfig)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	seen := watchTaskPods(t, env)
	s := startService(t, env, "--config", cfg)
	instance := "serve-" + env.Namespace

	long := func(name, secs string) []byte {
		return []byte(strings.Replace(stepsTask(name, "data", 0), "for i in 1 2 3", "sleep "+secs+"; for i in 1 2 3", 1))
	}
	a := s.submit(long("a", "12")) // east (a tie: the first name)
	b := s.submit(long("b", "4"))  // west: east's one slot is taken
	c := s.submit(long("c", "1"))  // east's line: the lines tie, the first name
	if a.Cluster != "east" || b.Cluster != "west" || c.Cluster != "east" {
		t.Fatalf("placed on %s, %s, %s; want east, west, east", a.Cluster, b.Cluster, c.Cluster)
	}
	s.waitTask(a.ID, 2*time.Minute, "a to run on east", func(tk api.Task) bool { return tk.Phase == "Running" })

	proxy.setCut(true)
	eventually(t, time.Minute, "east to be Unreachable", func() bool {
		return regexp.MustCompile(`(?m)^east\s+Unreachable\s`).MatchString(s.ok("clusters"))
	})
	moved := s.waitTask(c.ID, 2*time.Minute, "c to be moved to west and finish", func(tk api.Task) bool { return tk.Terminal })
	if moved.Phase != "Succeeded" || moved.Cluster != "west" || len(moved.Attempts) != 1 || moved.Attempts[0].Cluster != "west" {
		t.Errorf("c: %s/%s on %q, attempts %+v; want Succeeded on west, one attempt", moved.Phase, moved.Reason, moved.Cluster, moved.Attempts)
	}
	if tk := s.get(a.ID); tk.Cluster != "east" || tk.Terminal || tk.Reason != "ClusterUnreachable" || !strings.Contains(tk.Message, "cluster east has not answered since") {
		t.Errorf("a, whose pod runs on east: on %q, terminal %v, %s %q; want it left on east, unfinished, ClusterUnreachable saying since when", tk.Cluster, tk.Terminal, tk.Reason, tk.Message)
	}

	proxy.setCut(false)
	eventually(t, time.Minute, "east to be Ready again", func() bool {
		return regexp.MustCompile(`(?m)^east\s+Ready\s`).MatchString(s.ok("clusters"))
	})
	for _, id := range []string{a.ID, b.ID} {
		tk := s.waitTask(id, 2*time.Minute, id+" to finish", func(tk api.Task) bool { return tk.Terminal })
		if tk.Phase != "Succeeded" || len(tk.Attempts) != 1 {
			t.Errorf("%s: %s/%s, attempts %+v; want Succeeded once", id, tk.Phase, tk.Reason, tk.Attempts)
		}
	}
	eventually(t, 2*time.Minute, "no task pod left", func() bool {
		list, err := env.Client.CoreV1().Pods(env.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		return err == nil && len(list.Items) == 0
	})
	pods := seen()
	for _, tk := range []api.Task{s.get(a.ID), s.get(b.ID), s.get(c.ID)} {
		if exec, want := pods[tk.Attempts[0].Pod], instance+"-"+tk.Attempts[0].Cluster; exec != want {
			t.Errorf("%s's pod %s: ran under %q, want %q", tk.Name, tk.Attempts[0].Pod, exec, want)
		}
	}
	if len(pods) != 3 {
		t.Errorf("the API server showed %d task pods, want 3, one per task: %v", len(pods), pods)
	}
}
