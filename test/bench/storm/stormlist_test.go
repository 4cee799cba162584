package storm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/test/exectest"
)

// TestStormListSeesAnEndWhileTheWatchIsUnanswered: in a 410 storm the
// executor's pod cache LISTs while a WATCH request is unanswered (storm
// lists, docs/executor.md). On the real API server: the executor's pod
// watch is dropped and etcd compacted, so the watch resumes into 410
// Expired and the cache relists; the WATCH request after that relist is
// held unanswered by the client, as a slow API server would. Only then
// does kwok end the task's pod, and the executor must record the outcome
// while that request is still held, from a consistent LIST of its own and
// no relist of the Reflector. Without storm lists nothing shows the pod's
// end until the WATCH request is answered.
func TestStormListSeesAnEndWhileTheWatchIsUnanswered(t *testing.T) {
	env := clustertest.New(t)
	reg := prometheus.NewRegistry()
	base, err := executor.NewClient(env.Config, qps, burst, reg)
	if err != nil {
		t.Fatal(err)
	}
	client := newStormClient(base)
	evs := exectest.NewEvents()
	ex, _ := exectest.StartExecutor(t, env, executor.Config{Store: store.NewMemory(), OnEvent: evs.Add, Registerer: reg, Client: client, QPS: qps, Burst: burst})
	defer client.Release()
	exectest.Submit(t, ex, "held", exectest.SimTask("held", nil)) // runs until told to end
	pods := env.Client.CoreV1().Pods(env.Namespace)
	var pod string
	clustertest.Eventually(t, time.Minute, "the task's pod running", func(ctx context.Context) error {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) != 1 || l.Items[0].Status.Phase != corev1.PodRunning {
			return fmt.Errorf("%d pods, none running yet", len(l.Items))
		}
		pod = l.Items[0].Name
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	noise, err := env.Client.CoreV1().ConfigMaps(env.Namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "noise"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expired0, _ := client.trace.counts()
	client.HoldAfterList()
	if _, err := stormStep(ctx, env, client, noise); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, time.Minute, "a 410 and the WATCH request after the relist held", func(context.Context) error {
		expired, _ := client.trace.counts()
		if waiting, _, _ := client.Held(); expired == expired0 || waiting == 0 {
			return fmt.Errorf("410s %d, WATCH requests held %d", expired-expired0, waiting)
		}
		return nil
	})

	// kwok ends the pod's containers once the annotation says so.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		kwokstages.CompleteAfter: "0s", kwokstages.CompleteCode: "0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Patch(ctx, pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, time.Minute, "the outcome recorded while the WATCH request is held", func(context.Context) error {
		if waiting, _, _ := client.Held(); waiting == 0 {
			return errors.New("no WATCH request held any more: the test is over before it could prove anything")
		}
		if len(evs.Terminal("held")) == 0 {
			return errors.New("no outcome yet")
		}
		return nil
	})
	waiting, consistent, other := client.Held()
	t.Logf("while the WATCH request was held: %d consistent LISTs (storm lists), %d others", consistent, other)
	if waiting == 0 || consistent == 0 || other != 0 {
		t.Errorf("the outcome came with %d WATCH requests held, %d storm lists and %d other LISTs meanwhile; want it from a storm list while a request is held", waiting, consistent, other)
	}
	client.Release()
	term := evs.Terminal("held")
	if len(term) != 1 || podstate.Phase(term[0].Phase) != podstate.Succeeded {
		t.Errorf("terminal events %+v, want one Succeeded", term)
	}
	exectest.WaitNoTaskPods(t, env, time.Minute)
}
