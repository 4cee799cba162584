package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/simulation"
)

// contractScenario runs requests against a PodInterface and returns what a
// client can observe of the answers, one line each: the contract the
// simulator's API server must keep with kube-apiserver.
type contractScenario func(ctx context.Context, pods corev1client.PodInterface, name func(string) string, expire func(context.Context) error) []string

// answer is what a client sees of an error: its HTTP code and reason.
func answer(err error) string {
	if err == nil {
		return "ok"
	}
	var st apierrors.APIStatus
	if s, ok := err.(apierrors.APIStatus); ok {
		st = s
		return fmt.Sprintf("%d %s", st.Status().Code, st.Status().Reason)
	}
	return "error: " + err.Error()
}

// shape is what the contract looks at in a stored pod.
func shape(p *corev1.Pod, err error) string {
	if err != nil {
		return answer(err)
	}
	grace := "-"
	if g := p.DeletionGracePeriodSeconds; g != nil {
		grace = fmt.Sprint(*g)
	}
	ads := "-"
	if a := p.Spec.ActiveDeadlineSeconds; a != nil {
		ads = fmt.Sprint(*a)
	}
	gates := make([]string, len(p.Spec.SchedulingGates))
	for i, g := range p.Spec.SchedulingGates {
		gates[i] = g.Name
	}
	return fmt.Sprintf("deleting=%v grace=%s finalizers=%v gates=%v activeDeadlineSeconds=%s",
		p.DeletionTimestamp != nil, grace, p.Finalizers, gates, ads)
}

// contractPod is a pod that no node takes (its node selector matches none),
// so that the real scheduler leaves it unbound as the simulated one does.
func contractPod(name string, edit func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeSelector:  map[string]string{"kubetask.dev/contract": "no-such-node"},
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"true"}}},
		},
	}
	if edit != nil {
		edit(p)
	}
	return p
}

