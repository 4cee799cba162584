package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/container"
	"github.com/kubetask/kubetask/internal/imagestore"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localnode"
	"github.com/kubetask/kubetask/internal/podnet"
)

// BenchmarkLocalNodeImageStart measures how long a pod takes from create to
// Succeeded on the shared cluster's local node (kubetask node run) when it runs
// from a loaded image (overlay root, pivot_root, the image's user), against the
// baseline of the same static probe run as a host process, pods of the two
// kinds alternating one at a time; KUBETASK_BENCH_PODS (default 20) of each:
//
//	go test ./test/integration/cluster -run '^$' -bench LocalNodeImageStart -benchtime 1x
func BenchmarkLocalNodeImageStart(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("running images needs root")
	}
	n := 20
	if v, err := strconv.Atoi(os.Getenv("KUBETASK_BENCH_PODS")); err == nil && v > 0 {
		n = v
	}
	probe, _ := loadProbeImage(b, "kubetask.test/probe:bench")
	b.ResetTimer()
	for range b.N {
		image, host := measureImageStart(b, probe, "kubetask.test/probe:bench", n)
		b.ReportMetric(ms(image), "ms-image-median")
		b.ReportMetric(ms(host), "ms-host-median")
		b.ReportMetric(float64(image)/float64(host), "image/host")
		b.Logf("%d pods each: create to Succeeded, median %v from the loaded image, %v as a host process (ratio %.2f)",
			n, image.Round(time.Millisecond), host.Round(time.Millisecond), float64(image)/float64(host))
	}
}

// TestLocalNodeImageStartTiny runs BenchmarkLocalNodeImageStart's measurement
// with two pods of each kind, so that it cannot rot; it asserts no timing.
func TestLocalNodeImageStartTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running images needs root")
	}
	probe, _ := loadProbeImage(t, "kubetask.test/probe:tiny")
	image, host := measureImageStart(t, probe, "kubetask.test/probe:tiny", 2)
	t.Logf("median create to Succeeded: %v from the image, %v as a host process", image, host)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// measureImageStart creates n pods from the loaded image ref and n host-process
// pods running the probe at its host path, alternating, each waited for until
// Succeeded, and returns the median create-to-Succeeded time of each kind.
func measureImageStart(tb testing.TB, probe, ref string, n int) (image, host time.Duration) {
	tb.Helper()
	env := clustertest.New(tb)
	node := clustertest.Cluster().LocalNodeNames()[0]
	ctx := context.Background()
	pods := env.Client.CoreV1().Pods(env.Namespace)
	grace := int64(1)
	run := func(name string, c corev1.Container) time.Duration {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: env.Namespace},
			Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{c}},
		}
		start := time.Now()
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			tb.Fatal(err)
		}
		deadline := start.Add(time.Minute)
		for {
			got, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err == nil && got.Status.Phase == corev1.PodSucceeded {
				return time.Since(start)
			}
			if err == nil && got.Status.Phase == corev1.PodFailed {
				tb.Fatalf("pod %s failed: %+v", name, got.Status)
			}
			if time.Now().After(deadline) {
				tb.Fatalf("pod %s: not Succeeded after a minute (last error %v)", name, err)
			}
			time.Sleep(10 * time.Millisecond) // poll interval of a condition with a deadline
		}
	}
	var images, hosts []time.Duration
	for i := range n {
		images = append(images, run(fmt.Sprintf("image-%d", i), corev1.Container{Name: "main", Image: ref}))
		hosts = append(hosts, run(fmt.Sprintf("host-%d", i), corev1.Container{Name: "main", Image: "busybox", Command: []string{probe}}))
	}
	return median(images), median(hosts)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkLocalNodeRuncStart sets what a pod from a loaded image costs under
