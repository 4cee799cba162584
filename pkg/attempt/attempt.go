package attempt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/util/retry"
	"k8s.io/streaming/pkg/httpstream"
	utilexec "k8s.io/utils/exec"

	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/task"
)

// ErrResultTooLarge reports a result larger than the task's result.maxBytes.
var ErrResultTooLarge = errors.New("result too large")

// ErrNoResult reports that the main container left no result where the task said it would.
var ErrNoResult = errors.New("no result")

// Execer runs a command in a container of a pod through the API server.
type Execer interface {
	// Exec runs cmd in container of pod namespace/name, writing its output to
	// stdout and stderr. A command that ran and exited non-zero returns an
	// error for which ExitCode reports the code.
	Exec(ctx context.Context, namespace, name, container string, cmd []string, stdout, stderr io.Writer) error
}

// ExitCode returns the exit code of a command that ran and failed, and false
// for other errors (the command could not be run at all).
func ExitCode(err error) (int, bool) {
	var ee utilexec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitStatus(), true
	}
	return 0, false
}

// NewExecer returns an Execer for the cluster of cfg. It speaks WebSocket and
// falls back to SPDY for servers or nodes that do not.
func NewExecer(cfg *rest.Config, client kubernetes.Interface) Execer {
	return &apiExecer{cfg: cfg, client: client}
}

type apiExecer struct {
	cfg    *rest.Config
	client kubernetes.Interface
}

