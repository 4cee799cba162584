package task_test

import (
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/task"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the current output")

var id = task.Identity{Namespace: "jobs", Name: "etl-daily", RunID: "r-20250101", Executor: "exec-a"}

func load(t *testing.T, file string) *task.Task {
	t.Helper()
	f, err := os.Open(filepath.Join("../../examples", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tk, err := task.Load(f)
	if err != nil {
		t.Fatalf("Load(%s): %v", file, err)
	}
	return tk
}

// TestBuildPodGolden compares the pods built from the examples with
// testdata/<example>.golden.yaml. Run `go test ./internal/task -run Golden -update`
// after an intended change and review the diff.
func TestBuildPodGolden(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			tk := load(t, filepath.Base(f))
			before := tk.Spec.Template.DeepCopy()
			pod, err := task.BuildPod(tk, id, 1)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(before, &tk.Spec.Template); diff != "" {
				t.Errorf("BuildPod mutated the template:\n%s", diff)
			}
			got, err := yaml.Marshal(pod)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", name+".golden.yaml")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("pod differs from %s (-want +got):\n%s", golden, diff)
			}
		})
	}
}

func TestPodName(t *testing.T) {
	long := strings.Repeat("very-long-task-name-", 12)
	cases := map[string]struct {
		id      task.Identity
		attempt int
		want    string // prefix the name starts with
	}{
		"short name":            {id: id, attempt: 0, want: "etl-daily-"},
		"attempt is the suffix": {id: id, attempt: 12, want: "etl-daily-"},
		"long name is cut":      {id: task.Identity{Namespace: "jobs", Name: long, RunID: "r", Executor: "e"}, want: "very-long-task-name-very"},
		"dots become dashes":    {id: task.Identity{Namespace: "jobs", Name: "etl.daily.v2", RunID: "r", Executor: "e"}, want: "etl-daily-v2-"},
		"nothing usable left":   {id: task.Identity{Namespace: "jobs", Name: "...", RunID: "r", Executor: "e"}, want: "task-"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := task.PodName(tc.id, tc.attempt)
			if !strings.HasPrefix(got, tc.want) {
				t.Errorf("PodName() = %q, want prefix %q", got, tc.want)
			}
			if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
				t.Errorf("PodName() = %q is not a DNS-1123 label: %v", got, errs)
			}
			if got != task.PodName(tc.id, tc.attempt) {
				t.Error("PodName() is not deterministic")
			}
			if !strings.HasSuffix(got, "-"+itoa(tc.attempt)) {
				t.Errorf("PodName() = %q does not end with the attempt", got)
			}
		})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestPodNameSeparatesRunsAndAttempts(t *testing.T) {
	seen := map[string]task.Identity{}
	for _, ns := range []string{"a", "b"} {
		for _, name := range []string{"x", "x-1", strings.Repeat("x", 80), strings.Repeat("x", 81)} {
			for _, run := range []string{"r1", "r2"} {
				for attempt := range 3 {
					i := task.Identity{Namespace: ns, Name: name, RunID: run, Executor: "e"}
					n := task.PodName(i, attempt)
					if prev, ok := seen[n]; ok {
						t.Fatalf("PodName collision %q: %+v and %+v", n, prev, i)
					}
					seen[n] = i
				}
			}
		}
	}
}

// A record's nonce is part of its pods' names: a run ID submitted again
// after its record went (retention, a memory store's restart) names other
// pods than the earlier record's, which may still exist (kept). A record
// without a nonce names the pods it always did.
func TestPodNameWithNonce(t *testing.T) {
	withNonce := id
	withNonce.Nonce = "n1"
	other := id
	other.Nonce = "n2"
	if task.PodName(withNonce, 0) == task.PodName(id, 0) || task.PodName(withNonce, 0) == task.PodName(other, 0) {
		t.Errorf("the nonce does not change the name: %s, %s, %s", task.PodName(id, 0), task.PodName(withNonce, 0), task.PodName(other, 0))
	}
	if got, want := task.PodName(id, 0), "etl-daily-iilqbenuyh-0"; got != want {
		t.Errorf("PodName without a nonce = %q, want %q (the name of pods created before nonces)", got, want)
	}
	tk := load(t, "sidecar-task.yaml")
	pod, err := task.BuildPod(tk, withNonce, 1)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Annotations[task.AnnotationNonce] != "n1" || pod.Name != task.PodName(withNonce, 1) {
		t.Errorf("pod %s, nonce annotation %q", pod.Name, pod.Annotations[task.AnnotationNonce])
	}
	got, attempt, err := task.IdentityFromPod(pod)
	if err != nil || got != withNonce || attempt != 1 {
		t.Fatalf("IdentityFromPod() = %+v, %d, %v; want %+v, 1", got, attempt, err, withNonce)
	}
	pod.Annotations[task.AnnotationNonce] = "n2"
	if _, _, err := task.IdentityFromPod(pod); err == nil {
		t.Error("IdentityFromPod() accepted a pod whose nonce does not match its name")
	}
}

