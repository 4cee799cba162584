package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/task"
)

func TestSubmitIsIdempotent(t *testing.T) {
	h := newHarness(t, nil)
	first := h.mustSubmit("default", taskDoc("hello", "team", "data"), "Idempotency-Key", "run-1")
	if first.ID != "run-1" || first.Namespace != "default" || first.Name != "hello" || first.Labels["team"] != "data" || first.Phase != "Pending" {
		t.Fatalf("created %+v", first)
	}
	// The same document, as JSON with its defaults spelled out and the ID
	// in the query: the existing task, 200.
	asJSON := `{"apiVersion":"kubetask.dev/v1alpha1","kind":"Task","metadata":{"name":"hello","namespace":"default","labels":{"team":"data"}},
		"spec":{"cleanup":"Delete","template":{"spec":{"containers":[{"name":"main","image":"busybox:1.37","command":["echo","hi"]}]}}}}`
	resp, b := h.do(http.MethodPost, api.Prefix+"/namespaces/default/tasks?id=run-1", []byte(asJSON), "Content-Type", "application/json")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("same document again: %s %s", resp.Status, b)
	}
	var again api.Task
	if err := json.Unmarshal(b, &again); err != nil || again.ID != "run-1" || !again.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("same document again: %+v %v", again, err)
	}
	if got := resp.Header.Get("Location"); got != api.Prefix+"/tasks/run-1" {
		t.Errorf("Location %q", got)
	}
	if n := h.exec.submits.Load(); n != 1 {
		t.Errorf("%d submissions reached the executor, want 1", n)
	}
}

func TestServerIDsSortByCreation(t *testing.T) {
	h := newHarness(t, nil)
	var prev string
	for i := range 20 {
		tk := h.mustSubmit("default", taskDoc(fmt.Sprintf("t%d", i)))
		if !strings.HasPrefix(tk.ID, "t") || len(tk.ID) != 27 || tk.ID <= prev {
			t.Fatalf("ID %q after %q: want t and a lowercase ULID, increasing", tk.ID, prev)
		}
		prev = tk.ID
	}
}

