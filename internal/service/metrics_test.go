package service

import (
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
)

// recordingRegistry is a registry that remembers the collectors registered
// in it, so that a test can read every metric family they describe, also
// those without a series yet (a vector nothing has counted in).
type recordingRegistry struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recordingRegistry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recordingRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// family is one exported metric family: its labels (variable and
// constant), sorted.
type family struct {
	labels []string
}

var descRE = regexp.MustCompile(`fqName: "([^"]+)".*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}`)

// exportedFamilies builds the metrics a `kubetask serve` of several
// clusters, with shards, registers (the process's, the router's, one
// cluster's executor and replica, labelled cluster as newRouter labels
// them, and the server's), from the functions Run and newRouter call, and
// returns the kubetask_* families by name.
func exportedFamilies(t *testing.T) map[string]family {
	t.Helper()
	reg := &recordingRegistry{Registry: prometheus.NewRegistry()}
	newProcessMetrics(reg)
	newDroppedEvents(reg)
	if _, err := newPlacementMetric(reg); err != nil {
		t.Fatal(err)
	}
	st := store.NewMemory()
	clusterReg := prometheus.WrapRegistererWith(prometheus.Labels{"cluster": "east"}, reg)
	ec := executor.Config{RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, Client: fake.NewClientset(), InstanceID: "svc-east", Cluster: "east", Namespaces: []string{"ns"},
		Store: st, Registerer: clusterReg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ex, err := executor.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replica.New(replica.Config{Client: fake.NewClientset(), Namespace: "ns", Group: "svc-east", Shards: 1,
		Executor: func(int) executor.Config { return ec }, Registerer: clusterReg, Logger: ec.Logger}); err != nil {
		t.Fatal(err)
	}
	pager, ok := st.(store.Pager)
	if !ok {
		t.Fatal("the memory store pages no lists")
	}
	if _, err := server.New(server.Config{Executor: ex, Pager: pager, Registry: reg}); err != nil {
		t.Fatal(err)
	}
	out := map[string]family{}
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range reg.collectors {
			c.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the description %s", d)
		}
		if !strings.HasPrefix(m[1], "kubetask_") {
			continue
		}
		var labels []string
		for _, l := range strings.Split(m[2], ",") {
			if name, _, ok := strings.Cut(l, "="); ok {
				labels = append(labels, name)
			}
		}
		for _, l := range strings.Split(m[3], ",") {
			if l != "" {
				labels = append(labels, l)
			}
		}
		slices.Sort(labels)
		out[m[1]] = family{labels: labels}
	}
	return out
}

// documentedFamilies reads the table of docs/metrics.md: metric name ->
// labels.
func documentedFamilies(t *testing.T) map[string][]string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	row := regexp.MustCompile("^\\| `(kubetask_[a-z0-9_]+)` \\| [a-z]+ \\|([^|]*)\\|")
	tick := regexp.MustCompile("`([a-z_]+)`")
	for line := range strings.Lines(string(doc)) {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		labels := []string{}
		for _, l := range tick.FindAllStringSubmatch(m[2], -1) {
			labels = append(labels, l[1])
		}
		slices.Sort(labels)
		out[m[1]] = labels
	}
	return out
}

// TestMetricsTableIsTheExportedSet: docs/metrics.md lists every kubetask_*
// family the service exports, with its labels, and no other.
func TestMetricsTableIsTheExportedSet(t *testing.T) {
	exported, documented := exportedFamilies(t), documentedFamilies(t)
	if len(exported) < 20 {
		t.Fatalf("only %d families exported: the test no longer builds the service's metrics (%v)", len(exported), slices.Sorted(maps.Keys(exported)))
	}
	for name, f := range exported {
		labels, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("%s{%s} is exported but not in docs/metrics.md's table", name, strings.Join(f.labels, ","))
		case !slices.Equal(labels, f.labels):
			t.Errorf("%s: docs/metrics.md lists the labels %v, the service exports %v", name, labels, f.labels)
		}
	}
	for name := range documented {
		if _, ok := exported[name]; !ok {
			t.Errorf("%s is in docs/metrics.md's table but the service does not export it", name)
		}
	}
}

