package sim

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

const (
	benchNodes = 10
	benchPods  = 1000
)

// BenchmarkPodsRunning measures how long 1,000 pods take from the first
// create to all Running on 10 simulated nodes, through the real scheduler.
// Run it with: go test ./test/integration/sim/ -run '^$' -bench PodsRunning -benchtime 1x
func BenchmarkPodsRunning(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := clustertest.Cluster()
	if have := len(c.SimNodeNames()); have < benchNodes {
		if err := c.AddSimNodes(ctx, benchNodes-have); err != nil {
			b.Fatalf("adding simulated nodes: %v", err)
		}
	}
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		env := clustertest.New(b)
		pods := env.Client.CoreV1().Pods(env.Namespace)
		b.StartTimer()

		start := time.Now()
		names := make(chan string)
		errs := make(chan error, benchPods)
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for name := range names {
					if _, err := pods.Create(ctx, simPod(name, nil, "main"), metav1.CreateOptions{}); err != nil {
						errs <- fmt.Errorf("creating %s: %w", name, err)
					}
				}
			}()
		}
		for p := 0; p < benchPods; p++ {
			names <- fmt.Sprintf("bench-%d", p)
		}
		close(names)
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		created := time.Since(start)

		for {
			list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "status.phase=" + string(corev1.PodRunning), ResourceVersion: "0"})
			if err != nil {
				b.Fatalf("listing pods: %v", err)
			}
			if len(list.Items) == benchPods {
				break
			}
			select {
			case <-ctx.Done():
				b.Fatalf("%d of %d pods Running when the deadline passed", len(list.Items), benchPods)
			case <-time.After(100 * time.Millisecond):
			}
		}
		took := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(benchPods)/took.Seconds(), "pods/s")
		b.ReportMetric(created.Seconds(), "create-s")
		b.ReportMetric(took.Seconds(), "all-running-s")
		fmt.Printf("BenchmarkPodsRunning: %d pods on %d simulated nodes: created in %s, all Running after %s (%.0f pods/s)\n",
			benchPods, benchNodes, created.Round(10*time.Millisecond), took.Round(10*time.Millisecond), float64(benchPods)/took.Seconds())
		b.StartTimer()
	}
}
