package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// BenchmarkLocalNodeCapacity runs KUBETASK_BENCH_PODS (default 200) pods with two
// sleeping containers each on one `kubetask node run` process and reports the node
// process's memory and CPU:
//
//	go test ./test/integration/cluster -run '^$' -bench LocalNodeCapacity -benchtime 1x
func BenchmarkLocalNodeCapacity(b *testing.B) {
	env := clustertest.New(b)
	ctx := context.Background()
	n := 200
	if v, err := strconv.Atoi(os.Getenv("KUBETASK_BENCH_PODS")); err == nil && v > 0 {
		n = v
	}
	bin, err := clustertest.BuildKubetask(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	name := "bench-" + strings.ToLower(strconv.FormatInt(time.Now().UnixNano()%100000, 36))
	cmd := exec.Command(bin, "node", "run", "--kubeconfig", env.Kubeconfig, "--name", name, "--dir", b.TempDir())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		_ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	pid := cmd.Process.Pid
	pollB(b, time.Minute, "node Ready", func() bool {
		node, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && nodeReady(node)
	})
	grace := int64(1)
	b.ResetTimer()
	for iter := 0; iter < b.N; iter++ {
		cpu0 := cpuSeconds(b, pid)
		start := time.Now()
		for i := 0; i < n; i++ {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d-%d", iter, i), Namespace: env.Namespace, Labels: map[string]string{"bench": "capacity"}},
				Spec: corev1.PodSpec{
					NodeName:                      name,
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: &grace,
					Containers: []corev1.Container{
						{Name: "a", Image: "busybox", Command: []string{"sleep", "3600"}},
						{Name: "b", Image: "busybox", Command: []string{"sleep", "3600"}},
					},
				},
			}
			if _, err := env.Client.CoreV1().Pods(env.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		pollB(b, 5*time.Minute, "all pods Running", func() bool {
			list, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "bench=capacity"})
			if err != nil {
				return false
			}
			ready := 0
			for i := range list.Items {
				if condition(&list.Items[i], corev1.ContainersReady) == corev1.ConditionTrue {
					ready++
				}
			}
			return ready == n
		})
		startup := time.Since(start)
		cpuStart := cpuSeconds(b, pid) - cpu0
		// Steady state: the node only heartbeats while its containers sleep.
		cpu1, t1 := cpuSeconds(b, pid), time.Now()
		<-time.After(10 * time.Second) // measurement window, not a wait for a condition
		steady := (cpuSeconds(b, pid) - cpu1) / time.Since(t1).Seconds() * 100
		rss := rssMiB(b, pid)
		b.ReportMetric(float64(n), "pods")
		b.ReportMetric(startup.Seconds(), "s-to-all-running")
		b.ReportMetric(cpuStart, "node-cpu-s-startup")
		b.ReportMetric(steady, "node-cpu-%-steady")
		b.ReportMetric(rss, "node-rss-MiB")
		b.Logf("%d pods (%d processes) Running in %v; node RSS %.1f MiB, CPU %.2fs during start-up, %.2f%% at steady state",
			n, 2*n, startup.Round(time.Millisecond), rss, cpuStart, steady)

		delStart := time.Now()
		if err := env.Client.CoreV1().Pods(env.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "bench=capacity"}); err != nil {
			b.Fatal(err)
		}
		pollB(b, 5*time.Minute, "all pods deleted", func() bool {
			list, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "bench=capacity"})
			return err == nil && len(list.Items) == 0
		})
		b.ReportMetric(time.Since(delStart).Seconds(), "s-to-all-deleted")
	}
}

func pollB(b *testing.B, timeout time.Duration, what string, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond) // poll interval of a condition with a deadline
	}
}

// cpuSeconds is the user+system CPU time of a process.
func cpuSeconds(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

func rssMiB(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
