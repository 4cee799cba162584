package deploy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubetask/kubetask/internal/components"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/pkg/client"
)

// testImage is the name the kubetask image is loaded under.
const testImage = "kubetask.test/kubetask:e2e"

var (
	imageOnce sync.Once
	imageErr  error
)

// loadKubetaskImage builds the kubetask serve image as `make image` does
// (a static, stripped binary of this platform packaged by tools/image) and
// loads it into the shared cluster with `kubetask cluster load-image`, once
// per test binary.
func loadKubetaskImage(t *testing.T) {
	t.Helper()
	imageOnce.Do(func() { imageErr = buildAndLoadImage(t) })
	if imageErr != nil {
		t.Fatal(imageErr)
	}
}

func buildAndLoadImage(t *testing.T) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tools, err := components.FindToolsDir()
	if err != nil {
		return err
	}
	root := filepath.Dir(tools)
	dir := filepath.Join(filepath.Dir(clustertest.Cluster().Dir()), "image")
	platform := "linux/" + runtime.GOARCH
	bin := filepath.Join(dir, "bin", "kubetask")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/kubetask")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the image's kubetask: %w: %s", err, out)
	}
	name, tag, _ := strings.Cut(testImage, ":")
	img := exec.CommandContext(ctx, "go", "run", ".", "-binary", platform+"="+bin, "-version", tag, "-revision", "test",
		"-repository", name, "-platform", platform, "-epoch", "0", "-out", filepath.Join(dir, "out"))
	img.Dir = filepath.Join(tools, "image")
	out, err := img.CombinedOutput()
	if err != nil {
		return fmt.Errorf("tools/image: %w: %s", err, out)
	}
	t.Logf("tools/image:\n%s", out)
	c := clustertest.Cluster()
	load := exec.CommandContext(ctx, c.KubetaskBinary(), "cluster", "load-image", "--state-dir", c.Dir(), filepath.Join(dir, "out", "kubetask-image.tar"))
	if out, err := load.CombinedOutput(); err != nil || !strings.Contains(string(out), testImage) {
		return fmt.Errorf("kubetask cluster load-image: %w: %s", err, out)
	}
	return nil
}

// forwardTCP listens at addr and joins every connection to target (a TCP
// proxy), until the test ends; it returns the address it listens at.
func forwardTCP(t *testing.T, addr, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.DialTimeout("tcp", target, 10*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns[c], conns[u] = true, true
			mu.Unlock()
			for _, p := range [][2]net.Conn{{c, u}, {u, c}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _ = io.Copy(p[0], p[1])
					p[0].Close()
					p[1].Close()
				}()
			}
		}
	}()
	return ln.Addr().String()
}

// serviceCert makes a CA-signed-by-itself certificate for the Service's DNS
// names (what clients of the Service verify) and returns its PEM and key PEM.
func serviceCert(t *testing.T, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	return selfSigned(t, names, nil)
}

// readyEndpoints returns the addresses of the Service's ready endpoints.
func readyEndpoints(ctx context.Context, env *clustertest.Env, svc string) ([]string, error) {
	l, err := env.Client.DiscoveryV1().EndpointSlices(env.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{discoveryv1.LabelServiceName: svc}.String()})
	if err != nil {
		return nil, fmt.Errorf("listing the Service's EndpointSlices: %w", err)
	}
	var out []string
	for _, s := range l.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				out = append(out, e.Addresses...)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// The real Deployment of deploy/ (the default layout, with an overlay for the
