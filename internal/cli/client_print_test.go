package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubetask/kubetask/pkg/api"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func ago(d time.Duration) *time.Time { t := t0.Add(-d); return &t }

func TestPrintTask(t *testing.T) {
	for name, tc := range map[string]struct {
		task api.Task
		want string
	}{
		"failed after a retry, with a result": {
			task: api.Task{
				ID: "t1", Namespace: "jobs", Name: "etl", Labels: map[string]string{"team": "data", "env": "prod"}, Origin: "t0",
				Phase: "Failed", Reason: "ExitCode", Message: `main container "main" exited with code 3`, ExitCode: code(3), Terminal: true,
				Result: "{\"rows\": 0}\n", Attempt: 1, CreatedAt: *ago(time.Hour), UpdatedAt: *ago(time.Minute),
				Attempts: []api.Attempt{
					{Attempt: 0, Pod: "etl-x-0", Phase: "Failed", Reason: "Evicted", Message: "node\npressure", ExitCode: code(137), Retryable: true, FinishedAt: ago(30 * time.Minute)},
					{Attempt: 1, Pod: "etl-x-1", Phase: "Failed", Reason: "ExitCode", ExitCode: code(3), FinishedAt: ago(time.Minute)},
				},
			},
			want: `ID:         t1
Namespace:  jobs
Name:       etl
Labels:     env=prod,team=data
Rerun of:   t0
State:      Failed/ExitCode (final)
Message:    main container "main" exited with code 3
Exit code:  3
Result:     {"rows": 0}
Created:    2026-01-02T02:04:05Z (60m ago)
Updated:    2026-01-02T03:03:05Z (60s ago)
Attempts:
  ATTEMPT  POD      STATE                     EXIT  FINISHED  MESSAGE
  0        etl-x-0  Failed/Evicted (retried)  137   30m ago   node pressure
  1        etl-x-1  Failed/ExitCode           3     60s ago   
`,
		},
		"pending, with its pod's events": {
			task: api.Task{
				ID: "t2", Namespace: "default", Name: "big", Phase: "Pending", Reason: "Unschedulable", Message: "0/3 nodes are available",
				CreatedAt: *ago(5 * time.Minute), CancelledAt: ago(time.Second),
				Attempts: []api.Attempt{{Attempt: 0, Pod: "big-y-0", Phase: "Pending", Reason: "Unschedulable"}},
				Events: []api.PodEvent{
					{Type: "Warning", Reason: "FailedScheduling", Message: "0/3 nodes are available: insufficient cpu", Count: 4, LastSeen: *ago(10 * time.Second)},
					{Type: "Normal", Reason: "Scheduled", Message: "later", LastSeen: *ago(time.Second)},
				},
			},
			want: `ID:         t2
Namespace:  default
Name:       big
State:      Pending/Unschedulable (cancelling)
Message:    0/3 nodes are available
Created:    2026-01-02T02:59:05Z (5m ago)
Cancelled:  2026-01-02T03:04:04Z (1s ago)
Attempts:
  ATTEMPT  POD      STATE                  EXIT  FINISHED  MESSAGE
  0        big-y-0  Pending/Unschedulable  -     -         
Pending: Unschedulable; recent events of the pod:
  LAST SEEN  TYPE     REASON            COUNT  MESSAGE
  10s ago    Warning  FailedScheduling  4      0/3 nodes are available: insufficient cpu
  1s ago     Normal   Scheduled         1      later
`,
		},
		"pending without events, binary result elsewhere": {
			task: api.Task{ID: "t3", Namespace: "default", Name: "n", Phase: "Pending", Reason: "Pending", CreatedAt: t0},
			want: `ID:         t3
Namespace:  default
Name:       n
State:      Pending
Created:    2026-01-02T03:04:05Z (0s ago)
Pending: Pending; no pod events yet
`,
		},
		"moved to another cluster after a loss": {
			task: api.Task{
				ID: "t5", Namespace: "default", Name: "n", Cluster: "west", Phase: "Running", Reason: "Running", Attempt: 1, CreatedAt: t0,
				Attempts: []api.Attempt{
					{Attempt: 0, Cluster: "east", Pod: "n-z-0", Phase: "Failed", Reason: "ClusterLost", Retryable: true, FinishedAt: &t0},
					{Attempt: 1, Cluster: "west", Pod: "n-z-1", Phase: "Running", Reason: "Running"},
				},
			},
			want: `ID:         t5
Namespace:  default
Name:       n
Cluster:    west
State:      Running
Created:    2026-01-02T03:04:05Z (0s ago)
Attempts:
  ATTEMPT  CLUSTER  POD    STATE                         EXIT  FINISHED  MESSAGE
  0        east     n-z-0  Failed/ClusterLost (retried)  -     0s ago    
  1        west     n-z-1  Running                       -     -         
`,
		},
		"succeeded with a binary result": {
			task: api.Task{ID: "t4", Namespace: "default", Name: "n", Phase: "Succeeded", Reason: "Completed", Terminal: true, ResultBase64: []byte{0xff, 0}, CreatedAt: t0},
			want: `ID:         t4
Namespace:  default
Name:       n
State:      Succeeded/Completed (final)
Result:     2 bytes, not UTF-8 (-o json shows it, base64)
Created:    2026-01-02T03:04:05Z (0s ago)
`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := printTask(&b, &tc.task, t0); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, b.String()); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTaskTable(t *testing.T) {
	tasks := []api.Task{
		{ID: "t2", Namespace: "jobs", Name: "etl", Phase: "Running", Reason: "Running", Attempt: 1, CreatedAt: *ago(90 * time.Second), Labels: map[string]string{"a": "b"}, Cluster: "east"},
		{ID: "t1", Namespace: "default", Name: "a-much-longer-name", Phase: "Failed", Reason: "ExitCode", ExitCode: code(2), CreatedAt: *ago(49 * time.Hour),
			Message: strings.Repeat("x", 100)},
	}
	for name, tc := range map[string]struct {
		wide bool
		want string
	}{
		"default": {false, `ID   NAMESPACE   NAME                 STATE     REASON     ATTEMPTS   AGE
t2   jobs        etl                  Running   Running    2          90s
t1   default     a-much-longer-name   Failed    ExitCode   1          2d1h
`},
		"wide": {true, `ID   NAMESPACE   NAME                 STATE     REASON     ATTEMPTS   AGE    CLUSTER   EXIT   LABELS   MESSAGE
t2   jobs        etl                  Running   Running    2          90s    east      -      a=b      
t1   default     a-much-longer-name   Failed    ExitCode   1          2d1h   -         2      -        ` + strings.Repeat("x", 77) + `...
`},
	} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			tt := newTaskTable(&b, tc.wide, func() time.Time { return t0 })
			for i := range tasks {
				tt.add(rowOf(&tasks[i]))
			}
			if err := tt.flush(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, b.String()); diff != "" {
				t.Errorf("table (-want +got):\n%s", diff)
			}
		})
	}
}

