package benchserve

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// sample is one series of a Prometheus text exposition: its name, labels and
// value.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics reads the samples of a Prometheus text exposition (comments
// and malformed lines are skipped).
func parseMetrics(text string) []sample {
	var out []sample
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
			s.name = line[:i]
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			parseLabels(line[i+1:j], s.labels)
			rest = line[j+1:]
		} else if i >= 0 {
			s.name, rest = line[:i], line[i:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out
}

// parseLabels reads `k="v",k2="v2"` (with \" and \\ escapes) into m.
func parseLabels(s string, m map[string]string) {
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return
		}
		key := strings.TrimSpace(s[:eq])
		var v strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				if s[i] == 'n' {
					v.WriteByte('\n')
					continue
				}
			}
			v.WriteByte(s[i])
		}
		m[key] = v.String()
		s = strings.TrimLeft(s[min(i+1, len(s)):], ", ")
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP x_total x
# TYPE x_total counter
x_total{verb="GET",resource="pods",subresource="log",code="500"} 12
x_total{verb="POST",resource="pods",dry_run="All",code="201"} 3.5
plain 7
odd{a="q\"uo,te",b=""} 1e3
`
	got := parseMetrics(text)
	if len(got) != 4 {
		t.Fatalf("%d samples, want 4: %+v", len(got), got)
	}
	if s := got[0]; s.name != "x_total" || s.labels["subresource"] != "log" || s.labels["code"] != "500" || s.value != 12 {
		t.Errorf("first sample %+v", s)
	}
	if s := got[1]; s.labels["dry_run"] != "All" || s.value != 3.5 {
		t.Errorf("second sample %+v", s)
	}
	if s := got[2]; s.name != "plain" || s.value != 7 || len(s.labels) != 0 {
		t.Errorf("third sample %+v", s)
	}
	if s := got[3]; s.labels["a"] != `q"uo,te` || s.labels["b"] != "" || s.value != 1000 {
		t.Errorf("fourth sample %+v", s)
	}
}

// sum adds the values of the samples of name for which keep (if given)
// holds.
func sum(samples []sample, name string, keep func(map[string]string) bool) float64 {
	total := 0.0
	for _, s := range samples {
		if s.name == name && (keep == nil || keep(s.labels)) {
			total += s.value
		}
	}
	return total
}

// apiserverRequests reads the API server's apiserver_request_total by
// "VERB resource[/subresource][ dry-run] code".
func apiserverRequests(tb testing.TB) map[string]float64 {
	tb.Helper()
	b, err := clustertest.Cluster().Client().CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		tb.Fatalf("reading the API server's metrics: %v", err)
	}
	out := map[string]float64{}
	for _, s := range parseMetrics(string(b)) {
		if s.name != "apiserver_request_total" {
			continue
		}
		l := s.labels
		k := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			k += "/" + l["subresource"]
		}
		if l["dry_run"] != "" {
			k += " dry-run"
		}
		out[k+" "+l["code"]] += s.value
	}
	return out
}

// requestReport renders the API server's requests between two reads:
// the total and the largest kinds.
func requestReport(before, after map[string]float64, top int) string {
	type kind struct {
		k string
		n float64
	}
	var kinds []kind
	total := 0.0
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			kinds = append(kinds, kind{k, d})
			total += d
		}
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i].n > kinds[j].n })
	var b strings.Builder
	fmt.Fprintf(&b, "%.0f", total)
	for i, k := range kinds[:min(top, len(kinds))] {
		sep := ", "
		if i == 0 {
			sep = " ("
		}
		fmt.Fprintf(&b, "%s%s: %.0f", sep, k.k, k.n)
	}
	switch {
	case len(kinds) > top:
		b.WriteString(", ...)")
	case len(kinds) > 0:
		b.WriteString(")")
	}
	return b.String()
}

// metrics reads the service's /metrics.
func (s *service) metrics(ctx context.Context) ([]sample, error) {
	_, b, err := s.do(ctx, http.MethodGet, "/metrics", "", nil, http.StatusOK)
	if err != nil {
		return nil, err
	}
	return parseMetrics(string(b)), nil
}
