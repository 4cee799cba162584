package store_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
)

// silentProxy forwards TCP connections to a server until silence: from then
// on the connections it holds pass nothing either way and never close, as
// when a partition or a dropped NAT entry cuts a connection without a word;
// connections made afterwards pass again.
type silentProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    map[net.Conn]chan struct{} // the connections passing, each with its cut signal
	all    []net.Conn                 // every connection, closed when the test ends
	closed chan struct{}
	wg     sync.WaitGroup
}

func newSilentProxy(t *testing.T, target string) *silentProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silentProxy{ln: ln, target: target, cut: map[net.Conn]chan struct{}{}, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		close(p.closed)
		p.mu.Lock()
		for _, c := range p.all {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *silentProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		cut := make(chan struct{})
		p.mu.Lock()
		p.cut[c], p.cut[s] = cut, cut
		p.all = append(p.all, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s, cut)
		go p.pipe(s, c, cut)
	}
}

// pipe copies from src to dst until either closes, or forever stalls once
// cut is closed (nothing more is read or written, nothing is closed).
func (p *silentProxy) pipe(dst, src net.Conn, cut chan struct{}) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-cut:
			<-p.closed // silent until the test ends
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // closed by either side
		}
	}
}

// silentStore is a PostgreSQL store, with 2 s call timeouts, whose
// connections go through a silentProxy; it is closed when the test ends.
func silentStore(t *testing.T) (*silentProxy, store.Store) {
	t.Helper()
	u, err := url.Parse(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	p := newSilentProxy(t, u.Host)
	u.Host = p.ln.Addr().String()
	s, err := store.OpenPostgresTimeouts(context.Background(), u.String(), 2*time.Second, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return p, s
}

// silence cuts every connection the proxy holds now, without a word.
func (p *silentProxy) silence() {
	p.mu.Lock()
	defer p.mu.Unlock()
	done := map[chan struct{}]bool{}
	for c, cut := range p.cut {
		if !done[cut] {
			close(cut)
			done[cut] = true
		}
		delete(p.cut, c)
	}
}

// A server that stops answering without closing the connection (a
// partition) holds no call of the store for longer than its call timeout: a
// write and a read fail, the next calls go over new connections, and a
// LISTEN connection notices and listens again, saying it may have missed
// changes. Before, writes ran without a deadline and a listen waited for
// ever: a gate's close, a replica leaving and the SIGTERM hand-over waited
// for the kernel to give up on the connection, about 15 minutes.
func TestPostgresSilentServer(t *testing.T) {
	t.Parallel()
	p, s := silentStore(t)
	ctx := context.Background()
	rec := mustCreate(t, s, storetest.Sample("a"))
	listens := make(chan struct{}, 10)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		_ = s.(store.Changes).WatchChanges(wctx, func(c store.Change) {
			if c == (store.Change{}) {
				listens <- struct{}{}
			}
		})
	}()
	select {
	case <-listens:
	case <-time.After(30 * time.Second):
		t.Fatal("WatchChanges never listened")
	}

	p.silence()
	done := make(chan error, 1)
	go func() {
		rec.Phase = "Running"
		_, err := s.Update(ctx, rec)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("an update over a silent connection succeeded")
		}
		t.Logf("update over a silent connection: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("an update over a silent connection was still waiting after a minute")
	}
	// New connections pass: the store works again.
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := s.Get(ctx, "a"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the store does not work again over new connections: %v", err)
		}
	}
	select {
	case <-listens:
	case <-time.After(time.Minute):
		t.Fatal("the LISTEN connection did not notice the silence: changes made meanwhile would go unreported")
	}
}

// A read over a connection that went silent ends at the call timeout as
// ErrUnavailable, as a write does: the server answers 503 with Retry-After
// and clients retry. Before, reads ended with the bare context deadline,
// which the HTTP API answered 500. A caller that gives up first still gets
// its own context's error.
func TestPostgresSilentReadIsUnavailable(t *testing.T) {
	t.Parallel()
	p, s := silentStore(t)
	ctx := context.Background()
	mustCreate(t, s, storetest.Sample("a"))
	if _, err := s.Get(ctx, "a"); err != nil { // the pool keeps this connection
		t.Fatal(err)
	}
	p.silence()

	gone, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := s.Get(gone, "a"); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrUnavailable) {
		t.Errorf("a read whose caller gave up first: %v, want the caller's deadline, not ErrUnavailable", err)
	}
	for name, read := range map[string]func() error{
		"Get":  func() error { _, err := s.Get(ctx, "a"); return err },
		"List": func() error { _, err := s.List(ctx, store.ListOptions{}); return err },
		"Page": func() error { _, err := s.(store.Pager).Page(ctx, store.PageOptions{Limit: 10}); return err },
	} {
		if _, err := s.Get(ctx, "a"); err != nil { // a connection in the pool again
			t.Fatal(err)
		}
		p.silence()
		start := time.Now()
		err := read()
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s over a silent connection: %v, want ErrUnavailable", name, err)
		}
		t.Logf("%s over a silent connection, after %s: %v", name, time.Since(start).Round(time.Millisecond), err)
	}
}
