package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// fakeClusters is a service's clusters: east and west, west lost.
type fakeClusters struct {
	state   map[string]string
	clients map[string]kubernetes.Interface
	drains  int
}

func (f *fakeClusters) ListClusters(context.Context) ([]api.Cluster, error) {
	return []api.Cluster{{Name: "east", State: f.state["east"]}, {Name: "west", State: f.state["west"]}}, nil
}

// Shown shows the tasks on west as the service shows those of an
// unreachable cluster.
func (f *fakeClusters) Shown(rec store.Record) store.Record {
	if rec.Cluster == "west" && !rec.Terminal {
		rec.Reason, rec.Message = "ClusterUnreachable", "cluster west has not answered"
	}
	return rec
}

// Client is each cluster's client (none for one not configured).
func (f *fakeClusters) Client(name string) kubernetes.Interface {
	return f.clients[name]
}

func (f *fakeClusters) Lose(_ context.Context, name string) (api.Cluster, error) {
	f.drains++
	if _, ok := f.state[name]; !ok {
		return api.Cluster{}, fmt.Errorf("cluster %s: %w", name, store.ErrNotFound)
	}
	f.state[name] = "Lost"
	return api.Cluster{Name: name, State: "Lost"}, nil
}

func (f *fakeClusters) Drain(_ context.Context, name string, draining bool) (api.Cluster, error) {
	f.drains++
	st, ok := f.state[name]
	switch {
	case !ok:
		return api.Cluster{}, fmt.Errorf("cluster %s: %w", name, store.ErrNotFound)
	case st == "Lost":
		return api.Cluster{}, fmt.Errorf("%w: cluster %s is Lost", server.ErrClusterState, name)
	}
	f.state[name] = map[bool]string{true: "Draining", false: "Ready"}[draining]
	return api.Cluster{Name: name, State: f.state[name]}, nil
}