func TestIdentityFromPod(t *testing.T) {
	tk := load(t, "sidecar-task.yaml")
	pod, err := task.BuildPod(tk, id, 2)
	if err != nil {
		t.Fatal(err)
	}
	got, attempt, err := task.IdentityFromPod(pod)
	if err != nil || got != id || attempt != 2 {
		t.Fatalf("IdentityFromPod() = %+v, %d, %v; want %+v, 2", got, attempt, err, id)
	}
	if !task.RunSelector(id).Matches(labelsOf(pod)) || !task.ExecutorSelector("exec-a").Matches(labelsOf(pod)) || !task.ManagedSelector().Matches(labelsOf(pod)) {
		t.Error("selectors do not match the built pod")
	}
	tampered := map[string]func(*corev1.Pod){
		"not managed":           func(p *corev1.Pod) { delete(p.Labels, task.LabelManagedBy) },
		"renamed":               func(p *corev1.Pod) { p.Name = "other" },
		"other namespace":       func(p *corev1.Pod) { p.Namespace = "elsewhere" },
		"attempt label differs": func(p *corev1.Pod) { p.Labels[task.LabelAttempt] = "0" },
		"bad attempt":           func(p *corev1.Pod) { p.Annotations[task.AnnotationAttempt] = "x" },
		"no run":                func(p *corev1.Pod) { delete(p.Annotations, task.AnnotationRun) },
	}
	for name, mutate := range tampered {
		t.Run(name, func(t *testing.T) {
			p := pod.DeepCopy()
			mutate(p)
			if _, _, err := task.IdentityFromPod(p); err == nil {
				t.Error("IdentityFromPod() accepted a pod that does not match its identity")
			}
		})
	}
}

func labelsOf(p *corev1.Pod) labels.Set { return labels.Set(p.Labels) }

func TestBuildPodRejectsBadIdentity(t *testing.T) {
	tk := load(t, "hello-task.yaml")
	for name, bad := range map[string]task.Identity{
		"empty":             {},
		"bad namespace":     {Namespace: "Jobs", Name: "x", RunID: "r", Executor: "e"},
		"run with a slash":  {Namespace: "jobs", Name: "x", RunID: "r/1", Executor: "e"},
		"executor too long": {Namespace: "jobs", Name: "x", RunID: "r", Executor: strings.Repeat("e", 64)},
	} {
		if _, err := task.BuildPod(tk, bad, 0); err == nil {
			t.Errorf("%s: BuildPod() accepted identity %+v", name, bad)
		}
	}
	if _, err := task.BuildPod(tk, id, -1); err == nil {
		t.Error("BuildPod() accepted a negative attempt")
	}
}