func (e *apiExecer) Exec(ctx context.Context, namespace, name, container string, cmd []string, stdout, stderr io.Writer) error {
	req := e.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(e.cfg, "GET", req.URL().String())
	if err != nil {
		return fmt.Errorf("exec in %s/%s[%s]: %w", namespace, name, container, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(e.cfg, "POST", req.URL())
	if err != nil {
		return fmt.Errorf("exec in %s/%s[%s]: %w", namespace, name, container, err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return fmt.Errorf("exec in %s/%s[%s]: %w", namespace, name, container, err)
	}
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
	if err != nil && (httpstream.IsUpgradeFailure(err) || strings.Contains(err.Error(), "unable to upgrade connection")) {
		// client-go reports a refused upgrade (403, 401, 404) as an untyped
		// error. The same request without the upgrade is answered with the
		// API server's typed Status, so callers can tell "forbidden" (RBAC)
		// from a passing failure.
		if perr := req.Do(ctx).Error(); apierrors.IsForbidden(perr) || apierrors.IsUnauthorized(perr) || apierrors.IsNotFound(perr) {
			return fmt.Errorf("exec in %s/%s[%s]: %w", namespace, name, container, perr)
		}
	}
	return err
}

// ResultRetryable reports whether reading a result failed for a reason that
// may pass (a dropped connection, an API server restart, a slow node) so that
// another read may succeed. It is false for a result that is missing or too
// large, for an exec the API server forbids (RBAC: create on pods/exec), and
// when the result holder of pod no longer runs (the pod is being deleted,
// evicted or stopped: the holder exits on SIGTERM and takes the file with it).
// A caller that retries must still bound the total time it tries.
func ResultRetryable(err error, pod *corev1.Pod) bool {
	switch {
	case err == nil, errors.Is(err, ErrNoResult), errors.Is(err, ErrResultTooLarge),
		apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsNotFound(err):
		return false
	case pod == nil || pod.DeletionTimestamp != nil || podstate.Stopped(pod):
		return false
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == task.ResultContainer {
			return st.State.Running != nil
		}
	}
	return false
}

// ReadResult returns the result t's main container left in pod, whose main
// container has terminated. For File results it execs task.ReadResultCommand
// in the result-holder container, which must still run (read before Stop).
// It returns (nil, nil) when t has no result, ErrNoResult when the result is
// missing and ErrResultTooLarge when it exceeds result.maxBytes.
func ReadResult(ctx context.Context, ex Execer, pod *corev1.Pod, t *task.Task) ([]byte, error) {
	r := t.Spec.Result
	if r == nil {
		return nil, nil
	}
	limit := r.Bytes()
	switch r.From {
	case task.ResultFromTerminationMessage:
		for _, st := range pod.Status.ContainerStatuses {
			if st.Name != t.Spec.MainContainer {
				continue
			}
			term := st.State.Terminated
			if term == nil {
				term = st.LastTerminationState.Terminated
			}
			if term == nil {
				return nil, fmt.Errorf("%w: main container %q has not terminated", ErrNoResult, st.Name)
			}
			if int64(len(term.Message)) > limit {
				return nil, fmt.Errorf("%w: termination message is %d bytes, result.maxBytes is %d", ErrResultTooLarge, len(term.Message), limit)
			}
			return []byte(term.Message), nil
		}
		return nil, fmt.Errorf("%w: no status for main container %q", ErrNoResult, t.Spec.MainContainer)
	case task.ResultFromFile:
		if ex == nil {
			return nil, errors.New("reading result: no way to exec into the result holder (no REST config)")
		}
		var out, errb bytes.Buffer
		err := ex.Exec(ctx, pod.Namespace, pod.Name, task.ResultContainer, task.ReadResultCommand(t), &out, &errb)
		if code, ok := ExitCode(err); ok {
			return nil, fmt.Errorf("%w: reading %s failed (exit %d): %s", ErrNoResult, r.Path, code, bytes.TrimSpace(errb.Bytes()))
		}
		if err != nil {
			return nil, fmt.Errorf("reading result %s: %w", r.Path, err)
		}
		if int64(out.Len()) > limit {
			return nil, fmt.Errorf("%w: %s is larger than result.maxBytes (%d bytes)", ErrResultTooLarge, r.Path, limit)
		}
		return out.Bytes(), nil
	}
	return nil, fmt.Errorf("unknown result source %q", r.From)
}

// Stop makes the kubelet stop every container of pod by lowering
// spec.activeDeadlineSeconds to podstate.StopDeadlineSeconds: the pod then
// ends Failed/DeadlineExceeded while podstate keeps the main container's own
// outcome. A pod that has not started on a node is deleted instead. Stop
// needs neither exec nor a special image, so it works for distroless
// sidecars. It does nothing for a pod that is gone or being deleted.
func Stop(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, now time.Time) error {
	if pod.DeletionTimestamp != nil {
		return nil
	}
	secs, ok := podstate.StopDeadlineSeconds(pod, now)
	if !ok {
		err := client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting unstarted pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		return nil
	}
	if cur := pod.Spec.ActiveDeadlineSeconds; cur != nil && *cur <= secs {
		return nil // already stopping
	}
	patch := fmt.Sprintf(`{"spec":{"activeDeadlineSeconds":%d}}`, secs)
	_, err := client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("stopping pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// Release removes kubetask's finalizer from the pod namespace/name and, when
// markReleased is set (a pod that is kept), labels it task.LabelReleased so
// that executors' informers let go of it. It reads the pod fresh and retries
// on conflicts; a pod that is gone or already released is not an error. Call
// it only after the attempt's outcome is recorded: from then on the pod may
// vanish at any time.
func Release(ctx context.Context, client kubernetes.Interface, namespace, name string, markReleased bool) error {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		i := slices.Index(pod.Finalizers, task.Finalizer)
		mark := markReleased && pod.Labels[task.LabelReleased] != "true"
		if i < 0 && !mark {
			return nil
		}
		if i >= 0 {
			pod.Finalizers = slices.Delete(pod.Finalizers, i, i+1)
		}
		if mark {
			if pod.Labels == nil {
				pod.Labels = map[string]string{}
			}
			pod.Labels[task.LabelReleased] = "true"
		}
		_, err = client.CoreV1().Pods(namespace).Update(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing finalizer from pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// ReleaseSeen does what Release does for pod, a copy the caller has seen
// (from an informer cache), in one request: a JSON patch that tests the
// finalizer is still at the index the copy shows, then removes it (and adds
// the released label when markReleased is set). When the pod changed in
// between, it falls back to Release. Same guarantees as Release, one API call
// instead of two in the common case.
func ReleaseSeen(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, markReleased bool) error {
	i := slices.Index(pod.Finalizers, task.Finalizer)
	mark := markReleased && pod.Labels[task.LabelReleased] != "true"
	var ops []string
	if i >= 0 {
		ops = append(ops, fmt.Sprintf(`{"op":"test","path":"/metadata/finalizers/%d","value":%q}`, i, task.Finalizer),
			fmt.Sprintf(`{"op":"remove","path":"/metadata/finalizers/%d"}`, i))
	}
	if mark {
		if len(pod.Labels) == 0 {
			ops = append(ops, `{"op":"add","path":"/metadata/labels","value":{}}`)
		}
		ops = append(ops, fmt.Sprintf(`{"op":"add","path":"/metadata/labels/%s","value":"true"}`, strings.ReplaceAll(task.LabelReleased, "/", "~1")))
	}
	if len(ops) == 0 {
		return nil
	}
	patch := "[" + strings.Join(ops, ",") + "]"
	_, err := client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
	switch {
	case err == nil, apierrors.IsNotFound(err):
		return nil
	case apierrors.IsInvalid(err) || apierrors.IsConflict(err) || apierrors.IsBadRequest(err):
		return Release(ctx, client, pod.Namespace, pod.Name, markReleased) // the finalizers moved
	default:
		return fmt.Errorf("removing finalizer from pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
}

// ShouldDelete reports whether cleanup policy c deletes the pod of an attempt
// that ended with outcome s.
func ShouldDelete(c task.Cleanup, s podstate.State) bool {
	switch c {
	case task.CleanupKeep:
		return false
	case task.CleanupDeleteSucceeded:
		return s.Phase == podstate.Succeeded
	default:
		return true
	}
}

// Delete deletes the pod namespace/name with its own grace period; a pod that
// is gone is not an error.
func Delete(ctx context.Context, client kubernetes.Interface, namespace, name string) error {
	err := client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// Fenced reports whether pod still carries the fence's scheduling gate
// (task.FenceGate): it was never scheduled, so none of its containers ran.
func Fenced(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == task.FenceGate })
}

// Ungate removes the fence's scheduling gate from pod (a copy the caller has
// seen), so that it is scheduled and runs: call it only once the store
// records pod, by its UID, as its attempt's. One JSON patch that tests the
// pod's UID and the gate's place first, so that it never ungates another pod
// with the same name; a pod that is gone, or no longer gated, is not an
// error.
func Ungate(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) error {
	for range 3 {
		i := slices.IndexFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == task.FenceGate })
		if i < 0 {
			return nil
		}
		patch := fmt.Sprintf(`[%s{"op":"test","path":"/spec/schedulingGates/%d/name","value":%q},{"op":"remove","path":"/spec/schedulingGates/%d"}]`,
			uidTest(pod.UID), i, task.FenceGate, i)
		_, err := client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsInvalid(err) && !apierrors.IsConflict(err) && !apierrors.IsBadRequest(err):
			return fmt.Errorf("ungating pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		// A test failed: the gates moved, or the name is another pod's now.
		live, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("ungating pod %s/%s: %w", pod.Namespace, pod.Name, err)
		case live.UID != pod.UID:
			return nil // not the pod the store records: never ungate it
		}
		pod = live
	}
	return fmt.Errorf("ungating pod %s/%s: its scheduling gates kept changing", pod.Namespace, pod.Name)
}

// Discard deletes pod (a copy the caller has seen) and removes kubetask's
// finalizer from it, both only while the name is still that pod's (a UID
// precondition): a pod the fence kept from running, whose record is not its,
// is thrown away without an outcome. A pod that is gone is not an error.
func Discard(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) error {
	uid := pod.UID
	var pre *metav1.Preconditions
	if uid != "" {
		pre = &metav1.Preconditions{UID: &uid}
	}
	err := client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: pre})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err): // gone, or another pod now
		return nil
	case err != nil:
		return fmt.Errorf("discarding pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	i := slices.Index(pod.Finalizers, task.Finalizer)
	if i < 0 {
		return nil
	}
	patch := fmt.Sprintf(`[%s{"op":"test","path":"/metadata/finalizers/%d","value":%q},{"op":"remove","path":"/metadata/finalizers/%d"}]`,
		uidTest(uid), i, task.Finalizer, i)
	_, err = client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
	switch {
	case err == nil, apierrors.IsNotFound(err):
		return nil
	case apierrors.IsInvalid(err) || apierrors.IsConflict(err) || apierrors.IsBadRequest(err):
		live, gerr := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) || gerr == nil && live.UID != uid {
			return nil
		}
		if gerr != nil {
			return fmt.Errorf("discarding pod %s/%s: %w", pod.Namespace, pod.Name, gerr)
		}
		return Release(ctx, client, pod.Namespace, pod.Name, false)
	default:
		return fmt.Errorf("discarding pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
}

// uidTest is a JSON patch's test that the pod is the one of UID uid (none
// for an empty UID: a pod the API server returned always has one).
func uidTest(uid types.UID) string {
	if uid == "" {
		return ""
	}
	return fmt.Sprintf(`{"op":"test","path":"/metadata/uid","value":%q},`, uid)
}
