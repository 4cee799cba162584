package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localnode"
)

// nodeEnv is a test's namespace plus a local node of its own, run in the test binary
// (its containers are re-execs of this binary) and stopped when the test ends.
type nodeEnv struct {
	*clustertest.Env
	t    *testing.T
	Node string
	stop func()
}

func startLocalNode(t *testing.T, env *clustertest.Env, name string) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	dir := t.TempDir()
	go func() {
		done <- localnode.Run(ctx, localnode.Config{
			NodeName:   name,
			Kubeconfig: env.Kubeconfig,
			Dir:        dir,
			Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("local node %s: %v", name, err)
			}
		case <-time.After(time.Minute):
			t.Errorf("local node %s did not stop", name)
		}
	}
	waitFor(t, time.Minute, "node "+name+" Ready", func() (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("node exited: %w", err)
		default:
		}
		n, err := env.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return nodeReady(n), nil
	})
	return stop
}

func newNodeEnv(t *testing.T) *nodeEnv {
	env := clustertest.New(t)
	name := "ln-" + rand.String(6)
	stop := startLocalNode(t, env, name)
	t.Cleanup(func() {
		stop()
		_ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return &nodeEnv{Env: env, t: t, Node: name, stop: stop}
}

// sharedNodeEnv is a namespace of its own on the shared cluster's local node
// (the one that runs loaded images), for a test that needs root for why: it
// is skipped otherwise.
func sharedNodeEnv(t *testing.T, why string) *nodeEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip(why)
	}
	env := clustertest.New(t)
	return &nodeEnv{Env: env, t: t, Node: clustertest.Cluster().LocalNodeNames()[0], stop: func() {}}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitFor polls cond every 100ms until it holds, fails, or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, lastErr)
		}
		time.Sleep(100 * time.Millisecond) // poll interval of a condition with a deadline
	}
}

func sh(script string) []string { return []string{"sh", "-c", script} }

// pod builds a pod pinned to the test's node.
func (e *nodeEnv) pod(name string, containers ...corev1.Container) *corev1.Pod {
	zero := int64(2)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.Namespace, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      e.Node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			Containers:                    containers,
			TerminationGracePeriodSeconds: &zero,
		},
	}
}

func ctr(name string, cmd ...string) corev1.Container {
	return corev1.Container{Name: name, Image: "busybox", Command: cmd}
}

func (e *nodeEnv) create(p *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	out, err := e.Client.CoreV1().Pods(e.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create pod %s: %v", p.Name, err)
	}
	return out
}

func (e *nodeEnv) get(name string) (*corev1.Pod, error) {
	return e.Client.CoreV1().Pods(e.Namespace).Get(context.Background(), name, metav1.GetOptions{})
}

// waitPod waits until cond holds for the pod and returns it.
func (e *nodeEnv) waitPod(name, what string, timeout time.Duration, cond func(*corev1.Pod) bool) *corev1.Pod {
	e.t.Helper()
	var p *corev1.Pod
	waitFor(e.t, timeout, "pod "+name+": "+what, func() (bool, error) {
		var err error
		p, err = e.get(name)
		if err != nil {
			return false, err
		}
		return cond(p), nil
	})
	return p
}

func phaseIs(ph corev1.PodPhase) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool { return p.Status.Phase == ph }
}