func TestFileResultPlumbing(t *testing.T) {
	cases := map[string]struct {
		doc        string
		wantVolume string // volume the holder mounts
		wantMount  string // where
		wantUser   *int64 // holder's runAsUser
	}{
		"new emptyDir at the file's directory": {
			doc:        withSpec("  result: {from: File, path: /kubetask/out/result.json}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			wantVolume: task.ResultVolume, wantMount: "/kubetask/out",
		},
		"the main container's own volume covers the path": {
			doc:        withSpec("  result: {from: File, path: /work/out/r.json}\n  template: {spec: {containers: [{name: base, image: a, volumeMounts: [{name: work, mountPath: /work}]}], volumes: [{name: work, emptyDir: {}}]}}\n"),
			wantVolume: "work", wantMount: "/work",
		},
		"runs as the main container's user": {
			doc:        withSpec("  result: {from: File, path: /out/r.json}\n  template: {spec: {containers: [{name: base, image: a, securityContext: {runAsUser: 1001}}]}}\n"),
			wantVolume: task.ResultVolume, wantMount: "/out", wantUser: ptr(int64(1001)),
		},
		"runs as nobody under runAsNonRoot with no user": {
			doc:        withSpec("  result: {from: File, path: /out/r.json}\n  template: {spec: {securityContext: {runAsNonRoot: true}, containers: [{name: base, image: a}]}}\n"),
			wantVolume: task.ResultVolume, wantMount: "/out", wantUser: ptr(int64(65534)),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tk, err := task.Parse([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			pod, err := task.BuildPod(tk, id, 0)
			if err != nil {
				t.Fatal(err)
			}
			holder := pod.Spec.Containers[len(pod.Spec.Containers)-1]
			if holder.Name != task.ResultContainer || holder.Image != task.DefaultResultImage {
				t.Fatalf("last container is %s (%s), want the result holder", holder.Name, holder.Image)
			}
			m := holder.VolumeMounts[0]
			if m.Name != tc.wantVolume || m.MountPath != tc.wantMount || !m.ReadOnly {
				t.Errorf("holder mount = %+v, want %s at %s read-only", m, tc.wantVolume, tc.wantMount)
			}
			if diff := cmp.Diff(tc.wantUser, holder.SecurityContext.RunAsUser); diff != "" {
				t.Errorf("holder runAsUser (-want +got):\n%s", diff)
			}
			main := pod.Spec.Containers[0]
			found := false
			for _, mm := range main.VolumeMounts {
				found = found || (mm.Name == m.Name && strings.HasPrefix(tk.Spec.Result.Path, mm.MountPath+"/") && !mm.ReadOnly)
			}
			if !found {
				t.Errorf("main container does not mount %s writable over %s: %+v", m.Name, tk.Spec.Result.Path, main.VolumeMounts)
			}
			if pod.Annotations[task.AnnotationResultPath] != tk.Spec.Result.Path {
				t.Errorf("result path annotation = %q", pod.Annotations[task.AnnotationResultPath])
			}
			if diff := cmp.Diff([]string{"head", "-c", "1048577", tk.Spec.Result.Path}, task.ReadResultCommand(tk)); diff != "" {
				t.Errorf("ReadResultCommand (-want +got):\n%s", diff)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestDefaults(t *testing.T) {
	tk, err := task.Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	want := task.Spec{
		MainContainer: "base",
		Cleanup:       task.CleanupDelete,
		Timeouts:      task.Timeouts{Schedule: "10m", Startup: "10m", Run: "0s", ImagePull: "3m", ContainerConfig: "1m"},
		Retries:       task.Retries{Limit: ptr(int32(2)), Backoff: "10s", RetryOn: []string{"Infrastructure"}},
		Logs:          task.Logs{Containers: []string{"base"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "base", Image: "busybox"}},
		}},
	}
	if diff := cmp.Diff(want, tk.Spec); diff != "" {
		t.Errorf("defaulted spec (-want +got):\n%s", diff)
	}
	wantPolicy := podstate.Policy{MainContainer: "base", ScheduleTimeout: 10 * time.Minute, StartupTimeout: 10 * time.Minute,
		ImagePullGrace: 3 * time.Minute, ConfigErrorGrace: time.Minute}
	if diff := cmp.Diff(wantPolicy, tk.Policy()); diff != "" {
		t.Errorf("Policy() (-want +got):\n%s", diff)
	}
}

func TestMainContainerDefault(t *testing.T) {
	cases := map[string]struct{ containers, want string }{
		"the only container": {"[{name: app, image: a}]", "app"},
		"the one named base": {"[{name: envoy, image: e}, {name: base, image: a}]", "base"},
		"the one named main": {"[{name: envoy, image: e}, {name: main, image: a}]", "main"},
		"base before main":   {"[{name: main, image: e}, {name: base, image: a}]", "base"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tk, err := task.Parse([]byte(withSpec("  template: {spec: {containers: " + tc.containers + "}}\n")))
			if err != nil {
				t.Fatal(err)
			}
			if tk.Spec.MainContainer != tc.want {
				t.Errorf("main container = %q, want %q", tk.Spec.MainContainer, tc.want)
			}
		})
	}
}

func TestPlainPod(t *testing.T) {
	tk := load(t, "plain-pod.yaml")
	if tk.Name != "migrate-db" || tk.Spec.MainContainer != "migrate" || tk.Labels["app"] != "db" {
		t.Errorf("task from pod = name %q, main %q, labels %v", tk.Name, tk.Spec.MainContainer, tk.Labels)
	}
	if _, ok := tk.Spec.Template.Annotations[task.AnnotationMainContainer]; ok {
		t.Error("the main-container annotation was kept in the template")
	}
	if tk.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy = %q, want Never", tk.Spec.Template.Spec.RestartPolicy)
	}
}

func TestRetries(t *testing.T) {
	tk := load(t, "file-result-task.yaml") // limit 3, retryOn [Infrastructure, OOMKilled]
	failed := func(r podstate.Reason) podstate.State {
		return podstate.State{Phase: podstate.Failed, Reason: r, Retryable: r.Retryable()}
	}
	cases := map[string]struct {
		state   podstate.State
		attempt int
		want    bool
	}{
		"evicted: infrastructure":     {failed(podstate.ReasonEvicted), 0, true},
		"OOMKilled: listed":           {failed(podstate.ReasonOOMKilled), 1, true},
		"exit code: not listed":       {failed(podstate.ReasonExitCode), 0, false},
		"limit reached":               {failed(podstate.ReasonEvicted), 3, false},
		"succeeded is never retried":  {podstate.State{Phase: podstate.Succeeded, Reason: podstate.ReasonCompleted}, 0, false},
		"cancelled is never retried":  {failed(podstate.ReasonCancelled), 0, false},
		"still running is no failure": {podstate.State{Phase: podstate.Running, Reason: podstate.ReasonRunning}, 0, false},
	}
	for name, tc := range cases {
		if got := tk.ShouldRetry(tc.state, tc.attempt); got != tc.want {
			t.Errorf("%s: ShouldRetry() = %v, want %v", name, got, tc.want)
		}
	}
	for attempt, want := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second} {
		if got := tk.RetryDelay(attempt); got != want {
			t.Errorf("RetryDelay(%d) = %v, want %v", attempt, got, want)
		}
	}
	if got := tk.RetryDelay(30); got != task.MaxBackoff {
		t.Errorf("RetryDelay(30) = %v, want the cap %v", got, task.MaxBackoff)
	}
}
