package serve

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

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

// since is after's samples less before's of the same name and labels: the
// counts between two scrapes of one process.
func since(after, before []sample) []sample {
	key := func(s sample) string {
		return s.name + "{" + fmt.Sprint(s.labels) + "}" // fmt sorts a map's keys
	}
	was := make(map[string]float64, len(before))
	for _, s := range before {
		was[key(s)] = s.value
	}
	out := make([]sample, len(after))
	for i, s := range after {
		out[i] = sample{name: s.name, labels: s.labels, value: s.value - was[key(s)]}
	}
	return out
}

// histogramQuantile estimates the q-quantile of the Prometheus histogram
// name (its _bucket series whose labels keep accepts, summed by bound) as
// PromQL's histogram_quantile does: linearly within the bucket that holds
// the rank, the highest finite bound if the rank falls in +Inf; 0 without
// observations.
func histogramQuantile(m []sample, name string, keep func(map[string]string) bool, q float64) time.Duration {
	counts := map[float64]float64{}
	for _, s := range m {
		if s.name != name+"_bucket" || (keep != nil && !keep(s.labels)) {
			continue
		}
		le, err := strconv.ParseFloat(s.labels["le"], 64)
		if err != nil {
			continue
		}
		counts[le] += s.value
	}
	bounds := slices.Sorted(maps.Keys(counts))
	if len(bounds) == 0 || counts[bounds[len(bounds)-1]] == 0 {
		return 0
	}
	rank := q * counts[bounds[len(bounds)-1]]
	lower, below := 0.0, 0.0
	for _, b := range bounds {
		c := counts[b]
		if c >= rank {
			if math.IsInf(b, 1) {
				return time.Duration(lower * float64(time.Second))
			}
			v := lower + (b-lower)*(rank-below)/(c-below)
			return time.Duration(v * float64(time.Second))
		}
		lower, below = b, c
	}
	return time.Duration(lower * float64(time.Second))
}

func TestHistogramQuantile(t *testing.T) {
	h := parseMetrics(`
h_bucket{step="a",le="0.1"} 50
h_bucket{step="a",le="0.2"} 90
h_bucket{step="a",le="0.4"} 100
h_bucket{step="a",le="+Inf"} 100
h_bucket{step="b",le="0.1"} 0
h_bucket{step="b",le="0.2"} 0
h_bucket{step="b",le="0.4"} 1
h_bucket{step="b",le="+Inf"} 2
h_bucket{step="c",le="0.1"} 0
h_bucket{step="c",le="+Inf"} 0
`)
	step := func(s string) func(map[string]string) bool {
		return func(l map[string]string) bool { return l["step"] == s }
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	tests := map[string]struct {
		step string
		q    float64
		want time.Duration
	}{
		"median in the first bucket":  {"a", 0.5, ms(100)},
		"within the second bucket":    {"a", 0.7, ms(150)},
		"p99 within the third bucket": {"a", 0.99, ms(380)},
		"in +Inf: the highest bound":  {"b", 0.99, ms(400)},
		"no observations":             {"c", 0.99, 0},
		"no such series":              {"d", 0.5, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := histogramQuantile(h, "h", step(tc.step), tc.q)
			if d := got - tc.want; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("quantile %v of %s = %v, want %v", tc.q, tc.step, got, tc.want)
			}
		})
	}
}

func TestSince(t *testing.T) {
	before := parseMetrics(`
h_bucket{le="0.1"} 5
h_bucket{le="+Inf"} 7
g 3
`)
	after := parseMetrics(`
h_bucket{le="0.1"} 9
h_bucket{le="+Inf"} 20
g 3
n{a="1"} 4
`)
	got := since(after, before)
	want := map[string]float64{`h_bucket 0.1`: 4, `h_bucket +Inf`: 13, `g `: 0, `n `: 4}
	if len(got) != len(want) {
		t.Fatalf("since gave %d samples, want %d: %v", len(got), len(want), got)
	}
	for _, s := range got {
		k := s.name + " " + s.labels["le"]
		if s.value != want[k] {
			t.Errorf("%s{%v} = %v, want %v", s.name, s.labels, s.value, want[k])
		}
	}
	// 4 of the 13 observations between the scrapes are below 0.1 s.
	if q := histogramQuantile(got, "h", nil, 4.0/13); q < 100*time.Millisecond-time.Microsecond || q > 100*time.Millisecond+time.Microsecond {
		t.Errorf("the delta's quantile 4/13 = %v, want 100ms", q)
	}
}
