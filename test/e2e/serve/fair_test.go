package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// TestServeNamespaceParallelism: `kubetask serve --namespace-parallelism
// NS=1` runs one task of the namespace at a time, and the one that waits
// says so in GET; a limit out of range is refused at start, naming the
// field, the flag and the fix.
func TestServeNamespaceParallelism(t *testing.T) {
	env := clustertest.New(t)
	out, err := exec.Command(kubetaskBin(t), "serve", "--kubeconfig", env.Kubeconfig, "--namespaces", env.Namespace,
		"--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--namespace-parallelism", "team-x=0", "--slot-order", "lifo").CombinedOutput()
	for _, want := range []string{`namespaceParallelism names namespace "team-x", which is not one the service runs tasks in`,
		"namespaceParallelism[team-x] must be at least 1", `slotOrder "lifo": want fair or fifo (--slot-order)`} {
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("serve with bad limits: %v, output lacks %q:\n%s", err, want, out)
		}
	}

	s := startService(t, env, "--namespace-parallelism", env.Namespace+"=1", "--parallelism", "10")
	slow := func(name string) []byte {
		return taskDoc(name, "", `      containers:
        - {name: main, image: busybox, command: [sh, -c, "sleep 8"]}`)
	}
	first, second := s.submit(slow("first")), s.submit(slow("second"))
	want := fmt.Sprintf("namespace %s at its limit of 1", env.Namespace)
	var waiting api.Task
	eventually(t, time.Minute, "a task waits for the namespace's limit", func() bool {
		for _, id := range []string{first.ID, second.ID} {
			if tk := s.get(id); tk.Reason == "WaitingForSlot" {
				waiting = tk
				return true
			}
		}
		return false
	})
	if waiting.Phase != "Pending" || waiting.Message != want {
		t.Errorf("waiting task %s: %s/%s %q, want Pending/WaitingForSlot %q", waiting.ID, waiting.Phase, waiting.Reason, waiting.Message, want)
	}
	// Lists (all namespaces, the namespace, the reason filter) say the same
	// as GET while the task waits (the other one sleeps 8 s): they read the
	// record, which says so. Before, it said Submitted until the pod existed.
	for _, q := range []string{"", "namespace=" + env.Namespace, "namespace=" + env.Namespace + "&reason=WaitingForSlot"} {
		resp, b := s.do(http.MethodGet, api.Prefix+"/tasks?"+q, "", nil)
		var l api.TaskList
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &l) != nil {
			t.Fatalf("list ?%s: %s\n%s", q, resp.Status, b)
		}
		var listed *api.Task
		for i := range l.Items {
			if l.Items[i].ID == waiting.ID {
				listed = &l.Items[i]
			}
		}
		switch {
		case listed == nil:
			t.Errorf("list ?%s while %s waits for a slot: not listed (%d tasks)", q, waiting.ID, len(l.Items))
		case listed.Phase != "Pending" || listed.Reason != "WaitingForSlot" || listed.Message != want:
			t.Errorf("list ?%s while %s waits for a slot: %s/%s %q, want Pending/WaitingForSlot %q", q, waiting.ID, listed.Phase, listed.Reason, listed.Message, want)
		}
	}
	for _, id := range []string{first.ID, second.ID} {
		tk := s.waitTask(id, 2*time.Minute, "the task succeeds", func(tk api.Task) bool { return tk.Terminal })
		if tk.Phase != "Succeeded" {
			t.Errorf("%s: %s/%s %s", id, tk.Phase, tk.Reason, tk.Message)
		}
	}
}
