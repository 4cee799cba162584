package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/task"
)

func loadExample(t *testing.T, path string) *task.Task {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tk, err := task.Load(f)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	return tk
}

// TestBuiltPodsAreAccepted creates (server-side dry run: validation and admission, no
// pod left behind) the pod BuildPod makes from every example, and checks that the API
// server accepts it unchanged in the parts kubetask relies on.
func TestBuiltPodsAreAccepted(t *testing.T) {
	env := clustertest.New(t)
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			tk := loadExample(t, f)
			id := task.Identity{Namespace: env.Namespace, Name: tk.Name, RunID: "run-1", Executor: "it"}
			pod, err := task.BuildPod(tk, id, 0)
			if err != nil {
				t.Fatal(err)
			}
			got, err := env.Client.CoreV1().Pods(env.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err != nil {
				t.Fatalf("the API server rejected the pod built from %s: %v", f, err)
			}
			if got.Name != pod.Name || len(got.Finalizers) != 1 || got.Finalizers[0] != task.Finalizer {
				t.Errorf("stored pod %s finalizers %v; want %s with [%s]", got.Name, got.Finalizers, pod.Name, task.Finalizer)
			}
			back, attempt, err := task.IdentityFromPod(got)
			if err != nil || back != id || attempt != 0 {
				t.Errorf("IdentityFromPod(stored pod) = %+v, %d, %v", back, attempt, err)
			}
		})
	}
}

// TestPodLifecycleOnTheAPIServer creates a real pod (gated, so it is never scheduled):
// a second create of the same attempt is AlreadyExists, a delete only marks it while
// kubetask's finalizer is there, and removing the finalizer lets it go.
func TestPodLifecycleOnTheAPIServer(t *testing.T) {
	env := clustertest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tk := loadExample(t, "../../examples/file-result-task.yaml")
	tk.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kubetask.dev/test-hold"}}
	id := task.Identity{Namespace: env.Namespace, Name: tk.Name, RunID: "run-1", Executor: "it"}
	pod, err := task.BuildPod(tk, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	pods := env.Client.CoreV1().Pods(env.Namespace)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	removeFinalizer := func() error {
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		_, err := pods.Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	}
	t.Cleanup(func() { _ = removeFinalizer() })

	again, err := task.BuildPod(tk, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, again, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Errorf("second create of the same attempt: %v; want AlreadyExists", err)
	}

	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	held, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the finalizer did not keep the deleted pod: %v", err)
	}
	if held.DeletionTimestamp == nil {
		t.Error("deleted pod has no deletionTimestamp")
	}
	if err := removeFinalizer(); err != nil {
		t.Fatalf("removing the finalizer: %v", err)
	}
	for {
		_, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod still present after its finalizer was removed: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestValidationAgreesWithTheAPIServer builds pods from templates that Load rejects
// (bypassing Load) and checks that the API server rejects them too: kubetask only
// reports earlier and at the task's field paths what the API server would reject.
func TestValidationAgreesWithTheAPIServer(t *testing.T) {
	env := clustertest.New(t)
	cases := map[string]func(*corev1.PodSpec){
		"missing image":      func(s *corev1.PodSpec) { s.Containers[0].Image = "" },
		"bad container name": func(s *corev1.PodSpec) { s.Containers[0].Name = "Base_1" },
		"undefined volume mount": func(s *corev1.PodSpec) {
			s.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "nope", MountPath: "/x"}}
		},
		"port out of range": func(s *corev1.PodSpec) { s.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 70000}} },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			tk := loadExample(t, "../../examples/hello-task.yaml")
			mutate(&tk.Spec.Template.Spec)
			if err := tk.Validate(); err == nil {
				t.Fatal("Validate() accepted the template")
			}
			tk.Spec.MainContainer = tk.Spec.Template.Spec.Containers[0].Name
			pod, err := task.BuildPod(tk, task.Identity{Namespace: env.Namespace, Name: "bad", RunID: "r", Executor: "it"}, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = env.Client.CoreV1().Pods(env.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if !apierrors.IsInvalid(err) {
				t.Errorf("the API server answered %v; want Invalid", err)
			}
		})
	}
}
