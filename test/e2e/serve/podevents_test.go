package serve

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// TestServePodEvents: with --pod-events the built service records its
// decisions as Kubernetes Events on the task's pods, as kubectl describe
// pod finds them (by the pod's UID, from the API server): a task whose
// first attempt exits 1 and whose second succeeds beside a sidecar gets,
// on the first pod, the failure and the retry scheduled, and on the
// second, the success, the sidecar stopped and the release.
func TestServePodEvents(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env, "--pod-events")
	marker := filepath.Join(t.TempDir(), "tried")
	script := fmt.Sprintf(`if [ -e %[1]s ]; then echo second; exit 0; fi; touch %[1]s; echo first; exit 1`, marker)
	doc := taskDoc("events", "  retries: {limit: 1, backoff: 1s, retryOn: [ExitCode]}\n  cleanup: Keep", fmt.Sprintf(`      containers:
        - {name: main, image: busybox, command: [sh, -c, %q]}
        - {name: sidecar, image: busybox, command: [sh, -c, "exec sleep 600"]}`, script))
	tk := s.submit(doc)
	tk = s.waitTask(tk.ID, 2*time.Minute, "the task to finish", func(tk api.Task) bool { return tk.Terminal })
	if tk.Phase != "Succeeded" || len(tk.Attempts) != 2 {
		t.Fatalf("%s/%s with %d attempts; want Succeeded on the second", tk.Phase, tk.Reason, len(tk.Attempts))
	}
	reasonsOf := func(ctx context.Context, attempt int) ([]string, error) {
		pod, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, tk.Attempts[attempt].Pod, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		list, err := env.Client.CoreV1().Events(env.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(pod.UID), "source": "kubetask"}.String()})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, e := range list.Items {
			if e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == pod.Name {
				out = append(out, e.Type+"/"+e.Reason)
			}
		}
		slices.Sort(out)
		return out, nil
	}
	want := map[int][]string{
		0: {corev1.EventTypeNormal + "/RetryScheduled", corev1.EventTypeWarning + "/AttemptFailed"},
		1: {corev1.EventTypeNormal + "/AttemptSucceeded", corev1.EventTypeNormal + "/Released", corev1.EventTypeNormal + "/StoppingSidecars"},
	}
	for attempt, w := range want {
		clustertest.Eventually(t, time.Minute, fmt.Sprintf("the events of attempt %d's pod", attempt), func(ctx context.Context) error {
			got, err := reasonsOf(ctx, attempt)
			if err != nil {
				return err
			}
			for _, r := range w {
				if !slices.Contains(got, r) {
					return fmt.Errorf("events %v, want %v among them", got, w)
				}
			}
			return nil
		})
	}
}
