package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/task"
)

// TestServeAgent: pull. The service runs east itself and has west run by
// an agent (agent: true): `kubetask serve --agent west`, a second process
// of the built binary on the same PostgreSQL store (west and east are two
// names for the local cluster, whose instances keep apart by their pods'
// executor label). Without its agent west is Unreachable; with it, Ready.
// A task placed on west through the service runs under west's instance
// in the agent (the pod's label, from the API server), and the service's
// record, and its watch (the agent's events, passed through the store),
// say so. The agent SIGKILLed, west is Unreachable again.
func TestServeAgent(t *testing.T) {
	env := clustertest.New(t)
	dir := t.TempDir()
	storeFile, cfg := filepath.Join(dir, "store-url"), filepath.Join(dir, "serve.yaml")
	if err := os.WriteFile(storeFile, []byte(pgtest.Database(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf("unreachableAfter: 5s\nclusters:\n- {name: east, kubeconfig: %q}\n- {name: west, kubeconfig: %q, agent: true}\n", env.Kubeconfig, env.Kubeconfig)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", cfg, "--store", "postgres", "--store-url-file", storeFile}
	s := startService(t, env, args...)
	state := func(want string) {
		t.Helper()
		eventually(t, time.Minute, "west "+want, func() bool {
			resp, b := s.do(http.MethodGet, api.Prefix+"/clusters", "", nil)
			var l api.ClusterList
			if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &l) != nil {
				return false
			}
			for _, c := range l.Items {
				if c.Name == "west" {
					return c.State == want
				}
			}
			return false
		})
	}
	state("Unreachable")
	agent := startService(t, env, append(args, "--agent", "west")...)
	state("Ready")

	cursor := s.cursor()
	d := strings.Replace(stepsTask("by-agent", "data", 0), "  retries: {limit: 0}", "  retries: {limit: 0}\n  cleanup: Keep\n  placement: {cluster: west}", 1)
	// West's row may say Ready (the agent's check wrote it) a moment
	// before the service's next check reads it: a 503 then, with nothing
	// stored, as for any client.
	var tk api.Task
	eventually(t, 30*time.Second, "the service to take a task for west", func() bool {
		resp, b := s.do(http.MethodPost, api.Prefix+"/namespaces/"+env.Namespace+"/tasks", "application/yaml", []byte(d))
		if resp.StatusCode == http.StatusServiceUnavailable {
			return false
		}
		if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &tk) != nil {
			t.Fatalf("submit: %s %s", resp.Status, b)
		}
		return true
	})
	if tk.Cluster != "west" {
		t.Fatalf("placed on %q, want west", tk.Cluster)
	}
	tk = s.waitTask(tk.ID, 2*time.Minute, "the task to finish", func(tk api.Task) bool { return tk.Terminal })
	if tk.Phase != "Succeeded" || len(tk.Attempts) != 1 || tk.Attempts[0].Cluster != "west" {
		t.Fatalf("%s/%s, attempts %+v; want Succeeded on west", tk.Phase, tk.Reason, tk.Attempts)
	}
	pod, err := env.Client.CoreV1().Pods(env.Namespace).Get(context.Background(), tk.Attempts[0].Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pod.Labels[task.LabelExecutor], "serve-"+env.Namespace+"-west"; got != want {
		t.Errorf("its pod ran under instance %q, want %q (the agent's)", got, want)
	}
	terminal := false
	for _, ev := range s.events(tk.ID, cursor, time.Minute) {
		if ev.Type == "AttemptFinished" && ev.Terminal && ev.Cluster == "west" && ev.Phase == "Succeeded" {
			terminal = true
		}
	}
	if !terminal {
		t.Error("the service's watch did not carry the agent's terminal event on west")
	}

	agent.stop(syscall.SIGKILL)
	state("Unreachable")
}