func TestSubmitPlainPodAsJSON(t *testing.T) {
	h := newHarness(t, nil)
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"app":"x"}},"spec":{"containers":[{"name":"main","image":"busybox:1.37"}]}}`
	resp, b := h.do(http.MethodPost, api.Prefix+"/namespaces/default/tasks", []byte(pod), "Content-Type", "application/json; charset=utf-8")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("%s %s", resp.Status, b)
	}
	var tk api.Task
	if err := json.Unmarshal(b, &tk); err != nil || tk.Name != "p" || tk.Labels["app"] != "x" {
		t.Fatalf("%+v %v", tk, err)
	}
}

func TestGetReportsStateAttemptsResultAndPendingEvents(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	tk := h.mustSubmit("default", taskDoc("hello"), "Idempotency-Key", "run-1")

	// Pending with its pod created: the pod's events say why.
	rec, err := h.store.Get(ctx, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec.PodCreated, rec.Reason = true, "Unschedulable"
	if _, err := h.store.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	pod := task.PodName(task.Identity{Namespace: "default", Name: "hello", RunID: "run-1", Executor: "srv", Nonce: rec.Nonce}, 0)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, ev := range []struct{ obj, reason string }{{pod, "FailedScheduling"}, {"someone-else", "Pulled"}, {pod, "Scheduled"}} {
		_, err := h.client.CoreV1().Events("default").Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("e%d", i), Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: ev.obj, Namespace: "default"},
			Type:           "Warning", Reason: ev.reason, Message: "0/1 nodes are available", Count: 3,
			LastTimestamp: metav1.NewTime(t0.Add(time.Duration(i) * time.Minute)),
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	got := h.get(tk.ID)
	if got.Phase != "Pending" || got.Reason != "Unschedulable" || len(got.Events) != 2 ||
		got.Events[0].Reason != "FailedScheduling" || got.Events[1].Reason != "Scheduled" || got.Events[0].Count != 3 {
		t.Fatalf("pending task: %+v", got)
	}
	if len(got.Attempts) != 1 || got.Attempts[0].Pod != pod || got.Attempts[0].FinishedAt != nil {
		t.Errorf("current attempt: %+v", got.Attempts)
	}
	var doc task.Task
	if err := json.Unmarshal(got.Document, &doc); err != nil || doc.Spec.MainContainer != "main" {
		t.Errorf("document: %v %s", err, got.Document)
	}

	// Finished with a binary result: base64, and no events.
	rec, _ = h.store.Get(ctx, tk.ID)
	rec.Result = []byte{0xff, 0x00, 'x'}
	if _, err := h.store.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	h.finish(tk.ID, "Succeeded", "Completed")
	got = h.get(tk.ID)
	if !got.Terminal || got.Phase != "Succeeded" || got.Result != "" || string(got.ResultBase64) != "\xff\x00x" || len(got.Events) != 0 {
		t.Fatalf("finished task: %+v", got)
	}
	if len(got.Attempts) != 1 || got.Attempts[0].FinishedAt == nil || got.Attempts[0].ExitCode == nil {
		t.Errorf("attempts: %+v", got.Attempts)
	}

	// A text result is text.
	rec, _ = h.store.Get(ctx, tk.ID)
	rec.Result = []byte(`{"rows": 5}`)
	if _, err := h.store.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if got := h.get(tk.ID); got.Result != `{"rows": 5}` || got.ResultBase64 != nil {
		t.Errorf("text result: %+v", got)
	}
}

func (h *harness) get(id string) api.Task {
	h.t.Helper()
	resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/"+id, nil)
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("GET %s: %s %s", id, resp.Status, b)
	}
	if resp.Header.Get(api.HeaderCursor) == "" {
		h.t.Errorf("GET %s: no %s header", id, api.HeaderCursor)
	}
	var out api.Task
	if err := json.Unmarshal(b, &out); err != nil {
		h.t.Fatal(err)
	}
	return out
}

func (h *harness) list(query string) api.TaskList {
	h.t.Helper()
	resp, b := h.do(http.MethodGet, api.Prefix+"/tasks?"+query, nil)
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("list %s: %s %s", query, resp.Status, b)
	}
	var out api.TaskList
	if err := json.Unmarshal(b, &out); err != nil {
		h.t.Fatal(err)
	}
	return out
}

func TestListPagesAndFilters(t *testing.T) {
	h := newHarness(t, nil)
	var ids []string
	for i := range 25 {
		ns, team := "team-a", "data"
		if i%5 == 0 {
			ns, team = "team-b", "web"
		}
		tk := h.mustSubmit(ns, taskDoc(fmt.Sprintf("job-%02d", i), "team", team))
		ids = append(ids, tk.ID)
		time.Sleep(time.Millisecond) // distinct creation times
	}
	// Newest first, 10 a page, no task twice or missed, also when tasks are
	// created while paging.
	seen := map[string]bool{}
	var order []string
	cont := ""
	for page := 0; ; page++ {
		l := h.list("limit=10&continue=" + cont)
		if page == 0 {
			h.mustSubmit("team-a", taskDoc("late")) // newer than every page: never shifts them
		}
		for _, it := range l.Items {
			if seen[it.ID] {
				t.Fatalf("%s twice", it.ID)
			}
			seen[it.ID] = true
			order = append(order, it.ID)
		}
		if l.Continue == "" {
			break
		}
		if page > 5 {
			t.Fatal("too many pages")
		}
		cont = l.Continue
	}
	if len(order) != 25 {
		t.Fatalf("%d tasks paged, want 25", len(order))
	}
	for i, id := range order {
		if id != ids[len(ids)-1-i] {
			t.Fatalf("page order %v, want newest first %v", order, ids)
		}
	}

	h.finish(ids[3], "Failed", "ExitCode")
	for query, want := range map[string]int{
		"namespace=team-b":                5,
		"labels=team%3Ddata":              20,
		"labels=team%3Dweb,team%3D%3Dweb": 5,
		"namePrefix=job-1":                10,
		"terminal=true":                   1,
		"terminal=false":                  25, // with "late"
		"phase=Failed&reason=ExitCode":    1,
		"createdAfter=" + time.Now().Add(time.Hour).UTC().Format(time.RFC3339): 0,
	} {
		l := h.list(query + "&limit=1000")
		if len(l.Items) != want {
			t.Errorf("%s: %d tasks, want %d", query, len(l.Items), want)
		}
	}
}

func TestCancelIsIdempotent(t *testing.T) {
	h := newHarness(t, nil)
	tk := h.mustSubmit("default", taskDoc("hello"))
	for i := range 2 {
		resp, b := h.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/cancel", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("cancel %d: %s %s", i, resp.Status, b)
		}
		var got api.Task
		if err := json.Unmarshal(b, &got); err != nil || got.CancelledAt == nil {
			t.Fatalf("cancel %d: %+v %v", i, got, err)
		}
	}
	h.finish(tk.ID, "Failed", "Cancelled")
	if resp, b := h.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/cancel", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("cancel of a finished task: %s %s", resp.Status, b)
	}
}

func TestRerunMakesANewTaskWithItsOrigin(t *testing.T) {
	h := newHarness(t, nil)
	tk := h.mustSubmit("default", taskDoc("hello", "team", "data"))
	h.finish(tk.ID, "Failed", "ExitCode")

	rerun := func(hdr ...string) (*http.Response, api.Task) {
		resp, b := h.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/rerun", nil, hdr...)
		var out api.Task
		if resp.StatusCode < 300 {
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatal(err)
			}
		} else {
			t.Logf("%s", b)
		}
		return resp, out
	}
	resp, r1 := rerun()
	if resp.StatusCode != http.StatusCreated || r1.ID == tk.ID || r1.Origin != tk.ID || r1.Name != "hello" || r1.Labels["team"] != "data" || r1.Terminal {
		t.Fatalf("rerun: %s %+v", resp.Status, r1)
	}
	// With an idempotency key, a retried rerun returns the task it made.
	resp, r2 := rerun("Idempotency-Key", "rerun-1")
	if resp.StatusCode != http.StatusCreated || r2.ID != "rerun-1" {
		t.Fatalf("rerun with a key: %s %+v", resp.Status, r2)
	}
	resp, r3 := rerun("Idempotency-Key", "rerun-1")
	if resp.StatusCode != http.StatusOK || r3.ID != "rerun-1" {
		t.Fatalf("retried rerun: %s %+v", resp.Status, r3)
	}
	// The key of another task is a conflict.
	if resp, _ := rerun("Idempotency-Key", tk.ID); resp.StatusCode != http.StatusConflict {
		t.Fatalf("rerun onto the original's ID: %s", resp.Status)
	}
	if n := h.exec.submits.Load(); n != 3 {
		t.Errorf("%d submissions, want 3 (the task and two reruns)", n)
	}
}
