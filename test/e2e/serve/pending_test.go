package serve

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// Tasks that never start say why, in get (the reason, and the pod's recent
// events) and in list (the reason, and a filter on it): one no node can run,
// one whose ConfigMap is missing. Cancelled, both end.
func TestServePendingSaysWhy(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env)
	unschedulable := s.submit(taskDoc("unschedulable", "", `      nodeSelector: {kubetask.dev/no-such-node: "true"}
      containers:
        - {name: main, image: busybox, command: [sh, -c, "echo never"]}`))
	noConfig := s.submit(taskDoc("no-configmap", "", `      containers:
        - name: main
          image: busybox
          command: [sh, -c, "echo never"]
          envFrom: [{configMapRef: {name: does-not-exist}}]`))

	tk := s.waitTask(unschedulable.ID, time.Minute, "Unschedulable with the scheduler's event", func(tk api.Task) bool {
		return tk.Phase == "Pending" && tk.Reason == "Unschedulable" && hasEvent(tk, "FailedScheduling")
	})
	t.Logf("unschedulable: %s/%s %s; events %+v", tk.Phase, tk.Reason, tk.Message, tk.Events)
	if !strings.Contains(tk.Message, "node") {
		t.Errorf("the message does not say why: %q", tk.Message)
	}
	tk = s.waitTask(noConfig.ID, time.Minute, "ConfigError", func(tk api.Task) bool {
		return tk.Phase == "Pending" && tk.Reason == "ConfigError"
	})
	t.Logf("no configmap: %s/%s %s; events %+v", tk.Phase, tk.Reason, tk.Message, tk.Events)
	if !strings.Contains(tk.Message, "does-not-exist") && !strings.Contains(tk.Message, "CreateContainerConfigError") {
		t.Errorf("the message does not say why: %q", tk.Message)
	}

	// list shows the reasons, and filters on them.
	reasons := map[string]string{}
	for _, tk := range s.list("namespace=" + env.Namespace) {
		reasons[tk.ID] = tk.Reason
	}
	if reasons[unschedulable.ID] != "Unschedulable" || reasons[noConfig.ID] != "ConfigError" {
		t.Errorf("list reasons: %v", reasons)
	}
	if l := s.list("namespace=" + env.Namespace + "&reason=Unschedulable"); len(l) != 1 || l[0].ID != unschedulable.ID {
		t.Errorf("list reason=Unschedulable: %+v", l)
	}

	for _, id := range []string{unschedulable.ID, noConfig.ID} {
		if resp, b := s.do(http.MethodPost, api.Prefix+"/tasks/"+id+"/cancel", "", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("cancel %s: %s %s", id, resp.Status, b)
		}
		tk := s.waitTask(id, time.Minute, "the cancelled task to end", func(tk api.Task) bool { return tk.Terminal })
		if tk.Phase != "Failed" {
			t.Errorf("cancelled task %s: %s/%s", id, tk.Phase, tk.Reason)
		}
	}
}

func hasEvent(tk api.Task, reason string) bool {
	for _, e := range tk.Events {
		if e.Reason == reason {
			return true
		}
	}
	return false
}

// list returns the first page (up to 500 tasks) of a list with query.
func (s *service) list(query string) []api.Task {
	s.t.Helper()
	resp, b := s.do(http.MethodGet, api.Prefix+"/tasks?limit=500&"+query, "", nil)
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("list %s: %s\n%s", query, resp.Status, b)
	}
	var l api.TaskList
	if err := json.Unmarshal(b, &l); err != nil {
		s.t.Fatal(err)
	}
	return l.Items
}
