package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
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