func TestProgressAndOutcome(t *testing.T) {
	for name, tc := range map[string]struct {
		ev   api.Event
		want string
	}{
		"state":            {api.Event{Type: "State", Phase: "Running", Reason: "Running", Message: "main is running"}, "Running: main is running"},
		"pod created":      {api.Event{Type: "PodCreated", Pod: "default/p-0"}, "created pod default/p-0"},
		"retried attempt":  {api.Event{Type: "AttemptFinished", Phase: "Failed", Reason: "Evicted"}, "attempt 0 finished: Failed/Evicted (another attempt follows)"},
		"the last attempt": {api.Event{Type: "AttemptFinished", Attempt: 1, Phase: "Succeeded", Reason: "Completed", Terminal: true}, "attempt 1 finished: Succeeded/Completed"},
		"deleting":         {api.Event{Type: "PodDeleting"}, "deleting"},
		"expired":          {api.Event{Type: api.EventExpired}, "events were missed"},
	} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			p := &progress{w: &b, start: time.Now()}
			_ = p.event(tc.ev)
			if got := b.String(); !strings.HasPrefix(got, "[") || !strings.Contains(got, "s] "+tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	var b bytes.Buffer
	printOutcome(&b, &api.Task{ID: "t", Phase: "Succeeded", Reason: "Completed", Result: "ok\n"}, false, time.Second)
	printOutcome(&b, &api.Task{ID: "t", Phase: "Failed", Reason: "ExitCode", Message: "exit 3", Attempt: 2}, true, 2*time.Second)
	printOutcome(&b, &api.Task{ID: "t", Phase: "Succeeded", Reason: "Completed"}, true, time.Second)
	want := `outcome: Succeeded/Completed (task t, 1 attempt; waited 1.0s)
result: ok
outcome: FAILED Failed/ExitCode: exit 3 (task t, 3 attempts; waited 2.0s)
see: kubetask get t; kubetask logs t --attempt 2
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
}

func TestShellWord(t *testing.T) {
	for in, want := range map[string]string{
		"hello-cli": "hello-cli",
		"etl_dag.Extract_Users.scheduled__2026-12-01T00:00:00+00:00.1": "etl_dag.Extract_Users.scheduled__2026-12-01T00:00:00+00:00.1",
		"with spaces":  "'with spaces'",
		"it's $HOME":   `'it'\''s $HOME'`,
		"Ünïcödé":      "'Ünïcödé'",
		"a;rm -rf x":   "'a;rm -rf x'",
		"":             "''",
		"back`tick`":   "'back`tick`'",
		"glob*?[x]":    "'glob*?[x]'",
		"~tilde":       "'~tilde'",
		"#not-comment": "'#not-comment'",
	} {
		if got := shellWord(in); got != want {
			t.Errorf("shellWord(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestPrintClusters(t *testing.T) {
	var b bytes.Buffer
	if err := printClusters(&b, []api.Cluster{
		{Name: "east", State: "Draining", Since: *ago(2 * time.Minute), Reason: "Drained", Message: "drained by an operator", Labels: map[string]string{"region": "eu"}},
		{Name: "west", State: "Ready", Mode: "agent"},
	}, t0); err != nil {
		t.Fatal(err)
	}
	want := `NAME   STATE      SINCE   LABELS      MODE    MESSAGE
east   Draining   2m      region=eu   -       drained by an operator
west   Ready      -       -           agent   
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
	b.Reset()
	if err := printClusters(&b, nil, t0); err != nil || !strings.Contains(b.String(), "runs tasks on one cluster") {
		t.Errorf("no clusters: %q, %v", b.String(), err)
	}
}