// runc beside what runc itself costs, all in one run, alternating one at a
// time so that the machine's load falls on each alike
// (KUBETASK_BENCH_PODS, default 20, of each):
//
//   - runc alone: `runc run --keep` and `runc delete --force` of a bundle
//     whose root is a copy of the image's root file system, with no kubetask
//     process in between: once with `runc spec`'s minimal config
//     (runc-minimal), once with the very config.json a runc node wrote for
//     one of its pods (runc-node-spec: the default seccomp profile, masked
//     paths, a cgroup, the pod's mounts);
//   - the node's own init alone: container.Start of the image's command
//     with the init, to its end, no node (init-alone);
//   - a pod from the image, create to Succeeded through the API server, on a
//     local node of this test binary with runc (pod-runc) and on one with the
//     node's own init (pod-init), otherwise alike.
//
// pod-extra/alone-extra is (pod-runc − pod-init) / (runc-node-spec −
// init-alone): what a pod pays for runc over the init, against what runc
// alone costs over the init alone for the same spec; at or below 1, the node
// adds nothing to runc's own cost. runc alone includes `runc delete`, which
// the node runs after a container's result (as containerd and the kubelet
// do), not on the pod's path.
//
//	go test ./test/integration/cluster -run '^$' -bench LocalNodeRuncStart -benchtime 1x
func BenchmarkLocalNodeRuncStart(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("running images needs root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		b.Skip("runc is not installed")
	}
	n := 20
	if v, err := strconv.Atoi(os.Getenv("KUBETASK_BENCH_PODS")); err == nil && v > 0 {
		n = v
	}
	_, _ = loadProbeImage(b, "kubetask.test/probe:bench")
	b.ResetTimer()
	for range b.N {
		m := measureRuncStart(b, "kubetask.test/probe:bench", n)
		b.ReportMetric(ms(m.runcMinimal), "ms-runc-minimal")
		b.ReportMetric(ms(m.runcSpec), "ms-runc-node-spec")
		b.ReportMetric(ms(m.runcPodNet), "ms-runc-pod-net")
		b.ReportMetric(ms(m.runcOverlay), "ms-runc-overlay")
		b.ReportMetric(ms(m.runcAsNode), "ms-runc-as-node")
		b.ReportMetric(ms(m.runcAsNodePath), "ms-runc-as-node-path")
		b.ReportMetric(ms(m.initAlone), "ms-init-alone")
		b.ReportMetric(ms(m.podRunc), "ms-pod-runc")
		b.ReportMetric(ms(m.podInit), "ms-pod-init")
		b.ReportMetric(float64(m.podRunc)/float64(m.podInit), "pod-runc/pod-init")
		podExtra, aloneExtra := m.podRunc-m.podInit, m.runcSpec-m.initAlone
		b.ReportMetric(float64(podExtra)/float64(aloneExtra), "pod-extra/alone-extra")
		b.ReportMetric(float64(podExtra)/float64(m.runcAsNode-m.initAlone), "pod-extra/as-node-extra")
		b.ReportMetric(float64(podExtra)/float64(m.runcAsNodePath-m.initAlone), "pod-extra/as-node-path-extra")
		r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
		b.Logf("%d of each, medians: runc alone %v (minimal config), %v (the node's config); the init alone %v; a pod from the image, create to Succeeded, %v with runc, %v with the init (ratio %.2f); a pod's extra for runc %v against runc alone's extra over the init alone %v (ratio %.2f)",
			n, r(m.runcMinimal), r(m.runcSpec), r(m.initAlone), r(m.podRunc), r(m.podInit), float64(m.podRunc)/float64(m.podInit), r(podExtra), r(aloneExtra), float64(podExtra)/float64(aloneExtra))
		b.Logf("runc alone with the node's config: %v in a new network namespace, %v in a pod's (made before, as the node makes it), %v on an overlay of the image (mounted before, unmounted after, as the node does), %v with both (as the node runs it), of which %v until the overlay is unmounted (what a pod waits for: not runc delete); a pod's extra for runc %v against that run's extra over the init alone %v (ratio %.2f), %v without its delete (ratio %.2f)",
			r(m.runcSpec), r(m.runcPodNet), r(m.runcOverlay), r(m.runcAsNode), r(m.runcAsNodePath),
			r(podExtra), r(m.runcAsNode-m.initAlone), float64(podExtra)/float64(m.runcAsNode-m.initAlone),
			r(m.runcAsNodePath-m.initAlone), float64(podExtra)/float64(m.runcAsNodePath-m.initAlone))
	}
}

// TestLocalNodeRuncStartTiny runs BenchmarkLocalNodeRuncStart's measurement
// with two of each, so that it cannot rot; it asserts no timing.
func TestLocalNodeRuncStartTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running images needs root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed")
	}
	_, _ = loadProbeImage(t, "kubetask.test/probe:tiny")
	m := measureRuncStart(t, "kubetask.test/probe:tiny", 2)
	t.Logf("medians: runc alone %v (minimal), %v (the node's config), %v (in a pod's network), %v (on an overlay), %v (both); the init alone %v; pod %v with runc, %v with the init",
		m.runcMinimal, m.runcSpec, m.runcPodNet, m.runcOverlay, m.runcAsNode, m.initAlone, m.podRunc, m.podInit)
	for name, d := range map[string]time.Duration{"pod network": m.runcPodNet, "overlay": m.runcOverlay, "both": m.runcAsNode} {
		if d <= 0 {
			t.Errorf("runc alone (%s) measured nothing", name)
		}
	}
}