// TestClusters: GET /clusters and POST /clusters/{name}/drain and /resume
// are for callers allowed every namespace (a token for some namespaces is
// refused, 403, and drains nothing); an unknown cluster is 404, a state
// that does not allow it 409; a service on one cluster lists none.
func TestClusters(t *testing.T) {
	fc := &fakeClusters{state: map[string]string{"east": "Ready", "west": "Lost"}}
	h := newHarness(t, func(c *server.Config) {
		auth, err := server.NewTokenAuth([]server.Token{
			{Token: "admin", Subject: "admin", Namespaces: server.Namespaces{"*"}},
			{Token: "team", Subject: "team-a", Namespaces: server.Namespaces{"team-a"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth, c.Clusters = auth, fc
	})
	admin, team := []string{"Authorization", "Bearer admin"}, []string{"Authorization", "Bearer team"}
	for _, c := range []struct {
		method, path string
		as           []string
		status       int
		want         string
	}{
		{http.MethodGet, "/clusters", team, http.StatusForbidden, "team-a may not list tasks in every namespace"},
		{http.MethodPost, "/clusters/east/drain", team, http.StatusForbidden, "team-a may not drain, resume or declare lost clusters in every namespace"},
		{http.MethodGet, "/clusters", admin, http.StatusOK, `"name":"east","state":"Ready"`},
		{http.MethodPost, "/clusters/east/drain", admin, http.StatusOK, `"state":"Draining"`},
		{http.MethodGet, "/clusters", admin, http.StatusOK, `"name":"east","state":"Draining"`},
		{http.MethodPost, "/clusters/east/resume", admin, http.StatusOK, `"state":"Ready"`},
		{http.MethodPost, "/clusters/west/drain", admin, http.StatusConflict, "cluster west is Lost"},
		{http.MethodPost, "/clusters/north/drain", admin, http.StatusNotFound, `no cluster \"north\"`},
		{http.MethodPost, "/clusters/east/drain?force=true", admin, http.StatusBadRequest, "force"},
		{http.MethodPost, "/clusters/east/lose", team, http.StatusForbidden, "team-a may not drain, resume or declare lost clusters"},
		{http.MethodPost, "/clusters/east/lose", admin, http.StatusOK, `"state":"Lost"`},
		{http.MethodPost, "/clusters/north/lose", admin, http.StatusNotFound, `no cluster \"north\"`},
	} {
		resp, b := h.do(c.method, api.Prefix+c.path, nil, c.as...)
		if resp.StatusCode != c.status || !strings.Contains(string(b), c.want) {
			t.Errorf("%s %s as %s: %s %s; want %d with %q", c.method, c.path, c.as[1], resp.Status, b, c.status, c.want)
		}
	}
	if fc.drains != 6 {
		t.Errorf("%d drains and losses reached the clusters, want 6 (none of the refused callers')", fc.drains)
	}

	one := newHarness(t, nil)
	resp, b := one.do(http.MethodGet, api.Prefix+"/clusters", nil)
	var list api.ClusterList
	if err := json.Unmarshal(b, &list); resp.StatusCode != http.StatusOK || err != nil || list.Items == nil || len(list.Items) != 0 {
		t.Errorf("a service on one cluster: %s %s; want an empty list", resp.Status, b)
	}
	if resp, b := one.do(http.MethodPost, api.Prefix+"/clusters/east/drain", nil); resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "runs tasks on one cluster") {
		t.Errorf("drain on a service on one cluster: %s %s", resp.Status, b)
	}
}

// TestClusterInListsAndWatches: a list shows each task as the service's
// clusters show it (a task on a cluster that does not answer says
// ClusterUnreachable, its stored reason untouched); a watch's events name
// their attempt's cluster, ?cluster= keeps one cluster's, and a cluster
// that is not a valid name is refused naming the parameter.
func TestClusterInListsAndWatches(t *testing.T) {
	fc := &fakeClusters{state: map[string]string{"east": "Ready", "west": "Unreachable"}}
	h := newHarness(t, func(c *server.Config) { c.Clusters = fc })
	onEast, onWest := h.mustSubmit("default", taskDoc("on-east")), h.mustSubmit("default", taskDoc("on-west"))
	for id, cluster := range map[string]string{onEast.ID: "east", onWest.ID: "west"} {
		rec, err := h.store.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		rec.Cluster = cluster
		if _, err := h.store.Update(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
	resp, b := h.do(http.MethodGet, api.Prefix+"/tasks", nil)
	var list api.TaskList
	if err := json.Unmarshal(b, &list); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("list: %s %s", resp.Status, b)
	}
	reasons := map[string]string{}
	for _, it := range list.Items {
		reasons[it.Cluster] = it.Reason
	}
	if reasons["west"] != "ClusterUnreachable" || reasons["east"] == "ClusterUnreachable" {
		t.Errorf("listed reasons by cluster %v: want west's ClusterUnreachable, east's its own", reasons)
	}
	if rec, _ := h.store.Get(context.Background(), onWest.ID); rec.Reason == "ClusterUnreachable" {
		t.Error("the list wrote ClusterUnreachable into the store")
	}

	w := h.watch(api.Prefix + "/watch?cluster=west")
	if ev := w.next(); ev.Type != api.EventBookmark {
		t.Fatalf("first event %+v, want a bookmark", ev)
	}
	h.srv.Publish(executor.Event{ID: onEast.ID, Type: executor.EventState, Cluster: "east", Phase: "Running", Reason: "Running", Time: time.Now()})
	h.srv.Publish(executor.Event{ID: onWest.ID, Type: executor.EventState, Cluster: "west", Phase: "Running", Reason: "ClusterUnreachable", Time: time.Now()})
	if ev := w.next(); ev.TaskID != onWest.ID || ev.Cluster != "west" || ev.Reason != "ClusterUnreachable" {
		t.Errorf("the west watch's first event %+v: want west's task, its cluster named", ev)
	}
	if resp, b := h.do(http.MethodGet, api.Prefix+"/watch?cluster=West_1", nil); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "query.cluster") {
		t.Errorf("a watch of a bad cluster name: %s %s; want 400 naming query.cluster", resp.Status, b)
	}
}

// TestPendingEventsFromTheTasksCluster: a Pending task's pod events are
// read from the cluster the task is placed on (west's, not the first
// cluster's); a task on a cluster no longer configured gets none, and its
// GET still answers.
func TestPendingEventsFromTheTasksCluster(t *testing.T) {
	ctx := context.Background()
	west := fake.NewClientset()
	fc := &fakeClusters{state: map[string]string{"east": "Ready", "west": "Ready"}}
	h := newHarness(t, func(c *server.Config) { c.Clusters = fc })
	fc.clients = map[string]kubernetes.Interface{"east": h.client, "west": west}
	place := func(name, cluster string) (api.Task, string) {
		tk := h.mustSubmit("default", taskDoc(name))
		rec, err := h.store.Get(ctx, tk.ID)
		if err != nil {
			t.Fatal(err)
		}
		rec.PodCreated, rec.Reason, rec.Cluster = true, "Unschedulable", cluster
		if _, err := h.store.Update(ctx, rec); err != nil {
			t.Fatal(err)
		}
		return tk, task.PodName(task.Identity{Namespace: "default", Name: name, RunID: tk.ID, Executor: rec.Executor, Nonce: rec.Nonce}, 0)
	}
	event := func(client kubernetes.Interface, pod, reason string) {
		if _, err := client.CoreV1().Events("default").Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: "e-", Name: pod + reason, Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: pod, Namespace: "default"},
			Type:           "Warning", Reason: reason, Message: "0/1 nodes are available", Count: 1,
			LastTimestamp: metav1.Now(),
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	onWest, pod := place("on-west", "west")
	event(west, pod, "FailedScheduling")
	event(h.client, pod, "FromEast") // the same pod name on the first cluster: not this task's
	if got := h.get(onWest.ID); len(got.Events) != 1 || got.Events[0].Reason != "FailedScheduling" {
		t.Errorf("the events of a task Pending on west: %+v; want west's FailedScheduling only", got.Events)
	}
	gone, pod := place("on-north", "north")
	event(h.client, pod, "FromEast")
	if got := h.get(gone.ID); got.Phase != "Pending" || len(got.Events) != 0 {
		t.Errorf("a task Pending on a cluster not configured: %s with events %+v; want none", got.Phase, got.Events)
	}
}

// TestDryRunOnTheNamedCluster: a task whose spec.placement names a cluster
// is checked by that cluster's API server (west refuses its pod; east, the
// first, would accept it); one that names none by the first cluster's.
func TestDryRunOnTheNamedCluster(t *testing.T) {
	west := fake.NewClientset()
	west.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "x", field.ErrorList{
			field.Forbidden(field.NewPath("spec", "containers").Index(0).Child("image"), "west admits images of its own registry only")})
	})
	fc := &fakeClusters{state: map[string]string{"east": "Ready", "west": "Ready"}}
	h := newHarness(t, func(c *server.Config) { c.Clusters, c.ValidateOnServer = fc, true })
	fc.clients = map[string]kubernetes.Interface{"east": h.client, "west": west}
	doc := func(name, cluster string) string {
		return strings.Replace(taskDoc(name), "spec:", "spec:\n  placement: {cluster: "+cluster+"}", 1)
	}
	resp, b := h.do(http.MethodPost, api.Prefix+"/namespaces/default/tasks", []byte(doc("to-west", "west")), "Content-Type", "application/yaml")
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(b), "west admits images of its own registry only") {
		t.Errorf("a task for west, whose API server refuses its pod: %s %s; want 422 with west's reason", resp.Status, b)
	}
	if resp, _ := h.submit("default", doc("to-east", "east")); resp.StatusCode != http.StatusCreated {
		t.Errorf("the same task for east: %s, want 201", resp.Status)
	}
	if resp, _ := h.submit("default", taskDoc("anywhere")); resp.StatusCode != http.StatusCreated {
		t.Errorf("a task for any cluster (checked by the first): %s, want 201", resp.Status)
	}
}
