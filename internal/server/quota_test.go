package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/store"
)

// One namespace cannot fill the store for the others (issue 33): with
// caps of 3 unfinished and 5 kept tasks per namespace, team-a's fourth
// waiting task is a 429 naming the unfinished cap, team-c submits as ever,
// a finished task frees its place once counted again, and the sixth kept
// task is a 403 naming the kept cap. A refused submission creates nothing.
// Nothing capped a namespace before.
func TestNamespaceQuotas(t *testing.T) {
	st := store.NewMemory()
	h := newHarnessOn(t, st, func(c *server.Config) {
		c.Auth = isolationTokens(t)
		c.Quotas = &server.Quotas{Counter: st.(store.NamespaceCounter), MaxUnfinished: 3, MaxTotal: 5, Refresh: 300 * time.Millisecond}
	})
	submit := func(ns, name string) (int, string) {
		resp, b := h.do(http.MethodPost, "/api/v1/namespaces/"+ns+"/tasks?id="+name, []byte(taskDoc(name)), append(bearer("root"), "Content-Type", "application/yaml")...)
		return resp.StatusCode, string(b)
	}
	for i := range 3 {
		if code, b := submit("team-a", fmt.Sprintf("a-%d", i)); code != http.StatusCreated {
			t.Fatalf("team-a's task %d: %d %s", i, code, b)
		}
	}
	submits := h.exec.submits.Load()
	if code, b := submit("team-a", "a-3"); code != http.StatusTooManyRequests || !strings.Contains(b, "maxUnfinishedTasksPerNamespace) is 3") {
		t.Fatalf("team-a's 4th unfinished task: %d %s, want 429 naming the cap", code, b)
	}
	if n := h.exec.submits.Load(); n != submits {
		t.Fatalf("a refused submission reached the executor")
	}
	if code, b := submit("team-a", "a-0"); code != http.StatusOK {
		t.Fatalf("a retry of an existing task under the cap: %d %s, want 200", code, b)
	}
	if code, b := submit("team-c", "c-0"); code != http.StatusCreated {
		t.Fatalf("team-c: %d %s", code, b)
	}
	// Finished tasks free unfinished places (once counted again) and
	// still count as kept.
	h.finish("a-0", "Succeeded", "Completed")
	h.finish("a-1", "Succeeded", "Completed")
	next := 3
	deadline := time.Now().Add(10 * time.Second)
	for created := 0; created < 2; {
		code, b := submit("team-a", fmt.Sprintf("a-%d", next))
		switch {
		case code == http.StatusCreated:
			created++
			next++
		case code == http.StatusTooManyRequests && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
		default:
			t.Fatalf("after two tasks finished: %d %s", code, b)
		}
	}
	if code, b := submit("team-a", fmt.Sprintf("a-%d", next)); code != http.StatusForbidden || !strings.Contains(b, "maxTasksPerNamespace) is 5") {
		t.Fatalf("team-a's 6th kept task: %d %s, want 403 naming the cap", code, b)
	}
}