// runcStart is what measureRuncStart measured: medians.
type runcStart struct {
	runcMinimal, runcSpec, initAlone, podRunc, podInit time.Duration
	// runc alone with the node's config in a pod's network namespace, on
	// an overlay of the image, and with both: where a pod's runc differs
	// from runc alone.
	runcPodNet, runcOverlay, runcAsNode time.Duration
	// runcAsNodePath is runcAsNode until the overlay is unmounted: what a
	// pod waits for (the node deletes the container after the result).
	runcAsNodePath time.Duration
}

// measureRuncStart starts two local nodes in this binary on the shared
// cluster's image store, one with each runtime, and measures, n times each
// and alternating, runc alone on the image's root file system (a minimal
// config and the config the runc node wrote for its first pod), the init
// alone on the image, and a pod of the image ref on each node.
func measureRuncStart(tb testing.TB, ref string, n int) runcStart {
	tb.Helper()
	env := clustertest.New(tb)
	suffix := strings.ToLower(strconv.FormatInt(time.Now().UnixNano()%1e6, 36))
	initNode, runcNode := "bench-init-"+suffix, "bench-runc-"+suffix
	startRuntimeNode(tb, env, initNode, "init")
	runcDir := startRuntimeNode(tb, env, runcNode, "runc")
	ctx := context.Background()
	pods := env.Client.CoreV1().Pods(env.Namespace)
	grace := int64(1)
	run := func(name, node string) time.Duration {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: env.Namespace},
			Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{Name: "main", Image: ref}}},
		}
		// Watched, not polled: a GET every few milliseconds would load the
		// API server and etcd while the container starts, and the more the
		// longer the start.
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		start := time.Now()
		created, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		w, err := pods.Watch(wctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: created.ResourceVersion})
		if err != nil {
			tb.Fatal(err)
		}
		defer w.Stop()
		for ev := range w.ResultChan() {
			got, ok := ev.Object.(*corev1.Pod)
			if !ok {
				tb.Fatalf("pod %s: watch event %s %T", name, ev.Type, ev.Object)
			}
			switch got.Status.Phase {
			case corev1.PodSucceeded:
				return time.Since(start)
			case corev1.PodFailed:
				tb.Fatalf("pod %s failed: %+v", name, got.Status)
			}
		}
		tb.Fatalf("pod %s: not Succeeded after a minute (%v)", name, wctx.Err())
		return 0
	}
	// A first pod on the runc node, not measured: it starts the node's
	// watcher of runc's root, and its bundle's config is the node's spec.
	run("runc-warm", runcNode)
	img, err := imagestore.New(clustertest.Cluster().ImageDir()).Lookup(ref)
	if err != nil {
		tb.Fatal(err)
	}
	direct := newDirectRunc(tb, img.Rootfs, runcDir)
	direct.podNet(tb)
	initTmp := tb.TempDir()
	initAlone := func(i int) time.Duration {
		start := time.Now()
		p, err := container.Start(ctx, container.Spec{
			Command: append(img.Config.Entrypoint, img.Config.Cmd...), Env: img.Config.Env, WorkingDir: img.Config.WorkingDir,
			LogPath:   filepath.Join(initTmp, fmt.Sprintf("%d.log", i)),
			Rootfs:    &container.Rootfs{Image: img.Rootfs, State: filepath.Join(initTmp, strconv.Itoa(i))},
			Isolation: container.IsolationNamespaces,
		})
		if err != nil {
			tb.Fatalf("the init alone: %v", err)
		}
		if res := p.Result(); res.ExitCode != 0 {
			tb.Fatalf("the init alone: %+v", res)
		}
		return time.Since(start)
	}
	var m [9][]time.Duration
	for i := range n {
		m[0] = append(m[0], direct.run(tb, direct.minimal))
		m[1] = append(m[1], direct.run(tb, direct.nodeSpec))
		m[2] = append(m[2], initAlone(i))
		m[3] = append(m[3], run(fmt.Sprintf("runc-%d", i), runcNode))
		m[4] = append(m[4], run(fmt.Sprintf("init-%d", i), initNode))
		m[5] = append(m[5], direct.run(tb, direct.podNetSpec))
		overlay, _ := direct.runOverlay(tb, direct.overlaySpec)
		m[6] = append(m[6], overlay)
		asNode, path := direct.runOverlay(tb, direct.asNodeSpec)
		m[7] = append(m[7], asNode)
		m[8] = append(m[8], path)
	}
	return runcStart{runcMinimal: median(m[0]), runcSpec: median(m[1]), initAlone: median(m[2]), podRunc: median(m[3]), podInit: median(m[4]),
		runcPodNet: median(m[5]), runcOverlay: median(m[6]), runcAsNode: median(m[7]), runcAsNodePath: median(m[8])}
}

