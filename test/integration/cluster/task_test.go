package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
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
	files, err := filepath.Glob("../../../examples/*.yaml")
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
	tk := loadExample(t, "../../../examples/file-result-task.yaml")
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

// TestValidationAgreesWithTheAPIServer is the proof of task validation: for each
// broken template, Validate (no cluster) and ValidateOnServer (the real API server,
// server-side dry run) report the problem at the same task field path, or, for what
// only the API server judges (serverOnly), Validate accepts the task and
// ValidateOnServer rejects it there. Every example passes both.
func TestValidationAgreesWithTheAPIServer(t *testing.T) {
	env := clustertest.New(t)
	main := func(f func(c *corev1.Container)) func(*task.Task) {
		return func(tk *task.Task) { f(&tk.Spec.Template.Spec.Containers[0]) }
	}
	cases := map[string]struct {
		example    string // default examples/hello-task.yaml
		mutate     func(*task.Task)
		path       string // every reported path starts with it
		serverOnly bool
	}{
		"missing image": {
			mutate: main(func(c *corev1.Container) { c.Image = "" }),
			path:   "spec.template.spec.containers[0].image",
		},
		"image with whitespace": {
			mutate: main(func(c *corev1.Container) { c.Image = "busybox:1.37 " }),
			path:   "spec.template.spec.containers[0].image",
		},
		"bad container name": {
			mutate: func(tk *task.Task) {
				tk.Spec.Template.Spec.Containers[0].Name = "Base_1"
				tk.Spec.MainContainer, tk.Spec.Logs.Containers = "Base_1", nil
			},
			path: "spec.template.spec.containers[0].name",
		},
		"container name used twice": {
			mutate: func(tk *task.Task) {
				tk.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "base", Image: "busybox:1.37"}}
			},
			path: "spec.template.spec.initContainers[0].name",
		},
		"undefined volume mount": {
			mutate: main(func(c *corev1.Container) { c.VolumeMounts = []corev1.VolumeMount{{Name: "nope", MountPath: "/x"}} }),
			path:   "spec.template.spec.containers[0].volumeMounts[0].name",
		},
		"volume with two types": {
			mutate: func(tk *task.Task) {
				tk.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{
					EmptyDir: &corev1.EmptyDirVolumeSource{}, ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "c"}}}}}
			},
			path: "spec.template.spec.volumes[0]",
		},
		"port out of range": {
			mutate: main(func(c *corev1.Container) { c.Ports = []corev1.ContainerPort{{ContainerPort: 70000}} }),
			path:   "spec.template.spec.containers[0].ports[0].containerPort",
		},
		"requests above limits": {
			mutate: main(func(c *corev1.Container) {
				c.Resources = corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
				}
			}),
			path: "spec.template.spec.containers[0].resources.requests",
		},
		"env var name with =": {
			mutate: main(func(c *corev1.Container) { c.Env = []corev1.EnvVar{{Name: "A=B", Value: "x"}} }),
			path:   "spec.template.spec.containers[0].env[0].name",
		},
		"env var from an unsupported pod field": {
			mutate: main(func(c *corev1.Container) {
				c.Env = []corev1.EnvVar{{Name: "A", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.hostname"}}}}
			}),
			path: "spec.template.spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
		},
		"template label": {
			mutate: func(tk *task.Task) { tk.Spec.Template.Labels = map[string]string{"a b": "x"} },
			path:   "spec.template.metadata.labels",
		},
		"template annotation": {
			mutate: func(tk *task.Task) { tk.Spec.Template.Annotations = map[string]string{"-x": "y"} },
			path:   "spec.template.metadata.annotations",
		},
		// Only the API server judges these.
		"runAsUser out of range": {
			mutate:     main(func(c *corev1.Container) { c.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr(int64(-1))} }),
			path:       "spec.template.spec.containers[0].securityContext.runAsUser",
			serverOnly: true,
		},
		"probe without a handler": {
			mutate:     main(func(c *corev1.Container) { c.ReadinessProbe = &corev1.Probe{} }),
			path:       "spec.template.spec.containers[0].readinessProbe",
			serverOnly: true,
		},
		"zero activeDeadlineSeconds": {
			mutate:     func(tk *task.Task) { tk.Spec.Template.Spec.ActiveDeadlineSeconds = ptr(int64(0)) },
			path:       "spec.template.spec.activeDeadlineSeconds",
			serverOnly: true,
		},
		"unknown dnsPolicy": {
			mutate:     func(tk *task.Task) { tk.Spec.Template.Spec.DNSPolicy = "Sometimes" },
			path:       "spec.template.spec.dnsPolicy",
			serverOnly: true,
		},
		"the result holder, at spec.result": {
			// The holder runs as the main container's user: both are rejected.
			example:    "../../../examples/file-result-task.yaml",
			mutate:     main(func(c *corev1.Container) { c.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr(int64(-1))} }),
			path:       "spec.result.securityContext.runAsUser",
			serverOnly: true,
		},
	}
	under := func(err error, path string) (found, outside []string) {
		var inv *task.InvalidError
		if !errors.As(err, &inv) {
			return nil, nil
		}
		for _, e := range inv.Errs {
			if strings.HasPrefix(e.Field, path) {
				found = append(found, e.Error())
			} else {
				outside = append(outside, e.Error())
			}
		}
		return found, outside
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			example := tc.example
			if example == "" {
				example = "../../../examples/hello-task.yaml"
			}
			tk := loadExample(t, example)
			tc.mutate(tk)

			local := tk.Validate()
			if found, _ := under(local, tc.path); tc.serverOnly && local != nil {
				t.Errorf("Validate() rejected a template only the API server judges:\n%v", local)
			} else if !tc.serverOnly && len(found) == 0 {
				t.Errorf("Validate() = %v; want an *InvalidError at %s", local, tc.path)
			}

			server := tk.ValidateOnServer(ctx, env.Client, env.Namespace)
			found, outside := under(server, tc.path)
			if len(found) == 0 {
				t.Fatalf("ValidateOnServer() = %v; want an *InvalidError at %s", server, tc.path)
			}
			for _, e := range outside {
				if !tc.serverOnly || !strings.HasPrefix(e, "spec.template.spec.containers[0].") {
					t.Errorf("ValidateOnServer() also reported %s", e)
				}
			}
			t.Logf("API server: %v", found)
		})
	}

	files, err := filepath.Glob("../../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, f := range files {
		t.Run("accepts "+filepath.Base(f), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := loadExample(t, f).ValidateOnServer(ctx, env.Client, env.Namespace); err != nil {
				t.Errorf("ValidateOnServer() = %v", err)
			}
		})
	}
}

// TestValidateOnServerAnswersThatAreNoVerdict: an error that is not the API server's
// 422 Invalid (here a namespace that does not exist) is not an *InvalidError.
func TestValidateOnServerAnswersThatAreNoVerdict(t *testing.T) {
	env := clustertest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tk := loadExample(t, "../../../examples/hello-task.yaml")
	err := tk.ValidateOnServer(ctx, env.Client, "kubetask-no-such-namespace")
	var inv *task.InvalidError
	if err == nil || errors.As(err, &inv) || !apierrors.IsNotFound(err) {
		t.Errorf("ValidateOnServer() in a missing namespace = %v; want a wrapped NotFound, not an *InvalidError", err)
	}
}

func ptr[T any](v T) *T { return &v }
