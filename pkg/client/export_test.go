package client

import (
	"context"
	"time"
)

// SetWaiter makes c wait with f between the tries of a call (instead of a
// timer), so that a test sees the waits without taking them.
func SetWaiter(c *Client, f func(context.Context, time.Duration) error) { c.wait = f }