// directRunc runs runc by itself on bundles of a copy of an image's root
// file system.
type directRunc struct {
	runc, root        string // runc's binary and its state directory
	minimal, nodeSpec string // the two bundles
	n                 int
	// The node's config in a pod's network namespace (podNet), on an
	// overlay of the image mounted at each run (runOverlay), and both.
	podNetSpec, overlaySpec, asNodeSpec string
	lower                               string // the image's root: the overlay's lower layer
	nodeConfig                          string // the node's config, as newDirectRunc edited it
}

// newDirectRunc makes two bundles whose root is a copy of rootfs: one with
// `runc spec`'s config (its command the probe's, no terminal), one with the
// config.json a runc node wrote under nodeDir for one of its pods (its
// mounts, still there while the pod is; root, cgroup and a new network
// namespace of the bundle's own).
func newDirectRunc(tb testing.TB, rootfs, nodeDir string) *directRunc {
	tb.Helper()
	path, err := exec.LookPath("runc")
	if err != nil {
		tb.Fatal(err)
	}
	tmp := tb.TempDir()
	d := &directRunc{runc: path, root: filepath.Join(tmp, "state"), minimal: filepath.Join(tmp, "minimal"), nodeSpec: filepath.Join(tmp, "node-spec"), lower: rootfs}
	var nodeConfig string
	_ = filepath.WalkDir(filepath.Join(nodeDir, "pods"), func(p string, e fs.DirEntry, err error) error {
		if err == nil && nodeConfig == "" && e.Name() == "config.json" && filepath.Base(filepath.Dir(p)) == "bundle" {
			nodeConfig = p
		}
		return nil
	})
	if nodeConfig == "" {
		tb.Fatalf("no bundle config.json under %s", nodeDir)
	}
	for _, bundle := range []string{d.minimal, d.nodeSpec} {
		root := filepath.Join(bundle, "rootfs")
		if err := os.MkdirAll(bundle, 0o755); err != nil {
			tb.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", rootfs, root).CombinedOutput(); err != nil {
			tb.Fatalf("copy the image's root: %v: %s", err, out)
		}
	}
	if out, err := exec.Command(path, "spec", "--bundle", d.minimal).CombinedOutput(); err != nil {
		tb.Fatalf("runc spec: %v: %s", err, out)
	}
	edit := func(file string, change func(s *specs.Spec)) {
		b, err := os.ReadFile(file)
		if err != nil {
			tb.Fatal(err)
		}
		var s specs.Spec
		if err := json.Unmarshal(b, &s); err != nil {
			tb.Fatal(err)
		}
		change(&s)
		if b, err = json.Marshal(&s); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(filepath.Dir(file), "config.json"), b, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	edit(filepath.Join(d.minimal, "config.json"), func(s *specs.Spec) {
		s.Process.Terminal = false
		s.Process.Args = []string{"/bin/probe", "/etc/only-in-image"}
		s.Root.Path = filepath.Join(d.minimal, "rootfs")
	})
	b, err := os.ReadFile(nodeConfig)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.nodeSpec, "node-config.json"), b, 0o600); err != nil {
		tb.Fatal(err)
	}
	edit(filepath.Join(d.nodeSpec, "node-config.json"), func(s *specs.Spec) {
		s.Root.Path = filepath.Join(d.nodeSpec, "rootfs")
		for i, ns := range s.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace {
				s.Linux.Namespaces[i].Path = "" // the pod's is gone; a new one, as runc spec's
			}
		}
	})
	d.nodeConfig = filepath.Join(d.nodeSpec, "config.json")
	return d
}

