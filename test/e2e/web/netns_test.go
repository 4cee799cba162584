package web

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// browserNet is a network namespace of the browser's own: a loopback only,
// on which the service's address is forwarded to the service.
//
// Chromium aborts the loads it has in flight with net::ERR_NETWORK_CHANGED
// when an address of the host changes, and the test packages that run beside
// this one (the local node's pod network) add and remove bridges and veths on
// the host all the time: a page load failed so once in .ci/run. In a namespace
// of its own the browser sees no change but its loopback's.
//
// The namespace is held by one OS thread, locked to a goroutine that runs
// what must be made inside it (a listener, a dial) and never unlocks it: the
// thread, and with it the namespace, ends with the test. The browser enters
// it with nsenter.
type browserNet struct {
	nsenter string
	path    string      // the namespace, as /proc/<pid>/task/<tid>/ns/net
	in      chan func() // run on the thread inside the namespace
}

// newBrowserNet makes the namespace and forwards base's host and port in it
// to base. Without the privilege to make one (not root), it returns nil and
// the browser shares the host's network.
func newBrowserNet(t *testing.T, base string) *browserNet {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Fatalf("nsenter (Debian's util-linux) runs the browser in a network namespace of its own: %v", err)
	}
	n := &browserNet{nsenter: nsenter, in: make(chan func())}
	made := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			made <- fmt.Errorf("unshare: %w", err)
			return
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			made <- fmt.Errorf("setting the loopback up: %w", err)
			return
		}
		n.path = fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		made <- nil
		for f := range n.in {
			f()
		}
	}()
	if err := <-made; err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Logf("the browser shares the host's network (a namespace of its own needs root: %v)", err)
			return nil
		}
		t.Fatalf("a network namespace for the browser: %v", err)
	}
	var ln net.Listener
	n.do(func() { ln, err = net.Listen("tcp", u.Host) })
	if err != nil {
		close(n.in)
		t.Fatalf("listening on %s in the browser's namespace: %v", u.Host, err)
	}
	var (
		mu    sync.Mutex
		open  = map[net.Conn]bool{}
		conns sync.WaitGroup
	)
	conns.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open[c] = true
			mu.Unlock()
			conns.Go(func() {
				forward(c, u.Host)
				mu.Lock()
				delete(open, c)
				mu.Unlock()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		conns.Wait()
		close(n.in)
	})
	return n
}

// do runs f on the thread inside the namespace.
func (n *browserNet) do(f func()) {
	done := make(chan struct{})
	n.in <- func() { f(); close(done) }
	<-done
}

// forward copies c both ways to a connection to addr, made in the host's
// namespace, until either side ends.
func forward(c net.Conn, addr string) {
	defer c.Close()
	up, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, c)
		up.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(c, up)
	c.(*net.TCPConn).CloseWrite()
	<-done
}

// enter makes cmd start inside the namespace (by nsenter, which keeps the
// files cmd passes on: chromedp's DevTools pipes); on a nil n, it leaves cmd
// as it is.
func (n *browserNet) enter(cmd *exec.Cmd) {
	if n == nil {
		return
	}
	cmd.Args = append([]string{n.nsenter, "--net=" + n.path, "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = n.nsenter
}

// The browser has a network of its own: the loads of a page go on while the
// host's addresses change (a bridge with an address added and removed every
// 20 ms, as the local node's pod network does), and it reaches only the
// service's address, not another port of the host's loopback. Before the
// browser had its own namespace, loads failed with net::ERR_NETWORK_CHANGED.
func TestBrowserNetworkIsItsOwn(t *testing.T) {
	const scripts = 40
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		var page strings.Builder
		page.WriteString("<!doctype html><title>loads</title><script>window.loaded = 0</script>\n")
		for i := range scripts {
			fmt.Fprintf(&page, "<script src=\"/s/%d.js\"></script>\n", i)
		}
		fmt.Fprint(w, page.String())
	})
	mux.HandleFunc("/s/", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond) // a load in flight while the host's network changes
		w.Header().Set("Content-Type", "text/javascript")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprint(w, "window.loaded++\n")
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		fmt.Fprint(w, "host")
	}))
	defer other.Close()

	b := newBrowser(t, srv.URL, 800, 600)
	stop := make(chan struct{})
	flapped := make(chan int)
	go func() { flapped <- flapHostNetwork(t, stop) }()
	for round := range 5 {
		b.open("/")
		b.wait(30*time.Second, "every script of the page loaded", fmt.Sprintf("window.loaded === %d", scripts))
		t.Logf("round %d: %d scripts loaded", round, scripts)
	}
	close(stop)
	t.Logf("the host's network changed %d times during the loads", <-flapped)

	eval[bool](b, fmt.Sprintf(`fetch(%q).then(r => r.text(), e => "refused: " + e).then(v => window.other = v), true`, other.URL))
	b.wait(10*time.Second, "the fetch of another port to end", "window.other !== undefined")
	if got := eval[string](b, "window.other"); !strings.HasPrefix(got, "refused") {
		t.Fatalf("the browser reached another port of the host's loopback (%s): %q", other.URL, got)
	}
}

// flapHostNetwork adds a bridge with an address to the host's network,
// removes it, and again, until stop is closed; it returns how many times.
func flapHostNetwork(t *testing.T, stop <-chan struct{}) int {
	name := fmt.Sprintf("ktweb%d", os.Getpid()%100000)
	addr, err := netlink.ParseAddr("10.254.254.1/32")
	if err != nil {
		t.Error(err)
		return 0
	}
	n := 0
	for {
		select {
		case <-stop:
			return n
		case <-time.After(20 * time.Millisecond):
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(br); err != nil {
			t.Errorf("adding bridge %s to the host: %v", name, err)
			return n
		}
		err := netlink.AddrAdd(br, addr)
		if err == nil {
			err = netlink.LinkSetUp(br)
		}
		if err2 := netlink.LinkDel(br); err == nil {
			err = err2
		}
		if err != nil {
			t.Errorf("changing the host's network: %v", err)
			return n
		}
		n++
	}
}
