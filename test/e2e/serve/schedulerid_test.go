package serve

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/task"
)

// TestServeSchedulerIDs: IDs as schedulers make them (an Airflow
// task-instance key; a long one with spaces, Unicode, '%', '?' and '#')
// are accepted by the built service, their pods run, and they come back
// exact from get, list, logs and watch, through the CLI and the HTTP API;
// the pods carry the exact ID in their annotation and a label-safe value in
// their label.
func TestServeSchedulerIDs(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env)
	ns := env.Namespace
	const airflow = "etl_dag.Extract_Users.scheduled__2026-12-01T00:00:00+00:00.1"
	long := "manual run of " + strings.Repeat("ünïcödé ✓ ", 20) + "#1 of 100% ?"
	if len(long) <= 63 {
		t.Fatalf("the long ID has %d bytes", len(long))
	}
	cursor := s.cursor()
	doc := strings.Replace(stepsTask("etl", "data", 0), "  retries: {limit: 0}", "  retries: {limit: 0}\n  cleanup: Keep", 1)

	// The Airflow key through the CLI, which waits for the outcome.
	if r := s.cli(s.URL, "submit", "-f", writeDoc(t, doc), "-n", ns, "--id", airflow, "--wait", "-q"); r.code != 0 {
		t.Fatalf("submit --id %s --wait: exit %d\n%s", airflow, r.code, r.stderr)
	}
	// The long one through the API as Idempotency-Key, twice: 201 then 200.
	for _, want := range []int{http.StatusCreated, http.StatusOK} {
		req, err := http.NewRequest(http.MethodPost, s.URL+api.Prefix+"/namespaces/"+ns+"/tasks", strings.NewReader(doc))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+s.Token)
		req.Header.Set("Content-Type", "application/yaml")
		req.Header.Set(api.HeaderIdempotencyKey, long)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var tk api.Task
		err = json.NewDecoder(resp.Body).Decode(&tk)
		resp.Body.Close()
		if resp.StatusCode != want || err != nil || tk.ID != long {
			t.Fatalf("submit as Idempotency-Key: %s (want %d), ID %q, %v", resp.Status, want, tk.ID, err)
		}
		if loc := resp.Header.Get("Location"); loc != api.Prefix+"/tasks/"+url.PathEscape(long) {
			t.Errorf("Location %q", loc)
		}
	}
	s.waitTask(long, 2*time.Minute, "the long-ID task to finish", func(tk api.Task) bool { return tk.Terminal })

	var listed api.TaskList
	if err := json.Unmarshal([]byte(s.ok("list", "-n", ns, "-o", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{airflow, long} {
		tk := s.getJSON(id) // kubetask get ID -o json
		if tk.ID != id || tk.Phase != "Succeeded" || tk.ExitCode == nil || *tk.ExitCode != 0 || len(tk.Attempts) != 1 || tk.Attempts[0].Pod == "" {
			t.Fatalf("get %q: %+v", id, tk)
		}
		if !strings.Contains(s.ok("get", id), id) {
			t.Errorf("get %q (table) does not show the ID", id)
		}
		if out := s.ok("logs", id); out != stepsLog {
			t.Errorf("logs %q: %q, want %q", id, out, stepsLog)
		}
		if b, _ := s.log(id, 0); string(b) != stepsLog {
			t.Errorf("GET logs of %q: %q", id, b)
		}
		found := false
		for _, it := range listed.Items {
			found = found || it.ID == id
		}
		if !found {
			t.Errorf("list -o json: %q missing", id)
		}
		outcome := false
		for _, ev := range s.events(id, cursor, time.Minute) { // those whose taskId is id
			outcome = outcome || ev.Terminal && ev.Phase == "Succeeded"
		}
		if !outcome {
			t.Errorf("watch of %q: no Succeeded outcome among its events", id)
		}

		// Its pod ran and carries the exact ID and a label-safe value.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, tk.Attempts[0].Pod, metav1.GetOptions{})
		cancel()
		if err != nil {
			t.Fatalf("the pod of %q: %v", id, err)
		}
		if pod.Annotations[task.AnnotationRun] != id || pod.Labels[task.LabelRun] != task.RunLabelValue(id) || pod.Labels[task.LabelRun] == id {
			t.Errorf("pod %s: annotation %q, label %q", pod.Name, pod.Annotations[task.AnnotationRun], pod.Labels[task.LabelRun])
		}
		if pod.Status.Phase != "Succeeded" {
			t.Errorf("pod %s: %s", pod.Name, pod.Status.Phase)
		}
	}
}
