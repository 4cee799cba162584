package localnode

import (
	"context"
	"log/slog"
	"strings"
)

// quietHandler drops virtual-kubelet's routine noise: optimistic-concurrency
// conflicts it retries by itself, and start-up warnings about options this node
// deliberately does not use (a client from the environment, its own HTTP server).
type quietHandler struct{ slog.Handler }

var noise = []string{
	"the object has been modified",
	"Failed to create clientset from env",
	"TLS config not provided",
	"due to failed sync",
}

func (h quietHandler) Handle(ctx context.Context, r slog.Record) error {
	text := r.Message
	r.Attrs(func(a slog.Attr) bool {
		text += " " + a.Value.String()
		return true
	})
	for _, n := range noise {
		if strings.Contains(text, n) {
			return nil
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(as)}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(name)}
}
