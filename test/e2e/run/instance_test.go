package run

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// TestRunSameTaskTwiceAtOnce (issue 9, defect c): two `kubetask run` of the
// same task started together never act at once: the second waits for the
// first's instance Lease, then runs the task again on its own pod. Neither
// deletes the other's pod.
func TestRunSameTaskTwiceAtOnce(t *testing.T) {
	env := clustertest.New(t)
	mark := marker()
	f := taskFile(t, "twice", "", fmt.Sprintf(`      containers:
        - {name: base, image: busybox, command: [sh, -c, 'sleep 3; echo done %s']}`, mark))
	first := start(t, env, "run", "-f", f, "-o", "json")
	eventually(t, time.Minute, "the first run's pod", func() bool { return len(pods(t, env)) == 1 })
	second := start(t, env, "run", "-f", f, "-o", "json")
	if code := first.wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("first run: exit %d\n%s\n%s", code, first.stdout, first.stderr)
	}
	firstDone := eventTime(t, first.stdout.String(), "released")
	if code := second.wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("second run: exit %d\n%s\n%s", code, second.stdout, second.stderr)
	}
	secondCreated := eventTime(t, second.stdout.String(), "created")
	if secondCreated.Before(firstDone) {
		t.Errorf("the second run created its pod at %s, before the first run was done with its own at %s", secondCreated, firstDone)
	}
}

// eventTime returns the time of the first JSON event of type typ.
func eventTime(t *testing.T, stdout, typ string) time.Time {
	t.Helper()
	for _, l := range lines(stdout) {
		var ev struct {
			Type  string    `json:"type"`
			Event string    `json:"event"`
			Time  time.Time `json:"time"`
		}
		if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == "event" && ev.Event == typ {
			return ev.Time
		}
	}
	t.Fatalf("no %q event in:\n%s", typ, stdout)
	return time.Time{}
}
