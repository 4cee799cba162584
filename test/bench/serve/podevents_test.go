package serve

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/test/bench/benchresult"
)

// BenchmarkServePodEvents measures what recording Kubernetes Events on the
// tasks' pods costs (`kubetask serve --pod-events`, issue 36's goal: within
// 5 % when on): the same quick tasks through two single-cluster services
// (one per cluster, half the tasks each: the setup BenchmarkServeClusters
// calls singles), without the events and with them, in the same run, in
// the order off, on, on, off (so that a machine that slows or speeds up
// during the run weighs on both alike): tasks/s to the last outcome of
// each pair of runs, the submissions' p99, and the events the API servers
// then hold per task (source kubetask).
//
//	go test ./test/bench/serve -run '^$' -bench BenchmarkServePodEvents -benchtime 1x -timeout 30m
func BenchmarkServePodEvents(b *testing.B) {
	res := benchresult.Start(b, "podevents")
	sz := clusterSize{tasks: envInt("KUBETASK_BENCH_PODEVENTS_TASKS", 600), clients: 16, qps: 50, timeout: 20 * time.Minute}
	east := clustertest.New(b)
	west := clustertest.Another(b, east, clustertest.Options{SimNodes: benchSimNodes, LocalNodes: -1})
	for range b.N {
		var off, on []clusterResult
		events := 0
		for _, pe := range []bool{false, true, true, false} {
			if !pe {
				off = append(off, runClusters(b, east, west, false, sz))
				continue
			}
			before := kubetaskEvents(b, east, west)
			on = append(on, runClusters(b, east, west, false, sz, "--pod-events"))
			events += kubetaskEvents(b, east, west) - before
		}
		offTPS, onTPS := pairTasksPerSecond(off), pairTasksPerSecond(on)
		ratio := onTPS / offTPS
		perTask := float64(events) / float64(len(on)*sz.tasks)
		fmt.Printf("pod events on / off: %.2fx tasks/s, %.1f events per task\n", ratio, perTask)
		res.Report(b, offTPS, "off-tasks/s")
		res.Report(b, onTPS, "on-tasks/s")
		res.Report(b, ratio, "on/off")
		res.Report(b, ms(percentile(append(off[0].submits, off[1].submits...), 0.99)), "off-submit-p99-ms")
		res.Report(b, ms(percentile(append(on[0].submits, on[1].submits...), 0.99)), "on-submit-p99-ms")
		res.Report(b, perTask, "events/task")
	}
}

// kubetaskEvents counts the Events kubetask recorded in both clusters'
// test namespaces, as their API servers hold them.
func kubetaskEvents(tb testing.TB, envs ...*clustertest.Env) int {
	tb.Helper()
	n := 0
	for _, env := range envs {
		var list int
		clustertest.Eventually(tb, time.Minute, "the events listed", func(ctx context.Context) error {
			l, err := env.Client.CoreV1().Events(env.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("source", "kubetask").String()})
			if err != nil {
				return err
			}
			list = len(l.Items)
			return nil
		})
		n += list
	}
	return n
}

// pairTasksPerSecond is the tasks/s of runs together: all their tasks over
// all their times.
func pairTasksPerSecond(rs []clusterResult) float64 {
	tasks, secs := 0, 0.0
	for _, r := range rs {
		tasks += r.size.tasks
		secs += r.outcomes.Seconds()
	}
	return float64(tasks) / secs
}
