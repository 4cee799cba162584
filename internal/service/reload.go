package service

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/internal/server"
)

// checkTokenFile refuses a token file others may read or anyone but its
// owner (and group) may write: its tokens would be anyone's. A group may
// read it (a Kubernetes Secret mounted with defaultMode 0440 and an
// fsGroup).
func checkTokenFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o027 != 0 {
		return fmt.Errorf("token file %s has mode %04o: others may read or write it (or its group write it), and its tokens run pods: chmod 600 %s (a Secret: defaultMode 0400 or 0440)",
			path, perm, path)
	}
	return nil
}

// loadTokens checks and reads a token file.
func loadTokens(path string) ([]server.Token, error) {
	if err := checkTokenFile(path); err != nil {
		return nil, err
	}
	return server.LoadTokenFile(path)
}

// reloader reads files again every interval and, when their content
// changed, calls apply (whose error keeps what was applied before: logged).
type reloader struct {
	what  string
	paths []string
	apply func() error
	log   *slog.Logger
	clock clock.WithTicker

	last [][]byte
}

func newReloader(what string, paths []string, apply func() error, clk clock.WithTicker, log *slog.Logger) *reloader {
	r := &reloader{what: what, paths: paths, apply: apply, log: log, clock: clk}
	r.last, _ = r.read()
	return r
}

func (r *reloader) read() ([][]byte, error) {
	var out [][]byte
	for _, p := range r.paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// check reads the files once and applies a change; it reports whether it
// applied one.
func (r *reloader) check() bool {
	cur, err := r.read()
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("cannot read again; keeping what is in use", "what", r.what, "err", err)
		}
		return false
	}
	if equalAll(cur, r.last) {
		return false
	}
	if err := r.apply(); err != nil {
		r.log.Error("the changed file is refused; keeping what is in use", "what", r.what, "err", err)
		r.last = cur // said once per change
		return false
	}
	r.last = cur
	r.log.Info("reloaded", "what", r.what, "files", r.paths)
	return true
}

// run checks every interval until ctx ends.
func (r *reloader) run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		return
	}
	t := r.clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			r.check()
		}
	}
}

func equalAll(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// certificate is the serving certificate, replaced when its files change.
type certificate struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

func (c *certificate) load() error {
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate: %w", err)
	}
	c.cur.Store(&cert)
	return nil
}

func (c *certificate) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.cur.Load(), nil }
