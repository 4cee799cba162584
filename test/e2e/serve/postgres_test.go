package serve

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/api"
)

// kubetask serve on PostgreSQL (a real server the test harness starts), the
// URL from a file so it stays out of process listings: a task's outcome and
// archived log are there, and still there after the service restarts.
func TestServeOnPostgres(t *testing.T) {
	env := clustertest.New(t)
	file := filepath.Join(t.TempDir(), "store-url")
	if err := os.WriteFile(file, []byte(pgtest.Database(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startService(t, env, "--store", "postgres", "--store-url-file", file)
	if !strings.Contains(s.stdout.String(), "(store postgres") {
		t.Errorf("the service does not say it uses PostgreSQL:\n%s", s.stdout)
	}
	tk := s.submit(quickTask("on-postgres"))
	tk = s.waitTask(tk.ID, 2*time.Minute, "the outcome", func(tk api.Task) bool { return tk.Terminal })
	if tk.Phase != "Succeeded" {
		t.Fatalf("task %s/%s %s", tk.Phase, tk.Reason, tk.Message)
	}
	eventually(t, time.Minute, "the archived log", func() bool { b, complete := s.log(tk.ID, 0); return complete && string(b) == "hello\n" })

	s.stop(syscall.SIGTERM)
	s.start()
	again := s.get(tk.ID)
	if again.Phase != "Succeeded" || len(again.Attempts) != 1 {
		t.Errorf("after a restart: %s/%s with %d attempts", again.Phase, again.Reason, len(again.Attempts))
	}
	if b, complete := s.log(tk.ID, 0); !complete || string(b) != "hello\n" {
		t.Errorf("after a restart the archived log is %q (complete %v)", b, complete)
	}
	if l := s.list("namespace=" + env.Namespace); len(l) != 1 || l[0].ID != tk.ID {
		t.Errorf("list after a restart: %+v", l)
	}
}
