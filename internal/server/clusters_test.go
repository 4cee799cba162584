package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
)

// fakeClusters is a service's clusters: east and west, west lost.
type fakeClusters struct {
	state  map[string]string
	drains int
}

func (f *fakeClusters) ListClusters(context.Context) ([]api.Cluster, error) {
	return []api.Cluster{{Name: "east", State: f.state["east"]}, {Name: "west", State: f.state["west"]}}, nil
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
