package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
	"k8s.io/client-go/kubernetes"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
)

// Clusters is what the server shows and changes of the clusters of a
// service with several (Config.Clusters; nil: a service on one cluster,
// whose list is empty and which drains nothing).
type Clusters interface {
	// ListClusters returns every cluster, by name.
	ListClusters(ctx context.Context) ([]api.Cluster, error)
	// Drain stops placing tasks on cluster name (draining true: Ready to
	// Draining) or starts again (false: Draining to Ready), and returns the
	// cluster. Doing it twice changes nothing the second time. It returns
	// an error wrapping store.ErrNotFound for a cluster that is not
	// configured, ErrClusterState for one in another state (Lost,
	// Unreachable, Returning: not the operator's to undo this way).
	Drain(ctx context.Context, name string, draining bool) (api.Cluster, error)
	// Lose declares cluster name lost (docs/multicluster.md): its tasks'
	// attempts that have a pod end Failed/ClusterLost and run again
	// elsewhere, the others move. At least once for those attempts. It
	// returns the cluster; errors as Drain's.
	Lose(ctx context.Context, name string) (api.Cluster, error)
	// Shown is a listed record as the service shows it: a task on a
	// cluster that does not answer keeps its last known state, with reason
	// ClusterUnreachable (Executor.Get shows it so too).
	Shown(rec store.Record) store.Record
	// Client is cluster name's client, for the events of a Pending task's
	// pod there (nil: no such cluster is configured).
	Client(name string) kubernetes.Interface
}

// ErrClusterState wraps a drain or resume that the cluster's state does
// not allow: the server answers 409 with the error's text.
var ErrClusterState = errors.New("the cluster's state does not allow it")

type clusterInput struct {
	Name string `path:"name" doc:"The cluster's name." example:"east"`
}

type clusterOutput struct {
	Body *api.Cluster
}

type clusterListOutput struct {
	Body *api.ClusterList
}

func (s *Server) registerClusters() {
	tags := []string{"clusters"}
	huma.Register(s.api, huma.Operation{
		OperationID: "listClusters", Method: http.MethodGet, Path: api.Prefix + "/clusters", Tags: tags,
		Summary: "List the clusters",
		Description: "The clusters tasks are placed on, with their states (empty for a service on one cluster). " +
			"For callers who may list the tasks of every namespace.",
		Errors: []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden},
	}, s.listClusters)
	huma.Register(s.api, huma.Operation{
		OperationID: "loseCluster", Method: http.MethodPost, Path: api.Prefix + "/clusters/{name}/lose", Tags: tags,
		Summary: "Declare a cluster lost",
		Description: "For a cluster that will not answer again soon: no task is placed on it; each of its tasks whose attempt has a pod " +
			"ends that attempt Failed/ClusterLost and runs it again on another cluster (at least once: the lost pod may still run " +
			"where nobody sees it), the others move. Repeatable. For the callers who may drain clusters.",
		Errors: []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusConflict},
	}, s.loseCluster)
	for _, op := range []struct {
		id, verb, summary, desc string
		draining                bool
	}{
		{"drainCluster", "drain", "Drain a cluster", "No new task is placed on the cluster; its running tasks finish there. Idempotent. " +
			"For callers who may drain clusters (token mode: a token for every namespace; kubernetes mode: patch nodes).", true},
		{"resumeCluster", "resume", "Resume a drained cluster", "Tasks are placed on the drained cluster again. Idempotent. " +
			"For the callers who may drain it.", false},
	} {
		huma.Register(s.api, huma.Operation{
			OperationID: op.id, Method: http.MethodPost, Path: api.Prefix + "/clusters/{name}/" + op.verb, Tags: tags,
			Summary: op.summary, Description: op.desc,
			Errors: []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusConflict},
		}, func(ctx context.Context, in *clusterInput) (*clusterOutput, error) {
			return s.drainCluster(ctx, in, op.draining)
		})
	}
}

func (s *Server) listClusters(ctx context.Context, _ *struct{}) (*clusterListOutput, error) {
	if err := noQuery(ctx); err != nil {
		return nil, err
	}
	noteAudit(ctx, ActionList, AllNamespaces, "")
	if err := s.mayAll(ctx, ActionList); err != nil {
		return nil, err
	}
	out := &api.ClusterList{Items: []api.Cluster{}}
	if s.cfg.Clusters == nil {
		return &clusterListOutput{Body: out}, nil
	}
	items, err := s.cfg.Clusters.ListClusters(ctx)
	if err != nil {
		return nil, s.internal("listing the clusters", err)
	}
	out.Items = append(out.Items, items...)
	return &clusterListOutput{Body: out}, nil
}

func (s *Server) drainCluster(ctx context.Context, in *clusterInput, draining bool) (*clusterOutput, error) {
	return s.changeCluster(ctx, in, func(c Clusters) (api.Cluster, error) { return c.Drain(ctx, in.Name, draining) })
}

func (s *Server) loseCluster(ctx context.Context, in *clusterInput) (*clusterOutput, error) {
	return s.changeCluster(ctx, in, func(c Clusters) (api.Cluster, error) { return c.Lose(ctx, in.Name) })
}

// changeCluster answers a change of cluster in.Name (change: drain,
// resume, lose) for a caller allowed every namespace.
func (s *Server) changeCluster(ctx context.Context, in *clusterInput, change func(Clusters) (api.Cluster, error)) (*clusterOutput, error) {
	if err := noQuery(ctx); err != nil {
		return nil, err
	}
	noteAudit(ctx, ActionDrain, AllNamespaces, "")
	if err := s.mayAll(ctx, ActionDrain); err != nil {
		return nil, err
	}
	if s.cfg.Clusters == nil {
		return nil, huma.Error404NotFound(fmt.Sprintf("no cluster %q: this service runs tasks on one cluster (no clusters in its configuration)", in.Name))
	}
	c, err := change(s.cfg.Clusters)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, huma.Error404NotFound(fmt.Sprintf("no cluster %q: GET %s/clusters lists them", in.Name, api.Prefix))
	case errors.Is(err, ErrClusterState):
		return nil, huma.Error409Conflict(err.Error())
	case err != nil:
		return nil, s.internal("changing cluster "+in.Name, err)
	}
	return &clusterOutput{Body: &c}, nil
}

// mayAll answers 403 unless the caller may do action in every namespace.
func (s *Server) mayAll(ctx context.Context, action Action) error {
	c := CallerFrom(ctx)
	ok, err := s.allowed(ctx, c, action, AllNamespaces)
	if err != nil {
		return err
	}
	if !ok {
		return huma.Error403Forbidden(fmt.Sprintf("%s may not %s in every namespace, which this needs: ask for access (token mode: a token with namespaces \"*\"; kubernetes mode: see docs/api.md)", c.Subject(), action.phrase()))
	}
	return nil
}
