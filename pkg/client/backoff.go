package client

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoffConfig is the range of reconnection delays.
type backoffConfig struct{ min, max time.Duration }

var defaultBackoff = backoffConfig{min: 250 * time.Millisecond, max: 30 * time.Second}

// backoff yields growing delays: min, then doubling up to max, each with up
// to 20% jitter so that clients cut off together do not return together.
type backoff struct {
	cfg  backoffConfig
	next time.Duration
}

func (c backoffConfig) start() *backoff { return &backoff{cfg: c, next: c.min} }

// delay returns the next delay and doubles the one after.
func (b *backoff) delay() time.Duration {
	d := b.next
	b.next = min(2*b.next, b.cfg.max)
	return d + time.Duration(rand.Int64N(int64(d)/5+1)) //nolint:gosec // jitter, not a secret
}

// reset starts again from min (after a connection that worked).
func (b *backoff) reset() { b.next = b.cfg.min }

// sleep waits d or until ctx ends (then it returns ctx's error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