// local cluster: the kubetask image built by tools/image and loaded with
// `kubetask cluster load-image`, the store Secret naming a test PostgreSQL
// that the pods reach at their gateway, a test certificate) runs on the
// local node: both replicas start from the image, each in a network of its
// own listening on :8443, become ready (their /readyz answers through the
// Service's endpoints) and join the group (membership Leases); a task with a
// sidecar, a file result and a captured log runs through an endpoint
// address; one replica pod is evicted (the PodDisruptionBudget allows one)
// and the other keeps the API answering and runs the next task; the
// Deployment brings a second replica back. No replica meets a Forbidden.
func TestDeploymentFromImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("pods of images need root on the local node (namespaces)")
	}
	env := clustertest.New(t)
	tasks := clustertest.New(t)
	loadKubetaskImage(t)
	d := deployOverlay(t, env, overlay{TaskNamespaces: []string{tasks.Namespace}, Image: testImage})
	callerToken := caller(t, env, d.suffix)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// The pods reach the host at their gateway: the first address of the
	// node's pod subnet. The test PostgreSQL listens on the host's loopback;
	// a forwarder at the gateway takes the pods to it.
	node, err := env.Client.CoreV1().Nodes().Get(ctx, clustertest.Cluster().LocalNodeNames()[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	subnet, err := netip.ParsePrefix(node.Spec.PodCIDR)
	if err != nil {
		t.Fatalf("the local node has no pod network (spec.podCIDR %q): pods of images cannot have addresses of their own", node.Spec.PodCIDR)
	}
	gateway := subnet.Masked().Addr().Next()
	dbURL, err := url.Parse(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	dbURL.Host = forwardTCP(t, net.JoinHostPort(gateway.String(), "0"), dbURL.Host)

	dep := into[appsv1.Deployment](t, find(t, d.objs, "Deployment", "kubetask"))
	svc := find(t, d.objs, "Service", "kubetask").GetName()
	tlsSecret := ""
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.Secret != nil && strings.HasPrefix(src.Secret.Name, "kubetask-tls") {
				tlsSecret = src.Secret.Name
			}
		}
	}
	if tlsSecret == "" {
		t.Fatal("the Deployment mounts no kubetask-tls Secret")
	}
	serverName := svc + "." + env.Namespace + ".svc"
	certPEM, keyPEM := serviceCert(t, serverName, svc+"."+env.Namespace)
	if _, err := env.Client.CoreV1().Secrets(env.Namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: tlsSecret},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := newApplier(t, env.Config)
	selector := labels.SelectorFromSet(dep.Spec.Selector.MatchLabels).String()
	created := time.Now()
	for _, o := range d.objs {
		switch o.GetKind() {
		case "Secret":
			if err := unstructuredSet(o, dbURL.String()+"\n", "stringData", "url"); err != nil {
				t.Fatal(err)
			}
		case "Deployment", "Service", "PodDisruptionBudget":
		default:
			continue // applied by deployOverlay, or the namespace
		}
		if _, err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// The replicas stop (SIGTERM) before the namespace goes.
		_ = env.Client.AppsV1().Deployments(env.Namespace).Delete(ctx, dep.Name, metav1.DeleteOptions{})
		_ = env.Client.CoreV1().Pods(env.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{
			LabelSelector: labels.SelectorFromSet(dep.Spec.Selector.MatchLabels).String()})
	})

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	httpc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}}}
	readyz := func(addr string) bool {
		resp, err := httpc.Get("https://" + net.JoinHostPort(addr, "8443") + "/readyz") //nolint:noctx // bounded by the client's timeout
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	endpoints := func() []string {
		t.Helper()
		eps, err := readyEndpoints(ctx, env, svc)
		if err != nil {
			t.Fatal(err)
		}
		return eps
	}
	starts := trackStarts(ctx, t, env, selector, readyz, func() []string {
		eps, _ := readyEndpoints(ctx, env, svc) // an error: none this time
		return eps
	})
	// Both replicas: Ready pods from the image, their addresses the Service's
	// endpoints, each answering /readyz 200 there.
	var eps []string
	eventually(t, 2*time.Minute, "two ready endpoints of the Service answering /readyz", func() bool {
		eps = endpoints()
		if len(eps) != 2 {
			return false
		}
		for _, ep := range eps {
			if !readyz(ep) {
				return false
			}
		}
		return true
	})
	t.Logf("Deployment applied to both replicas ready (their /readyz 200 at the Service's endpoints): %s", time.Since(created).Round(10*time.Millisecond))
	pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	byIP := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		byIP[p.Status.PodIP] = p
		if st := p.Status.ContainerStatuses; len(st) != 1 || st[0].Image != testImage || st[0].ImageID == "" {
			t.Errorf("pod %s: container statuses %+v, want the serve container from %s", p.Name, st, testImage)
		}
		if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !subnet.Contains(ip) {
			t.Errorf("pod %s: address %q not in the node's pod subnet %s", p.Name, p.Status.PodIP, subnet)
		}
	}
	for _, ep := range eps {
		if _, ok := byIP[ep]; !ok {
			t.Fatalf("endpoint %s is no pod of the Deployment (pods %v)", ep, byIP)
		}
	}
	members := func() []string {
		l, err := env.Client.CoordinationV1().Leases(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: replica.LabelGroup})
		if err != nil {
			t.Fatalf("listing the membership Leases: %v", err)
		}
		var names []string
		for _, le := range l.Items {
			names = append(names, le.Name)
		}
		return names
	}
	var before []string
	eventually(t, time.Minute, "both replicas' membership Leases", func() bool { before = members(); return len(before) == 2 })

	clientAt := func(addr string) *client.Client {
		c, err := client.New("https://"+net.JoinHostPort(addr, "8443"), client.WithToken(callerToken),
			client.WithHTTPClient(&http.Client{Transport: httpc.Transport}))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	runSidecarTask(ctx, t, clientAt(eps[0]), tasks.Namespace)

	// Evict the replica that ran nothing for the test: the budget allows one
	// disruption; the other keeps answering all along and runs the next task.
	gone, kept := byIP[eps[1]], eps[0]
	var unanswered atomic.Int32
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-watchCtx.Done():
				return
			case <-tick.C:
				if !readyz(kept) {
					unanswered.Add(1)
				}
			}
		}
	}()
	eventually(t, time.Minute, "the PodDisruptionBudget to allow evicting one replica", func() bool {
		err := env.Client.PolicyV1().Evictions(env.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: gone.Name, Namespace: env.Namespace}})
		return err == nil
	})
	eventually(t, time.Minute, "the evicted replica's pod to be gone", func() bool {
		_, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, gone.Name, metav1.GetOptions{})
		return err != nil
	})
	// The evicted replica deleted its own membership Lease on SIGTERM
	// (handing its shards over); the other's is there.
	if left := slices.DeleteFunc(members(), func(n string) bool { return !slices.Contains(before, n) }); len(left) != 1 {
		t.Errorf("membership Leases of the first two replicas after one was evicted: %v, want one (the evicted replica deletes its own)", left)
	}
	runSidecarTask(ctx, t, clientAt(kept), tasks.Namespace)
	eventually(t, 2*time.Minute, "the Deployment's second replica back at the Service's endpoints", func() bool {
		eps = endpoints()
		return len(eps) == 2 && slices.Contains(eps, kept) && !slices.Contains(eps, gone.Status.PodIP) && readyz(eps[0]) && readyz(eps[1])
	})
	stopWatch()
	<-watched
	for _, st := range starts() {
		t.Logf("replica %s: created to /readyz 200 at its address in %s, to the Service's ready endpoints in %s", st.pod, st.ready.Round(10*time.Millisecond), st.endpoint.Round(10*time.Millisecond))
	}
	if n := unanswered.Load(); n > 0 {
		t.Errorf("the remaining replica at %s did not answer /readyz %d times while the other was evicted", kept, n)
	}

	pods, err = env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		b, err := env.Client.CoreV1().Pods(env.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "serve"}).DoRaw(ctx)
		if err != nil {
			t.Errorf("logs of %s: %v", p.Name, err)
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(strings.ToLower(line), "forbidden") {
				t.Errorf("%s met a permission it does not have: %s", p.Name, line)
			}
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", p.Name, b)
		}
	}
}

