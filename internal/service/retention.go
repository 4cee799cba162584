package service

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/pkg/store"
)

// retentionBatch is how many finished tasks one transaction deletes, so the
// store's writer is never held for long.
const retentionBatch = 100

// retain deletes finished tasks (and their logs) whose last change is older
// than keep, every period, in small batches, until ctx ends. keep 0 keeps
// everything.
func retain(ctx context.Context, st store.Retention, keep, period time.Duration, clk clock.WithTicker, log *slog.Logger) {
	if keep <= 0 {
		return
	}
	t := clk.NewTicker(period)
	defer t.Stop()
	for {
		total := 0
		for ctx.Err() == nil {
			n, err := st.DeleteFinishedBefore(ctx, clk.Now().Add(-keep), retentionBatch)
			if err != nil {
				log.Warn("retention: deleting finished tasks", "err", err)
				break
			}
			total += n
			if n < retentionBatch {
				break
			}
		}
		if total > 0 {
			log.Info("retention: deleted finished tasks", "count", total, "olderThan", keep)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}
