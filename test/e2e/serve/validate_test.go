package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// TestServeValidatesOncePerSpec: the built service dry-runs a task spec on
// the API server once and lets later submissions of the same spec (under
// other names) through on that acceptance, while a spec only the API server
// refuses is a 422 naming the field, every time it is sent.
func TestServeValidatesOncePerSpec(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env)
	submit := func(id, doc string) (int, api.Problem) {
		t.Helper()
		resp, b := s.do(http.MethodPost, api.Prefix+"/namespaces/"+env.Namespace+"/tasks?id="+id, "application/yaml", []byte(doc))
		var p api.Problem
		if resp.StatusCode >= 300 {
			if err := json.Unmarshal(b, &p); err != nil {
				t.Fatalf("submit %s: %s %s", id, resp.Status, b)
			}
		}
		return resp.StatusCode, p
	}
	verdicts := func() map[string]int {
		t.Helper()
		_, b := s.do(http.MethodGet, "/metrics", "", nil)
		out := map[string]int{}
		for _, m := range regexp.MustCompile(`(?m)^kubetask_submit_validations_total\{source="([a-z-]+)"\} (\d+)$`).FindAllStringSubmatch(string(b), -1) {
			out[m[1]], _ = strconv.Atoi(m[2])
		}
		return out
	}

	for i, name := range []string{"first", "second", "third"} {
		if code, p := submit(fmt.Sprintf("valid-%d", i), stepsTask(name, "a", 0)); code != http.StatusCreated {
			t.Fatalf("valid task %s: %d %+v", name, code, p)
		}
	}
	if v := verdicts(); v["dry-run"] != 1 || v["cached"] != 2 {
		t.Errorf("verdicts %v, want 1 dry run and 2 cached", v)
	}
	refused := strings.Replace(stepsTask("refused", "a", 0), "      terminationGracePeriodSeconds: 5", "      terminationGracePeriodSeconds: 5\n      dnsPolicy: Sometimes", 1)
	for i := range 2 {
		code, p := submit(fmt.Sprintf("refused-%d", i), refused)
		if code != http.StatusUnprocessableEntity || !hasProblemAt(p, "body.spec.template.spec.dnsPolicy") {
			t.Fatalf("a spec the API server refuses, try %d: %d %+v", i, code, p)
		}
	}
	if v := verdicts(); v["dry-run"] != 3 {
		t.Errorf("verdicts %v, want a dry run for each refused submission (3 in all)", v)
	}
	for i := range 2 {
		if resp, _ := s.do(http.MethodGet, api.Prefix+"/tasks/refused-"+strconv.Itoa(i), "", nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("refused-%d: %s, want 404 (nothing stored)", i, resp.Status)
		}
	}
}

func hasProblemAt(p api.Problem, loc string) bool {
	for _, e := range p.Errors {
		if e.Location == loc {
			return true
		}
	}
	return false
}