// start is how long a replica took from its pod's creation (as the test saw
// it, polling every 50 ms) to its first /readyz 200 at its address (serve is
// ready), and to its address among the Service's ready endpoints (the
// node's readiness probe passed).
type start struct {
	pod             string
	ready, endpoint time.Duration
}

// trackStarts polls the pods of selector until ctx or the test ends and
// returns a function that lists the starts seen so far, in order.
func trackStarts(ctx context.Context, t *testing.T, env *clustertest.Env, selector string, ready func(addr string) bool, endpoints func() []string) func() []start {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var done []start
	seen := map[string]time.Time{}
	readyAfter := map[string]time.Duration{}
	stopped := make(chan struct{})
	t.Cleanup(func() { cancel(); <-stopped })
	go func() {
		defer close(stopped)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				continue
			}
			eps := endpoints()
			for _, p := range pods.Items {
				first, ok := seen[p.Name]
				if !ok {
					seen[p.Name] = time.Now()
					continue
				}
				if first.IsZero() || p.Status.PodIP == "" {
					continue
				}
				if _, ok := readyAfter[p.Name]; !ok && ready(p.Status.PodIP) {
					readyAfter[p.Name] = time.Since(first)
				}
				if r, ok := readyAfter[p.Name]; ok && slices.Contains(eps, p.Status.PodIP) {
					mu.Lock()
					done = append(done, start{pod: p.Name, ready: r, endpoint: time.Since(first)})
					mu.Unlock()
					seen[p.Name] = time.Time{} // counted
				}
			}
		}
	}()
	return func() []start {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(done)
	}
}

// unstructuredSet sets a string field of o.
func unstructuredSet(o interface {
	UnstructuredContent() map[string]any
}, value string, fields ...string) error {
	m := o.UnstructuredContent()
	for _, f := range fields[:len(fields)-1] {
		next, ok := m[f].(map[string]any)
		if !ok {
			return fmt.Errorf("no field %s", strings.Join(fields, "."))
		}
		m = next
	}
	m[fields[len(fields)-1]] = value
	return nil
}
