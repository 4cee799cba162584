package localnode

import (
	"context"
	"log/slog"
	"strings"
)

// quietHandler drops virtual-kubelet's routine noise: optimistic-concurrency
// conflicts it retries by itself, and start-up warnings about options this node
// deliberately does not use (a client from the environment, its own HTTP server).
type quietHandler struct {
	slog.Handler
	attrs string // text of the attributes added by WithAttrs (virtual-kubelet's WithError)
}

var noise = []string{
	"the object has been modified",
	"Failed to create clientset from env",
	"TLS config not provided",
	"due to failed sync",
	"Force deleting pod in running state",
	"as told to forget while in progress",
}

func (h quietHandler) Handle(ctx context.Context, r slog.Record) error {
	text := r.Message + h.attrs
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
	text := h.attrs
	for _, a := range as {
		text += " " + a.Value.String()
	}
	return quietHandler{Handler: h.Handler.WithAttrs(as), attrs: text}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{Handler: h.Handler.WithGroup(name), attrs: h.attrs}
}
