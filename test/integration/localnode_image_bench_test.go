package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localnode"
)

// BenchmarkLocalNodeImageStart measures how long a pod takes from create to
// Succeeded on the shared cluster's local node (kubetask node run) when it runs
// from a loaded image (overlay root, pivot_root, the image's user), against the
// baseline of the same static probe run as a host process, pods of the two
// kinds alternating one at a time; KUBETASK_BENCH_PODS (default 20) of each:
//
//	go test ./test/integration -run '^$' -bench LocalNodeImageStart -benchtime 1x
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

// BenchmarkLocalNodeRuncStart measures create to Succeeded of a pod from a
// loaded image on two local nodes of this test binary that differ only in
// their runtime: the node's own init and runc (localnode.Config.Runtime),
// pods of the two alternating one at a time; KUBETASK_BENCH_PODS (default
// 20) of each:
//
//	go test ./test/integration -run '^$' -bench LocalNodeRuncStart -benchtime 1x
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
		initT, runcT := measureRuncStart(b, "kubetask.test/probe:bench", n)
		b.ReportMetric(ms(initT), "ms-init-median")
		b.ReportMetric(ms(runcT), "ms-runc-median")
		b.ReportMetric(float64(runcT)/float64(initT), "runc/init")
		b.Logf("%d pods each: create to Succeeded from the image, median %v with the node's init, %v with runc (ratio %.2f)",
			n, initT.Round(time.Millisecond), runcT.Round(time.Millisecond), float64(runcT)/float64(initT))
	}
}

// TestLocalNodeRuncStartTiny runs BenchmarkLocalNodeRuncStart's measurement
// with two pods of each kind, so that it cannot rot; it asserts no timing.
func TestLocalNodeRuncStartTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running images needs root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed")
	}
	_, _ = loadProbeImage(t, "kubetask.test/probe:tiny")
	initT, runcT := measureRuncStart(t, "kubetask.test/probe:tiny", 2)
	t.Logf("median create to Succeeded from the image: %v with the node's init, %v with runc", initT, runcT)
}

// measureRuncStart starts two local nodes in this binary on the shared
// cluster's image store, one with each runtime, and runs n pods of the image
// ref on each, alternating; it returns the median create-to-Succeeded time
// of each.
func measureRuncStart(tb testing.TB, ref string, n int) (initT, runcT time.Duration) {
	tb.Helper()
	env := clustertest.New(tb)
	suffix := strings.ToLower(strconv.FormatInt(time.Now().UnixNano()%1e6, 36))
	initNode, runcNode := "bench-init-"+suffix, "bench-runc-"+suffix
	startRuntimeNode(tb, env, initNode, "init")
	startRuntimeNode(tb, env, runcNode, "runc")
	ctx := context.Background()
	pods := env.Client.CoreV1().Pods(env.Namespace)
	grace := int64(1)
	run := func(name, node string) time.Duration {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: env.Namespace},
			Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{Name: "main", Image: ref}}},
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
	var inits, runcs []time.Duration
	for i := range n {
		inits = append(inits, run(fmt.Sprintf("init-%d", i), initNode))
		runcs = append(runcs, run(fmt.Sprintf("runc-%d", i), runcNode))
	}
	return median(inits), median(runcs)
}

// startRuntimeNode runs a local node in this binary with the given runtime
// on the shared cluster's image store until the test ends.
func startRuntimeNode(tb testing.TB, env *clustertest.Env, name, runtime string) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- localnode.Run(ctx, localnode.Config{
			NodeName:   name,
			Kubeconfig: env.Kubeconfig,
			Dir:        tb.TempDir(),
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
					return
				}
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("node %s not Ready after a minute", name)
		}
		time.Sleep(20 * time.Millisecond) // poll interval of a condition with a deadline
	}
}
