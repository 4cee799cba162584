package serve

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// TestServeTunesGOGC: the built binary, started without GOGC, runs with a
// GOGC of 400 (cli.ServeGCPercent: its live heap is small here) and exports
// the scheduler's latencies; started with a GOGC the Go runtime would
// silently ignore, it refuses to start and names the variable.
func TestServeTunesGOGC(t *testing.T) {
	if v, ok := os.LookupEnv("GOGC"); ok {
		t.Skipf("GOGC=%q is set in the test's environment, and serve leaves a set GOGC alone", v)
	}
	env := clustertest.New(t)
	s := startService(t, env)
	gogc := regexp.MustCompile(`(?m)^go_gc_gogc_percent 400$`)
	eventually(t, 30*time.Second, "go_gc_gogc_percent 400 in /metrics", func() bool {
		resp, b := s.do(http.MethodGet, "/metrics", "", nil)
		return resp.StatusCode == http.StatusOK && gogc.Match(b) && strings.Contains(string(b), "go_sched_latencies_seconds_bucket")
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubetaskBin(t), "serve", "--kubeconfig", env.Kubeconfig, "--state-dir", t.TempDir(), "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "GOGC=OFF")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("kubetask serve with GOGC=OFF still ran after a minute; output:\n%s", out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("kubetask serve with GOGC=OFF: %v, want a failed exit; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), `GOGC="OFF"`) || !strings.Contains(string(out), `"off"`) {
		t.Errorf("kubetask serve with GOGC=OFF said:\n%s\nwant the variable and what the runtime takes named", out)
	}
}
