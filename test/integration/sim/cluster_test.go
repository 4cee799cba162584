package sim

import (
	"context"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
)

// TestJob runs batch/v1 Jobs on simulated nodes: the scheduler places
// their pods and the controller-manager's Job controller sees them finish.
// A Job's pod without sim annotations completes with 0 (kwok's upstream
// rule); complete-code in the template makes it fail.
func TestJob(t *testing.T) {
	tests := map[string]struct {
		annotations map[string]string
		want        batchv1.JobConditionType
	}{
		"plain template succeeds":    {want: batchv1.JobComplete},
		"complete-code 1 fails":      {annotations: map[string]string{kwokstages.CompleteAfter: "0s", kwokstages.CompleteCode: "1"}, want: batchv1.JobFailed},
		"main exits 0 then succeeds": {annotations: map[string]string{kwokstages.ExitContainer: "main", kwokstages.ExitAfter: "500ms"}, want: batchv1.JobComplete},
	}
	env := clustertest.New(t)
	i := 0
	for name, tc := range tests {
		jobName := fmt.Sprintf("job-%d", i)
		i++
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			job := &batchv1.Job{
				ObjectMeta: metav1.ObjectMeta{Name: jobName},
				Spec: batchv1.JobSpec{
					BackoffLimit: new(int32(0)),
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations},
						Spec:       simPodSpec("main"),
					},
				},
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			jobs := env.Client.BatchV1().Jobs(env.Namespace)
			if _, err := jobs.Create(ctx, job, metav1.CreateOptions{}); err != nil {
				t.Fatalf("creating job: %v", err)
			}
			var last *batchv1.Job
			for {
				j, err := jobs.Get(ctx, jobName, metav1.GetOptions{})
				if err == nil {
					last = j
					if c := jobCondition(j); c != "" {
						if c != tc.want {
							t.Fatalf("job finished %s, want %s (status %+v)", c, tc.want, j.Status)
						}
						break
					}
				}
				select {
				case <-ctx.Done():
					t.Fatalf("job not finished after a minute: %+v", last.Status)
				case <-time.After(200 * time.Millisecond):
				}
			}
			pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + jobName})
			if err != nil {
				t.Fatalf("listing job pods: %v", err)
			}
			if len(pods.Items) != 1 {
				t.Fatalf("%d pods for job, want 1", len(pods.Items))
			}
			if !isSimNode(env, pods.Items[0].Spec.NodeName) {
				t.Errorf("job pod ran on %q, not a simulated node", pods.Items[0].Spec.NodeName)
			}
		})
	}
}

func jobCondition(j *batchv1.Job) batchv1.JobConditionType {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return c.Type
		}
	}
	return ""
}

// TestSchedulerPlacesPods: the real kube-scheduler binds tolerating pods to
// simulated nodes and leaves pods without the toleration Pending.
func TestSchedulerPlacesPods(t *testing.T) {
	env := clustertest.New(t)
	const n = 12
	for i := 0; i < n; i++ {
		createPod(t, env, simPod(fmt.Sprintf("p%d", i), nil, "main"))
	}
	used := map[string]bool{}
	for i := 0; i < n; i++ {
		p := waitPod(t, env, fmt.Sprintf("p%d", i), 30*time.Second, allRunning)
		if !isSimNode(env, p.Spec.NodeName) {
			t.Errorf("pod %s on %q, not a simulated node", p.Name, p.Spec.NodeName)
		}
		used[p.Spec.NodeName] = true
	}
	t.Logf("%d pods spread over %d simulated nodes", n, len(used))

	untolerated := simPod("untolerated", nil, "main")
	untolerated.Spec.Tolerations = nil
	createPod(t, env, untolerated)
	waitPod(t, env, "untolerated", 30*time.Second, func(p *corev1.Pod) (bool, string) {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, ""
			}
		}
		return false, "not reported Unschedulable"
	})
	holds(t, env, "untolerated", time.Second, phaseIs(corev1.PodPending))
}

// TestDeletion: deleting a pod on a simulated node removes it promptly,
// whether it runs or has finished, with the default grace period.
func TestDeletion(t *testing.T) {
	env := clustertest.New(t)
	createPod(t, env, simPod("running", nil, "main", "sidecar"))
	createPod(t, env, simPod("done", map[string]string{kwokstages.CompleteAfter: "0s"}, "main"))
	waitPod(t, env, "running", 30*time.Second, allRunning)
	waitPod(t, env, "done", 30*time.Second, phaseIs(corev1.PodSucceeded))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"running", "done"} {
		start := time.Now()
		if err := env.Client.CoreV1().Pods(env.Namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("deleting %s: %v", name, err)
		}
		waitGone(t, env, name, 10*time.Second)
		t.Logf("pod %s gone %s after delete", name, time.Since(start).Round(time.Millisecond))
	}
}
