package client

import (
	"context"
	"fmt"
	"net/http"

	"github.com/kubetask/kubetask/pkg/api"
)

// Clusters lists the clusters of a service with several, by name, with
// their states; empty for a service on one cluster. It needs a caller
// allowed every namespace.
func (c *Client) Clusters(ctx context.Context) (*api.ClusterList, error) {
	var l api.ClusterList
	if _, err := c.call(ctx, request{method: http.MethodGet, path: pathOf("clusters"), repeatable: true}, &l); err != nil {
		return nil, fmt.Errorf("listing the clusters: %w", err)
	}
	return &l, nil
}

// DrainCluster stops the placement of new tasks on cluster name (its
// running tasks finish there), or with draining false places tasks there
// again; idempotent. It returns the cluster.
func (c *Client) DrainCluster(ctx context.Context, name string, draining bool) (*api.Cluster, error) {
	verb := "drain"
	if !draining {
		verb = "resume"
	}
	var cl api.Cluster
	if _, err := c.call(ctx, request{method: http.MethodPost, path: pathOf("clusters", name, verb), repeatable: true}, &cl); err != nil {
		return nil, fmt.Errorf("%s cluster %s: %w", verb, name, err)
	}
	return &cl, nil
}

// LoseCluster declares cluster name lost: its tasks' attempts that have a
// pod there end Failed/ClusterLost and run again on another cluster (at
// least once: the lost pods may still run), the others move. Repeatable.
// It returns the cluster.
func (c *Client) LoseCluster(ctx context.Context, name string) (*api.Cluster, error) {
	var cl api.Cluster
	if _, err := c.call(ctx, request{method: http.MethodPost, path: pathOf("clusters", name, "lose"), repeatable: true}, &cl); err != nil {
		return nil, fmt.Errorf("declaring cluster %s lost: %w", name, err)
	}
	return &cl, nil
}
