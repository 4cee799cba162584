package executor

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestTable: ratios are against S0 (the first row), the Job controller at
// the same limit and the equal-work S0 beside the row; unknown figures
// print as "-"; memory rows show only their heap.
func TestTable(t *testing.T) {
	rows := []row{
		{name: "S0 floor client", limit: "unlimited", tasks: 100, elapsed: time.Second, clientReq: 3, allReq: 8},
		{name: "kubetask", limit: "unlimited", tasks: 90, elapsed: time.Second, clientReq: 3, allReq: 8, p50: 2500 * time.Microsecond, p99: 40 * time.Millisecond, durP99: 45 * time.Millisecond, equalS0: 120},
		{name: "Job controller", limit: "unlimited", tasks: 30, elapsed: time.Second, clientReq: math.NaN(), allReq: 20, p99: 3 * time.Second},
		{name: "kubetask", limit: "50", tasks: 10, elapsed: time.Second},
		{name: "memory: plain client-go informer", tasks: 10, heap: 20480, note: "per pod"},
		{name: "SQLite outcome writes, 64 writers", tasks: 5000, elapsed: time.Second, store: true, note: "writes/s"},
	}
	got := strings.Split(strings.TrimSpace(table(rows)), "\n")
	if len(got) != 2+len(rows) {
		t.Fatalf("%d lines, want %d:\n%s", len(got), 2+len(rows), strings.Join(got, "\n"))
	}
	for i, want := range [][]string{
		{"| S0 floor client |", "| 100.0 | 1.00x | - |"},
		{"| 90.0 | 0.90x | 3.00x |", "| 2.5 ms / 40 ms |", "| 0.75x | 45 ms |"},
		{"| 30.0 | 0.30x | - | - | 20.00 |", "/ 3.0 s"},
		{"| 10.0 | 0.10x | - |"}, // no Job row at QPS 50
		{"| 20.0 KiB | | | per pod |"},
		{"| 5000 | 5000 | | | | | | | | | | | writes/s |"},
	} {
		for _, w := range want {
			if !strings.Contains(got[2+i], w) {
				t.Errorf("line %d %q lacks %q", i, got[2+i], w)
			}
		}
	}
}

func TestSumSeries(t *testing.T) {
	text := "# HELP x\n# TYPE rest_client_requests_total counter\nrest_client_requests_total{code=\"200\",method=\"GET\"} 10\nrest_client_requests_total{code=\"201\"} 2.5\nrest_client_requests_total_other 100\nother 1\n"
	if got := sumSeries(text, "rest_client_requests_total"); got != 12.5 {
		t.Errorf("sumSeries = %v, want 12.5", got)
	}
	if got := sumSeries("not { an exposition", "x"); got != 0 {
		t.Errorf("sumSeries of garbage = %v, want 0", got)
	}
}

func TestRequestsByVerb(t *testing.T) {
	text := `# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",resource="pods",subresource="",verb="POST"} 7
apiserver_request_total{code="409",component="apiserver",resource="pods",subresource="",verb="POST"} 1
apiserver_request_total{code="200",component="apiserver",resource="pods",subresource="status",verb="PATCH"} 4
apiserver_request_duration_seconds_count{resource="pods",verb="POST"} 99
`
	got := requestsByVerb(text)
	want := map[string]float64{"POST pods": 8, "PATCH pods/status": 4}
	if len(got) != len(want) || got["POST pods"] != 8 || got["PATCH pods/status"] != 4 {
		t.Errorf("requestsByVerb = %v, want %v", got, want)
	}
}