var contractScenarios = map[string]contractScenario{
	"spec.nodeName with scheduling gates is refused; without gates accepted": func(ctx context.Context, pods corev1client.PodInterface, name func(string) string, _ func(context.Context) error) []string {
		_, err := pods.Create(ctx, contractPod(name("a"), func(p *corev1.Pod) {
			p.Spec.NodeName = "no-such-node"
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kubetask.dev/fence"}}
		}), metav1.CreateOptions{})
		_, err2 := pods.Create(ctx, contractPod(name("b"), func(p *corev1.Pod) { p.Spec.NodeName = "no-such-node" }), metav1.CreateOptions{})
		return []string{answer(err), answer(err2)}
	},
	"a gate is removed by a JSON patch whose UID test passes, never added, never removed past a failed test": func(ctx context.Context, pods corev1client.PodInterface, name func(string) string, _ func(context.Context) error) []string {
		p, err := pods.Create(ctx, contractPod(name("a"), func(p *corev1.Pod) {
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kubetask.dev/fence"}}
		}), metav1.CreateOptions{})
		if err != nil {
			return []string{answer(err)}
		}
		out := []string{shape(p, nil)}
		wrong := fmt.Sprintf(`[{"op":"test","path":"/metadata/uid","value":"not-%s"},{"op":"remove","path":"/spec/schedulingGates/0"}]`, p.UID)
		_, err = pods.Patch(ctx, p.Name, types.JSONPatchType, []byte(wrong), metav1.PatchOptions{})
		out = append(out, answer(err), shape(pods.Get(ctx, p.Name, metav1.GetOptions{})))
		right := fmt.Sprintf(`[{"op":"test","path":"/metadata/uid","value":%q},{"op":"remove","path":"/spec/schedulingGates/0"}]`, p.UID)
		_, err = pods.Patch(ctx, p.Name, types.JSONPatchType, []byte(right), metav1.PatchOptions{})
		out = append(out, answer(err), shape(pods.Get(ctx, p.Name, metav1.GetOptions{})))
		add := `[{"op":"add","path":"/spec/schedulingGates","value":[{"name":"late"}]}]`
		_, err = pods.Patch(ctx, p.Name, types.JSONPatchType, []byte(add), metav1.PatchOptions{})
		return append(out, answer(err), shape(pods.Get(ctx, p.Name, metav1.GetOptions{})))
	},
	"a finalizer keeps a deleted pod on no node (grace 0) until a JSON patch removes it": func(ctx context.Context, pods corev1client.PodInterface, name func(string) string, _ func(context.Context) error) []string {
		p, err := pods.Create(ctx, contractPod(name("a"), func(p *corev1.Pod) { p.Finalizers = []string{"kubetask.dev/outcome"} }), metav1.CreateOptions{})
		if err != nil {
			return []string{answer(err)}
		}
		out := []string{answer(pods.Delete(ctx, p.Name, metav1.DeleteOptions{}))}
		out = append(out, shape(pods.Get(ctx, p.Name, metav1.GetOptions{})))
		wrong := `[{"op":"test","path":"/metadata/finalizers/0","value":"someone-else"},{"op":"remove","path":"/metadata/finalizers/0"}]`
		_, err = pods.Patch(ctx, p.Name, types.JSONPatchType, []byte(wrong), metav1.PatchOptions{})
		out = append(out, answer(err), shape(pods.Get(ctx, p.Name, metav1.GetOptions{})))
		right := `[{"op":"test","path":"/metadata/finalizers/0","value":"kubetask.dev/outcome"},{"op":"remove","path":"/metadata/finalizers/0"}]`
		_, err = pods.Patch(ctx, p.Name, types.JSONPatchType, []byte(right), metav1.PatchOptions{})
		out = append(out, answer(err))
		// The object goes once its last finalizer is removed: a Get right
		// after may race nothing, the answer is final.
		_, err = pods.Get(ctx, p.Name, metav1.GetOptions{})
		return append(out, answer(err))
	},
	"a delete whose UID precondition fails is a conflict and deletes nothing": func(ctx context.Context, pods corev1client.PodInterface, name func(string) string, _ func(context.Context) error) []string {
		p, err := pods.Create(ctx, contractPod(name("a"), nil), metav1.CreateOptions{})
		if err != nil {
			return []string{answer(err)}
		}
		other := types.UID("not-" + string(p.UID))
		out := []string{answer(pods.Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &other}}))}
		out = append(out, shape(pods.Get(ctx, p.Name, metav1.GetOptions{})))
		out = append(out, answer(pods.Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})))
		_, err = pods.Get(ctx, p.Name, metav1.GetOptions{})
		return append(out, answer(err))
	},
	"activeDeadlineSeconds may be set and lowered, never raised": func(ctx context.Context, pods corev1client.PodInterface, name func(string) string, _ func(context.Context) error) []string {
		p, err := pods.Create(ctx, contractPod(name("a"), nil), metav1.CreateOptions{})
		if err != nil {
			return []string{answer(err)}
		}
		var out []string
		for _, secs := range []int{100, 50, 200} {
			_, err := pods.Patch(ctx, p.Name, types.MergePatchType, fmt.Appendf(nil, `{"spec":{"activeDeadlineSeconds":%d}}`, secs), metav1.PatchOptions{})
			out = append(out, fmt.Sprintf("to %d: %s", secs, answer(err)), shape(pods.Get(ctx, p.Name, metav1.GetOptions{})))
		}
		return out
	},
	"pods/log of a pod that has not started, with previous, of another container, of no pod": func(ctx context.Context, pods corev1client.PodInterface, name func(string) string, _ func(context.Context) error) []string {
		p, err := pods.Create(ctx, contractPod(name("a"), nil), metav1.CreateOptions{})
		if err != nil {
			return []string{answer(err)}
		}
		read := func(pod string, opts *corev1.PodLogOptions) string {
			rc, err := pods.GetLogs(pod, opts).Stream(ctx)
			if err == nil {
				_ = rc.Close()
			}
			return answer(err)
		}
		return []string{
			read(p.Name, &corev1.PodLogOptions{Container: "main", Follow: true, Timestamps: true}),
			read(p.Name, &corev1.PodLogOptions{Container: "main", Previous: true, Timestamps: true}),
			read(p.Name, &corev1.PodLogOptions{Container: "other"}),
			read(name("none"), &corev1.PodLogOptions{Container: "main"}),
		}
	},
	"a watch from a resourceVersion the server no longer has ends with 410 Expired; from the list after it, it goes on": func(ctx context.Context, pods corev1client.PodInterface, name func(string) string, expire func(context.Context) error) []string {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return []string{"list: " + answer(err)}
		}
		if _, err := pods.Create(ctx, contractPod(name("a"), nil), metav1.CreateOptions{}); err != nil {
			return []string{answer(err)}
		}
		if err := expire(ctx); err != nil {
			return []string{"expire: " + err.Error()}
		}
		first := func(rv string) string {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			w, err := pods.Watch(wctx, metav1.ListOptions{ResourceVersion: rv})
			if err != nil {
				return "watch: " + answer(err)
			}
			defer w.Stop()
			select {
			case ev, ok := <-w.ResultChan():
				switch {
				case !ok:
					return "watch closed"
				case ev.Type == watch.Error:
					return "ERROR " + answer(apierrors.FromObject(ev.Object))
				}
				return string(ev.Type)
			case <-wctx.Done():
				return "no event within 10 s"
			}
		}
		out := []string{first(l.ResourceVersion)}
		// The relist: a fresh list's version is one the server has.
		l, err = pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return append(out, "relist: "+answer(err))
		}
		if _, err := pods.Create(ctx, contractPod(name("b"), nil), metav1.CreateOptions{}); err != nil {
			return append(out, answer(err))
		}
		return append(out, first(l.ResourceVersion))
	},
}

// TestSimulatedAPIServerKeepsTheContract runs each scenario against the
// simulator's API server (internal/simulation) and against this cluster's
// kube-apiserver and requires the same answers: what the simulator models
// of the API server (scheduling gates and nodeName, finalizers and deletion
// grace, UID preconditions, JSON-patch tests, activeDeadlineSeconds, 410 on
// a watch from a version no longer held, pods/log refused for a container
// that has not started) is what the real one does. The
// simulator complements the real-cluster tests; this keeps it honest.
func TestSimulatedAPIServerKeepsTheContract(t *testing.T) {
	env := clustertest.New(t)
	sim, simExpire, stop := simulation.ContractClient()
	defer stop()
	restart := func(ctx context.Context) error { return env.Cluster.RestartAPIServer(ctx) }
	compact := func(context.Context) error { simExpire(); return nil }
	for title, sc := range contractScenarios {
		t.Run(title, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			prefix := fmt.Sprintf("c%x", len(title)+int(time.Now().UnixNano()%4096))
			name := func(s string) string { return strings.ToLower(prefix + "-" + s) }
			kube := sc(ctx, env.Client.CoreV1().Pods(env.Namespace), name, restart)
			simulated := sc(ctx, sim.CoreV1().Pods(env.Namespace), name, compact)
			if d := cmp.Diff(kube, simulated); d != "" {
				t.Errorf("the simulated API server answers otherwise than kube-apiserver (-real +simulated):\n%s", d)
			}
			t.Logf("both: %q", kube)
		})
	}
}
