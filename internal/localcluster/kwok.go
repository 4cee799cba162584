package localcluster

import (
	"context"
	"errors"
)

// AddSimNodes adds n kwok-simulated nodes, starting kwok on first use.
func (c *Cluster) AddSimNodes(ctx context.Context, n int) error {
	return errors.New("simulated nodes are not implemented yet")
}