func status(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

func running(p *corev1.Pod, name string) bool {
	s := status(p, name)
	return s != nil && s.State.Running != nil
}

func terminated(p *corev1.Pod, name string) *corev1.ContainerStateTerminated {
	if s := status(p, name); s != nil {
		return s.State.Terminated
	}
	return nil
}

func waitingReason(p *corev1.Pod, name string) string {
	if s := status(p, name); s != nil && s.State.Waiting != nil {
		return s.State.Waiting.Reason
	}
	return ""
}

func condition(p *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

func (e *nodeEnv) logs(name string, opts *corev1.PodLogOptions) string {
	e.t.Helper()
	b, err := e.Client.CoreV1().Pods(e.Namespace).GetLogs(name, opts).DoRaw(context.Background())
	if err != nil {
		e.t.Fatalf("logs of %s: %v", name, err)
	}
	return string(b)
}

// trapTERM is a sleeping command that exits 0 on SIGTERM (as PID 1 it needs the trap).
const trapTERM = `trap 'exit 0' TERM; while :; do sleep 0.1; done`

func TestLocalNodeRegistersAndSchedulerPlacesPods(t *testing.T) {
	e := newNodeEnv(t)
	n, err := e.Client.CoreV1().Nodes().Get(context.Background(), e.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels[localnode.LabelKey] != localnode.LabelValue {
		t.Errorf("labels %v lack %s=%s", n.Labels, localnode.LabelKey, localnode.LabelValue)
	}
	for _, taint := range n.Spec.Taints {
		if taint.Key == localnode.LabelKey {
			t.Errorf("taints = %v; a local node carries none of its own, so any pod runs on it", n.Spec.Taints)
		}
	}
	if len(n.Status.Addresses) == 0 || n.Status.Addresses[0].Address != "127.0.0.1" || n.Status.DaemonEndpoints.KubeletEndpoint.Port == 0 {
		t.Errorf("addresses %v, kubelet endpoint %v", n.Status.Addresses, n.Status.DaemonEndpoints)
	}
	if _, err := e.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), e.Node, metav1.GetOptions{}); err != nil {
		t.Errorf("node lease: %v", err)
	}
	// Through the scheduler, without a toleration: the selector only picks this
	// very node among the cluster's untainted local nodes.
	p := e.pod("scheduled", ctr("main", "sh", "-c", "echo scheduled"))
	p.Spec.NodeName = ""
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": e.Node}
	e.create(p)
	got := e.waitPod("scheduled", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	if got.Spec.NodeName != e.Node || condition(got, corev1.PodScheduled) != corev1.ConditionTrue {
		t.Errorf("node %q, PodScheduled %q", got.Spec.NodeName, condition(got, corev1.PodScheduled))
	}
	tm := terminated(got, "main")
	if tm == nil || tm.ExitCode != 0 || tm.Reason != "Completed" || tm.StartedAt.IsZero() || tm.FinishedAt.IsZero() {
		t.Errorf("terminated = %+v", tm)
	}
	if condition(got, corev1.PodInitialized) != corev1.ConditionTrue || condition(got, corev1.PodReady) != corev1.ConditionFalse {
		t.Errorf("conditions = %+v", got.Status.Conditions)
	}
	if got.Status.PodIP != "127.0.0.1" || got.Status.StartTime == nil {
		t.Errorf("podIP %q startTime %v", got.Status.PodIP, got.Status.StartTime)
	}

	// Stopping the node marks it NotReady at once.
	e.stop()
	n, err = e.Client.CoreV1().Nodes().Get(context.Background(), e.Node, metav1.GetOptions{})
	if err != nil || nodeReady(n) {
		t.Errorf("node still Ready after stop (err %v)", err)
	}
}

func TestRegularSidecarKeepsPodRunningAfterMainExits(t *testing.T) {
	e := newNodeEnv(t)
	e.create(e.pod("sidecar", ctr("main", "sh", "-c", "exit 3"), ctr("sidecar", "sleep", "3600")))
	p := e.waitPod("sidecar", "main terminated", time.Minute, func(p *corev1.Pod) bool {
		return terminated(p, "main") != nil && running(p, "sidecar")
	})
	if tm := terminated(p, "main"); tm.ExitCode != 3 || tm.Reason != "Error" {
		t.Errorf("main terminated = %+v", tm)
	}
	if p.Status.Phase != corev1.PodRunning {
		t.Errorf("phase %s, want Running", p.Status.Phase)
	}
	if condition(p, corev1.PodReady) != corev1.ConditionFalse || condition(p, corev1.ContainersReady) != corev1.ConditionFalse {
		t.Errorf("conditions %+v", p.Status.Conditions)
	}
}

func TestNativeSidecarIsStoppedAndPodFails(t *testing.T) {
	e := newNodeEnv(t)
	always := corev1.ContainerRestartPolicyAlways
	p := e.pod("native", ctr("main", "sh", "-c", "sleep 0.5; exit 3"))
	side := ctr("sidecar", "sh", "-c", trapTERM)
	side.RestartPolicy = &always
	p.Spec.InitContainers = []corev1.Container{side}
	e.create(p)
	running := e.waitPod("native", "Running with the sidecar up", time.Minute, func(p *corev1.Pod) bool {
		return running(p, "main") && running(p, "sidecar")
	})
	if condition(running, corev1.PodInitialized) != corev1.ConditionTrue || condition(running, corev1.PodReady) != corev1.ConditionTrue {
		t.Errorf("conditions while running: %+v", running.Status.Conditions)
	}
	got := e.waitPod("native", "Failed", time.Minute, phaseIs(corev1.PodFailed))
	if tm := terminated(got, "main"); tm == nil || tm.ExitCode != 3 {
		t.Errorf("main terminated = %+v", tm)
	}
	side0 := terminated(got, "sidecar")
	if side0 == nil || side0.ExitCode != 0 {
		t.Errorf("sidecar terminated = %+v (want stopped by SIGTERM, trap exit 0)", side0)
	}
	if side0 != nil && side0.FinishedAt.Before(&terminated(got, "main").FinishedAt) {
		t.Errorf("sidecar stopped before main finished")
	}
}

func TestLogsFollowStreamsAndEndsWhenContainerExits(t *testing.T) {
	e := newNodeEnv(t)
	gate := filepath.Join(t.TempDir(), "gate")
	e.create(e.pod("follow", ctr("main", "sh", "-c", fmt.Sprintf(`echo one; while [ ! -e %s ]; do sleep 0.05; done; echo two; echo err >&2`, gate))))
	e.waitPod("follow", "running", time.Minute, func(p *corev1.Pod) bool { return running(p, "main") })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := e.Client.CoreV1().Pods(e.Namespace).GetLogs("follow", &corev1.PodLogOptions{Container: "main", Follow: true}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	r := bufio.NewReader(stream)
	line, err := r.ReadString('\n')
	if err != nil || line != "one\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	// The second line is written only now; the stream must deliver it and then end.
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("reading the rest: %v", err)
	}
	// stdout and stderr are separate pipes: their relative order is not defined.
	if got := string(rest); got != "two\nerr\n" && got != "err\ntwo\n" {
		t.Fatalf("rest of stream %q", rest)
	}

	p := e.waitPod("follow", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	_ = p
	ts := e.logs("follow", &corev1.PodLogOptions{Timestamps: true})
	lines := strings.Split(strings.TrimSpace(ts), "\n")
	if len(lines) != 3 {
		t.Fatalf("timestamped logs %q", ts)
	}
	var tsTwo time.Time
	for _, l := range lines {
		if stamp, text, _ := strings.Cut(l, " "); text == "two" {
			if tsTwo, err = time.Parse(time.RFC3339Nano, stamp); err != nil {
				t.Fatalf("timestamp of %q: %v", l, err)
			}
		}
	}
	tail := int64(1)
	if got := e.logs("follow", &corev1.PodLogOptions{TailLines: &tail}); got != lines[2][strings.IndexByte(lines[2], ' ')+1:]+"\n" {
		t.Errorf("tail 1 = %q, timestamped log %q", got, ts)
	}
	limit := int64(5)
	if got := e.logs("follow", &corev1.PodLogOptions{LimitBytes: &limit}); got != "one\nt" && got != "one\ne" {
		t.Errorf("limit 5 = %q", got)
	}
	// sinceTime has second precision; the gate made "two" come after "one".
	since := metav1.NewTime(tsTwo.Truncate(time.Second))
	if got := e.logs("follow", &corev1.PodLogOptions{SinceTime: &since}); !strings.Contains(got, "two\n") || !strings.Contains(got, "err\n") {
		t.Errorf("sinceTime = %q", got)
	}
	sinceSeconds := int64(3600)
	if got := e.logs("follow", &corev1.PodLogOptions{SinceSeconds: &sinceSeconds}); !strings.HasPrefix(got, "one\n") || len(got) != len("one\ntwo\nerr\n") {
		t.Errorf("sinceSeconds = %q", got)
	}
}

func TestOnFailureRestartsWithPreviousLogs(t *testing.T) {
	e := newNodeEnv(t)
	p := e.pod("onfailure", ctr("main", "sh", "-c", `if [ -e /data/once ]; then echo second; exit 0; fi; touch /data/once; echo first; exit 1`))
	p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	e.create(p)
	got := e.waitPod("onfailure", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	s := status(got, "main")
	if s.RestartCount != 1 || s.LastTerminationState.Terminated == nil || s.LastTerminationState.Terminated.ExitCode != 1 {
		t.Fatalf("status = %+v", s)
	}
	if got := e.logs("onfailure", &corev1.PodLogOptions{}); got != "second\n" {
		t.Errorf("logs = %q", got)
	}
	if got := e.logs("onfailure", &corev1.PodLogOptions{Previous: true}); got != "first\n" {
		t.Errorf("previous logs = %q", got)
	}
}

func TestExecPassesStreamsAndExitCode(t *testing.T) {
	e := newNodeEnv(t)
	e.create(e.pod("exec", ctr("main", "sh", "-c", trapTERM)))
	e.waitPod("exec", "running", time.Minute, func(p *corev1.Pod) bool { return running(p, "main") })
	req := e.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(e.Namespace).Name("exec").SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: sh(`read x; echo "got $x"; echo oops >&2; exit 7`), Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(e.Config, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: strings.NewReader("hello\n"), Stdout: &out, Stderr: &errb})
	var ce utilexec.CodeExitError
	if !errors.As(err, &ce) || ce.Code != 7 {
		t.Fatalf("exec error %v (%T), want exit code 7", err, err)
	}
	if out.String() != "got hello\n" || errb.String() != "oops\n" {
		t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
	}
}

func TestDeletionKillsProcessIgnoringSIGTERMAfterGrace(t *testing.T) {
	e := newNodeEnv(t)
	grace := int64(3)
	p := e.pod("stubborn", ctr("main", "sh", "-c", `trap '' TERM; while :; do sleep 0.1; done`))
	p.Spec.TerminationGracePeriodSeconds = &grace
	e.create(p)
	polite := e.pod("polite", ctr("main", "sh", "-c", trapTERM))
	long := int64(60)
	polite.Spec.TerminationGracePeriodSeconds = &long
	e.create(polite)
	for _, name := range []string{"stubborn", "polite"} {
		e.waitPod(name, "running", time.Minute, func(p *corev1.Pod) bool { return running(p, "main") })
	}
	begin := time.Now()
	for _, name := range []string{"stubborn", "polite"} {
		if err := e.Client.CoreV1().Pods(e.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(name string) func() (bool, error) {
		return func() (bool, error) {
			_, err := e.get(name)
			return apierrors.IsNotFound(err), nil
		}
	}
	waitFor(t, 30*time.Second, "polite pod gone", gone("polite"))
	if d := time.Since(begin); d > 20*time.Second {
		t.Errorf("pod whose process exits on SIGTERM took %v to disappear (grace 60s)", d)
	}
	waitFor(t, 30*time.Second, "stubborn pod gone", gone("stubborn"))
	if d := time.Since(begin); d < time.Duration(grace)*time.Second {
		t.Errorf("stubborn pod gone after %v, before its grace period", d)
	}
}

func TestLoweringActiveDeadlineEndsPod(t *testing.T) {
	e := newNodeEnv(t)
	hour := int64(3600)
	p := e.pod("deadline", ctr("main", "sh", "-c", trapTERM))
	p.Spec.ActiveDeadlineSeconds = &hour
	e.create(p)
	e.waitPod("deadline", "running", time.Minute, func(p *corev1.Pod) bool { return running(p, "main") })
	patch := []byte(`{"spec":{"activeDeadlineSeconds":1}}`)
	if _, err := e.Client.CoreV1().Pods(e.Namespace).Patch(context.Background(), "deadline", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	got := e.waitPod("deadline", "Failed", time.Minute, phaseIs(corev1.PodFailed))
	if got.Status.Reason != "DeadlineExceeded" {
		t.Errorf("reason %q", got.Status.Reason)
	}
	if tm := terminated(got, "main"); tm == nil {
		t.Errorf("main not terminated: %+v", status(got, "main"))
	}
}

func TestEnvFieldRefsConfigMapsAndSecrets(t *testing.T) {
	e := newNodeEnv(t)
	ctx := context.Background()
	if _, err := e.Client.CoreV1().ConfigMaps(e.Namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"color": "blue", "size": "L"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.CoreV1().Secrets(e.Namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec"}, Data: map[string][]byte{"token": []byte("s3cret")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := ctr("main", "sh", "-c", `echo "$PLAIN|$EXPANDED|$NAME|$NS|$APP|$COLOR|$TOKEN|$CFG_size|$NODE|$(pwd)"`)
	c.WorkingDir = t.TempDir()
	c.EnvFrom = []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}
	c.Env = []corev1.EnvVar{
		{Name: "PLAIN", Value: "plain"},
		{Name: "EXPANDED", Value: "$(PLAIN)-x"},
		{Name: "NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
		{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
		{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "COLOR", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "color"}}},
		{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}, Key: "token"}}},
	}
	e.create(e.pod("env", c))
	e.waitPod("env", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	want := fmt.Sprintf("plain|plain-x|env|%s|env|blue|s3cret|L|%s|%s\n", e.Namespace, e.Node, c.WorkingDir)
	if got := e.logs("env", &corev1.PodLogOptions{}); got != want {
		t.Errorf("env output %q, want %q", got, want)
	}
}

func TestMissingConfigMapIsCreateContainerConfigErrorUntilCreated(t *testing.T) {
	e := newNodeEnv(t)
	c := ctr("main", "sh", "-c", `echo "$V"`)
	c.Env = []corev1.EnvVar{{Name: "V", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "later"}, Key: "k"}}}}
	e.create(e.pod("missing", c))
	p := e.waitPod("missing", "CreateContainerConfigError", time.Minute, func(p *corev1.Pod) bool {
		return waitingReason(p, "main") == "CreateContainerConfigError"
	})
	if msg := status(p, "main").State.Waiting.Message; msg != `configmap "later" not found` {
		t.Errorf("message %q", msg)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("phase %s", p.Status.Phase)
	}
	if _, err := e.Client.CoreV1().ConfigMaps(e.Namespace).Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "later"}, Data: map[string]string{"k": "now"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPod("missing", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	if got := e.logs("missing", &corev1.PodLogOptions{}); got != "now\n" {
		t.Errorf("logs %q", got)
	}
}

func TestInitContainersRunInOrderAndFailureFailsPod(t *testing.T) {
	e := newNodeEnv(t)
	ok := e.pod("init-ok", ctr("main", "sh", "-c", "cat /data/order"))
	ok.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mount := []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	ok.Spec.Containers[0].VolumeMounts = mount
	for _, n := range []string{"a", "b"} {
		c := ctr("init-"+n, "sh", "-c", "echo "+n+" >> /data/order")
		c.VolumeMounts = mount
		ok.Spec.InitContainers = append(ok.Spec.InitContainers, c)
	}
	e.create(ok)
	e.waitPod("init-ok", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	if got := e.logs("init-ok", &corev1.PodLogOptions{Container: "main"}); got != "a\nb\n" {
		t.Errorf("init order %q", got)
	}

	bad := e.pod("init-bad", ctr("main", "echo", "never"))
	bad.Spec.InitContainers = []corev1.Container{ctr("init", "sh", "-c", "exit 2")}
	e.create(bad)
	p := e.waitPod("init-bad", "Failed", time.Minute, phaseIs(corev1.PodFailed))
	if tm := terminated(p, "init"); tm == nil || tm.ExitCode != 2 || tm.Reason != "Error" {
		t.Errorf("init terminated = %+v", tm)
	}
	if r := waitingReason(p, "main"); r != "PodInitializing" {
		t.Errorf("main waiting %q", r)
	}
	if condition(p, corev1.PodInitialized) != corev1.ConditionFalse {
		t.Errorf("Initialized = %s", condition(p, corev1.PodInitialized))
	}
}

func TestEmptyDirTerminationMessageAndFallbackToLogs(t *testing.T) {
	e := newNodeEnv(t)
	mount := []corev1.VolumeMount{{Name: "shared", MountPath: "/kubetask-test/shared"}}
	writer := ctr("writer", "sh", "-c", `echo hello > /kubetask-test/shared/f; printf 'result:%s' "$(cat /kubetask-test/shared/f)" > /dev/termination-log`)
	writer.VolumeMounts = mount
	// The node creates mount points on the host (empty); remove them after.
	for _, p := range []string{"/kubetask-test", "/kubetask-test/shared", "/tmp/kubetask-custom-term"} { // cleanups run in reverse
		if _, err := os.Stat(p); os.IsNotExist(err) {
			t.Cleanup(func() { _ = os.Remove(p) }) // only if still empty
		}
	}
	custom := ctr("custom", "sh", "-c", `sleep 0.3; cat /kubetask-test/shared/f > /tmp/kubetask-custom-term`)
	custom.VolumeMounts = mount
	custom.TerminationMessagePath = "/tmp/kubetask-custom-term"
	fallback := ctr("fallback", "sh", "-c", `echo last words; exit 4`)
	fallback.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	big := ctr("big", "sh", "-c", `head -c 10000 /dev/zero | tr '\0' y > /dev/termination-log`)
	p := e.pod("messages", writer, custom, fallback, big)
	p.Spec.Volumes = []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	e.create(p)
	got := e.waitPod("messages", "Failed", time.Minute, phaseIs(corev1.PodFailed))
	want := map[string]string{"writer": "result:hello", "custom": "hello\n", "fallback": "last words\n"}
	for name, msg := range want {
		if tm := terminated(got, name); tm == nil || tm.Message != msg {
			t.Errorf("%s terminated = %+v, want message %q", name, tm, msg)
		}
	}
	if tm := terminated(got, "big"); tm == nil || len(tm.Message) != 4096 {
		t.Errorf("big message not capped at 4096 bytes: %+v", tm)
	}
	if _, err := os.Stat("/tmp/kubetask-custom-term"); err == nil {
		if b, _ := os.ReadFile("/tmp/kubetask-custom-term"); len(b) > 0 {
			t.Errorf("termination message leaked to the host path")
		}
	}
}

func TestImageAndCommandErrors(t *testing.T) {
	e := newNodeEnv(t)
	pull := ctr("main", "true")
	pull.Image = localnode.PullErrorImagePrefix + "x:1"
	e.create(e.pod("pull", pull))
	e.waitPod("pull", "ErrImagePull", time.Minute, func(p *corev1.Pod) bool { return waitingReason(p, "main") == "ErrImagePull" })
	e.waitPod("pull", "ImagePullBackOff", time.Minute, func(p *corev1.Pod) bool { return waitingReason(p, "main") == "ImagePullBackOff" })

	invalid := ctr("main", "true")
	invalid.Image = localnode.InvalidNameImage
	e.create(e.pod("invalid", invalid))
	e.waitPod("invalid", "InvalidImageName", time.Minute, func(p *corev1.Pod) bool { return waitingReason(p, "main") == "InvalidImageName" })

	nocmd := ctr("main")
	e.create(e.pod("nocmd", nocmd))
	p := e.waitPod("nocmd", "CreateContainerError", time.Minute, func(p *corev1.Pod) bool { return waitingReason(p, "main") == "CreateContainerError" })
	if msg := status(p, "main").State.Waiting.Message; !strings.Contains(msg, "no command") {
		t.Errorf("message %q", msg)
	}

	e.create(e.pod("notfound", ctr("main", "kubetask-no-such-command")))
	p = e.waitPod("notfound", "Failed", time.Minute, phaseIs(corev1.PodFailed))
	if tm := terminated(p, "main"); tm == nil || tm.Reason != "StartError" || tm.ExitCode != 128 {
		t.Errorf("terminated = %+v", tm)
	}
}

func TestNodeRestartMarksLostPodsFailed(t *testing.T) {
	env := clustertest.New(t)
	name := "ln-" + rand.String(6)
	stop := startLocalNode(t, env, name)
	e := &nodeEnv{Env: env, t: t, Node: name, stop: stop}
	e.create(e.pod("lost", ctr("main", "sh", "-c", trapTERM)))
	e.waitPod("lost", "running", time.Minute, func(p *corev1.Pod) bool { return running(p, "main") })
	stop()
	stop2 := startLocalNode(t, env, name)
	t.Cleanup(func() {
		stop2()
		_ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	p := e.waitPod("lost", "Failed", time.Minute, phaseIs(corev1.PodFailed))
	if tm := terminated(p, "main"); tm == nil || tm.ExitCode != 137 || tm.Reason != "ContainerStatusUnknown" {
		t.Errorf("terminated = %+v", tm)
	}
}

// TestStatusWritesKeepMetadata: the node's status writes must not bring back
// metadata changed by others in the meantime (a finalizer removed by a
// controller while the containers still ran).
func TestStatusWritesKeepMetadata(t *testing.T) {
	e := newNodeEnv(t)
	const n = 6
	for i := 0; i < n; i++ {
		p := e.pod(fmt.Sprintf("meta-%d", i), ctr("main", "sh", "-c", "sleep 1; echo done"))
		p.Finalizers = []string{"example.com/hold"}
		e.create(p)
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("meta-%d", i)
		e.waitPod(name, "running", time.Minute, phaseIs(corev1.PodRunning))
		if _, err := e.Client.CoreV1().Pods(e.Namespace).Patch(context.Background(), name, types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		p := e.waitPod(fmt.Sprintf("meta-%d", i), "succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
		if len(p.Finalizers) != 0 {
			t.Errorf("%s: finalizers %v came back after the node wrote its status", p.Name, p.Finalizers)
		}
	}
}