// dashboard is what the test reads of a Grafana dashboard.
type dashboard struct {
	SchemaVersion int `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

var (
	metricRE   = regexp.MustCompile(`\b(kubetask_[a-zA-Z0-9_]+)(\{[^}]*\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	groupingRE = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// exprMetrics returns the families an expression reads (a histogram's
// _bucket, _sum and _count series are its family's) and the labels it
// selects or groups by.
func exprMetrics(expr string, exported map[string]family) (names []string, labels []string) {
	for _, m := range metricRE.FindAllStringSubmatch(expr, -1) {
		name := m[1]
		if _, ok := exported[name]; !ok {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suffix); ok {
					if _, ok := exported[base]; ok {
						name = base
					}
				}
			}
		}
		names = append(names, name)
		for _, l := range matcherRE.FindAllStringSubmatch(m[2], -1) {
			labels = append(labels, l[1])
		}
	}
	for _, g := range groupingRE.FindAllStringSubmatch(expr, -1) {
		for l := range strings.SplitSeq(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	return names, labels
}

// TestDashboardUsesExportedMetrics: deploy/grafana/kubetask-dashboard.json
// is a Grafana dashboard whose panels query, through the $datasource
// variable, only metrics the service exports, selecting and grouping by
// labels those carry (le: a histogram's buckets).
func TestDashboardUsesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/grafana/kubetask-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("not a dashboard: %v", err)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want a dashboard of Grafana 9 or later (36+)", d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["cluster"] != "query" || vars["namespace"] != "query" {
		t.Errorf("variables %v: want datasource (a data source), cluster and namespace (queries)", vars)
	}
	exported := exportedFamilies(t)
	if len(d.Panels) == 0 {
		t.Fatal("no panels")
	}
	seen := map[string]bool{}
	for _, p := range d.Panels {
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		for _, tg := range p.Targets {
			names, labels := exprMetrics(tg.Expr, exported)
			if len(names) == 0 {
				t.Errorf("panel %q: %q reads no kubetask metric", p.Title, tg.Expr)
			}
			for _, n := range names {
				f, ok := exported[n]
				if !ok {
					t.Errorf("panel %q: %s is not a metric the service exports", p.Title, n)
					continue
				}
				seen[n] = true
				for _, l := range labels {
					if l != "le" && !slices.Contains(f.labels, l) {
						t.Errorf("panel %q: %q uses the label %s, which %s does not carry (%v)", p.Title, tg.Expr, l, n, f.labels)
					}
				}
			}
		}
	}
	for _, want := range []string{"kubetask_tasks_queued", "kubetask_pending_tasks", "kubetask_admission_wait_seconds",
		"kubetask_time_to_start_seconds", "kubetask_attempt_outcomes_total", "kubetask_task_duration_seconds"} {
		if !seen[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}

// TestExprMetrics: what the dashboard test reads of a query.
func TestExprMetrics(t *testing.T) {
	exported := map[string]family{"kubetask_a_seconds": {}, "kubetask_b_total": {}, "kubetask_c_count": {}}
	for expr, want := range map[string]struct{ names, labels []string }{
		`histogram_quantile(0.9, sum by (le, phase) (rate(kubetask_a_seconds_bucket{cluster=~"$cluster"}[5m])))`: {
			names: []string{"kubetask_a_seconds"}, labels: []string{"cluster", "le", "phase"}},
		`sum(rate(kubetask_b_total{namespace!="x", reason="y"}[5m])) without (code)`: {
			names: []string{"kubetask_b_total"}, labels: []string{"code", "namespace", "reason"}},
		`kubetask_c_count`:                   {names: []string{"kubetask_c_count"}},
		`rate(kubetask_a_seconds_count[5m])`: {names: []string{"kubetask_a_seconds"}},
		`kubetask_unknown_bucket`:            {names: []string{"kubetask_unknown_bucket"}},
	} {
		names, labels := exprMetrics(expr, exported)
		slices.Sort(labels)
		if !slices.Equal(names, want.names) || !slices.Equal(labels, want.labels) {
			t.Errorf("%s: %v %v, want %v %v", expr, names, labels, want.names, want.labels)
		}
	}
}
