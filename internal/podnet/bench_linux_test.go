//go:build linux

package podnet

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// BenchmarkSandbox measures making one pod's network (namespace, veth pair on
// the bridge, address, routes, one forwarder) and removing it, against the
// baseline of making and closing a bare network namespace in the same run:
//
//	go test ./internal/podnet -run '^$' -bench Sandbox -benchtime 200x
func BenchmarkSandbox(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	create, remove, bare := measureSandbox(b, b.N)
	b.ReportMetric(ms(create), "ms-create")
	b.ReportMetric(ms(remove), "ms-close")
	b.ReportMetric(ms(bare), "ms-bare-netns")
	b.ReportMetric(float64(create+remove)/float64(bare), "sandbox/bare")
}

// TestSandboxTiny runs BenchmarkSandbox's measurement a few times so that it
// cannot rot; it asserts no timing.
func TestSandboxTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	create, remove, bare := measureSandbox(t, 3)
	t.Logf("mean: create %v, close %v; a bare namespace %v", create, remove, bare)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// measureSandbox returns the mean time of n sandboxes' NewSandbox and Close,
// and of n bare namespaces made and closed, alternating.
func measureSandbox(tb testing.TB, n int) (create, remove, bare time.Duration) {
	tb.Helper()
	net, err := Setup(Config{Bridge: BridgeName(tb.TempDir()), Forward: []string{"127.0.0.1:1"}})
	if err != nil {
		tb.Fatal(err)
	}
	defer net.Close()
	for i := range n {
		t0 := time.Now()
		s, err := net.NewSandbox("bench-" + strconv.Itoa(i))
		if err != nil {
			tb.Fatal(err)
		}
		t1 := time.Now()
		s.Close()
		t2 := time.Now()
		ns, err := net.newNamespace()
		if err != nil {
			tb.Fatal(err)
		}
		_ = ns.Close()
		t3 := time.Now()
		create += t1.Sub(t0)
		remove += t2.Sub(t1)
		bare += t3.Sub(t2)
	}
	return create / time.Duration(n), remove / time.Duration(n), bare / time.Duration(n)
}