// podNet makes the bundles of the node's config in a pod's network: a
// sandbox of a pod network of its own (namespace, veth on a bridge,
// address, routes: what the node makes before it starts a pod's
// containers), joined by path as the node's config joins the pod's; and on
// an overlay of the image, mounted by runOverlay at the bundle's "merged".
func (d *directRunc) podNet(tb testing.TB) {
	tb.Helper()
	net, err := podnet.Setup(podnet.Config{Bridge: podnet.BridgeName(tb.TempDir())})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = net.Close() })
	sb, err := net.NewSandbox("bench-runc")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(sb.Close)
	netns := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), sb.NetNS().Fd())
	tmp := tb.TempDir()
	d.podNetSpec, d.overlaySpec, d.asNodeSpec = filepath.Join(tmp, "pod-net"), filepath.Join(tmp, "overlay"), filepath.Join(tmp, "as-node")
	for _, v := range []struct {
		bundle         string
		inPod, overlay bool
	}{{d.podNetSpec, true, false}, {d.overlaySpec, false, true}, {d.asNodeSpec, true, true}} {
		if err := os.MkdirAll(filepath.Join(v.bundle, "merged"), 0o755); err != nil {
			tb.Fatal(err)
		}
		b, err := os.ReadFile(d.nodeConfig)
		if err != nil {
			tb.Fatal(err)
		}
		var s specs.Spec
		if err := json.Unmarshal(b, &s); err != nil {
			tb.Fatal(err)
		}
		if v.overlay {
			s.Root.Path = filepath.Join(v.bundle, "merged")
		}
		if v.inPod {
			for i, ns := range s.Linux.Namespaces {
				if ns.Type == specs.NetworkNamespace {
					s.Linux.Namespaces[i].Path = netns
				}
			}
		}
		if b, err = json.Marshal(&s); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(v.bundle, "config.json"), b, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
}

// runOverlay mounts a fresh overlay of the image at the bundle's "merged"
// (volatile, as the node mounts it), runs the bundle as run does, and
// unmounts it after runc's run and before its delete, as the node unmounts
// before it reports the result and deletes after. It returns how long the
// whole took, and how long until the overlay was unmounted.
func (d *directRunc) runOverlay(tb testing.TB, bundle string) (all, path time.Duration) {
	tb.Helper()
	layer := filepath.Join(bundle, "layer-"+strconv.Itoa(d.n+1))
	upper, work, merged := filepath.Join(layer, "upper"), filepath.Join(layer, "work"), filepath.Join(bundle, "merged")
	start := time.Now()
	for _, dir := range []string{upper, work} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+d.lower+",upperdir="+upper+",workdir="+work+",volatile"); err != nil {
		tb.Fatalf("mount the overlay: %v", err)
	}
	d.runThen(tb, bundle, func() {
		if err := unix.Unmount(merged, 0); err != nil {
			tb.Fatalf("unmount the overlay: %v", err)
		}
		path = time.Since(start)
	})
	all = time.Since(start)
	_ = os.RemoveAll(layer)
	return all, path
}

// run runs the bundle's command to its end with `runc run --keep` and
// removes the container with `runc delete --force` (as the node does), and
// returns how long the two took.
func (d *directRunc) run(tb testing.TB, bundle string) time.Duration {
	tb.Helper()
	return d.runThen(tb, bundle, nil)
}

// runThen is run with afterRun, when set, called between runc's run and
// its delete (whether the run failed or not).
func (d *directRunc) runThen(tb testing.TB, bundle string, afterRun func()) time.Duration {
	tb.Helper()
	d.n++
	id := fmt.Sprintf("direct-%d", d.n)
	start := time.Now()
	out, err := exec.Command(d.runc, "--root", d.root, "run", "--keep", "--bundle", bundle, id).CombinedOutput() //nolint:gosec // the test's runc
	if afterRun != nil {
		afterRun()
	}
	if err != nil {
		tb.Fatalf("runc run %s: %v: %s", bundle, err, out)
	}
	if out, err := exec.Command(d.runc, "--root", d.root, "delete", "--force", id).CombinedOutput(); err != nil { //nolint:gosec // the test's runc
		tb.Fatalf("runc delete %s: %v: %s", id, err, out)
	}
	return time.Since(start)
}

// startRuntimeNode runs a local node in this binary with the given runtime
// on the shared cluster's image store until the test ends, and returns its
// directory.
func startRuntimeNode(tb testing.TB, env *clustertest.Env, name, runtime string) string {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	dir := tb.TempDir()
	go func() {
		done <- localnode.Run(ctx, localnode.Config{
			NodeName:   name,
			Kubeconfig: env.Kubeconfig,
			Dir:        dir,
			ImageDir:   clustertest.Cluster().ImageDir(),
			Runtime:    runtime,
			Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
		_ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case err := <-done:
			tb.Fatalf("node %s exited: %v", name, err)
		default:
		}
		n, err := env.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					// The node names what runs its containers, as a kubelet
					// names containerd (kubectl get nodes -o wide).
					want := map[string]string{"runc": "runc://", "init": "kubetask-init://"}[runtime]
					if got := n.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(got, want) || got == "runc://unknown" {
						tb.Errorf("node %s (runtime %s) reports container runtime %q, want %s<version>", name, runtime, got, want)
					}
					return dir
				}
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("node %s not Ready after a minute", name)
		}
		time.Sleep(20 * time.Millisecond) // poll interval of a condition with a deadline
	}
}
