package main

import (
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"
)

// column is one unit of a table, with its header.
type column struct{ unit, header string }

// table is a generated block of the docs: the figures of one suite's
// latest run whose names start with prefix, a row per benchmark name, a
// column per unit (every unit the rows have, in order, when columns is nil).
type table struct {
	suite, prefix string
	columns       []column
}

// figure is one line of a headline table: a figure of a suite's latest run.
type figure struct {
	label, suite, name, unit string
}

// goal is one line of a goals table: a figure of a suite's latest run and
// the bound it should meet (at least, or at most, target).
type goal struct {
	figure
	atMost bool
	target float64
	// show is the goal as a person reads it ("≥ 0.95x").
	show string
}

// suites names the command that writes each suite's results, for the
// caption and for "not measured".
var suites = map[string]string{
	"bench":     "make bench",
	"run":       "make bench-run",
	"storm":     "make bench-storm",
	"serve":     "make bench-serve",
	"clusters":  "make bench-clusters",
	"podevents": "make bench-podevents",
	"observe":   "make bench-observe",
	"recovery":  "make bench-recovery",
	"machine":   "make bench-machine",
	"fair":      "make bench-fair",
	"demo":      "make bench-demo",
}

// tables are the blocks `<!-- bench:begin table=NAME -->` names.
var tables = map[string]table{
	"executor": {suite: "bench", prefix: "Executor/", columns: []column{
		{"tasks/s", "tasks/s"},
		{"x-S0", "vs S0"},
		{"x-S0-equal", "vs equal-work S0"},
		{"x-Job", "vs Job controller, same limit"},
		{"calls/task", "client calls/task"},
		{"requests/task", "apiserver requests/task"},
		{"lag-p50-ms", "outcome lag p50 ms"},
		{"lag-p99-ms", "outcome lag p99 ms"},
		{"durable-lag-p99-ms", "lag to the durable write p99 ms"},
		{"lag-watch-p99-ms", "of it: the executor's watch behind the benchmark's, p99 ms"},
		{"lag-own-p99-ms", "of it: the executor's own, p99 ms"},
		{"client-cpu-s/1k-tasks", "client CPU-s per 1,000 tasks"},
		{"apiserver-cpu-s/1k-tasks", "kube-apiserver CPU-s per 1,000 tasks"},
		{"cores-busy", "cores busy"},
	}},
	"pairs": {suite: "bench", prefix: "Pairs/", columns: []column{
		{"tasks/s", "tasks/s"},
		{"x-S0-equal", "vs equal-work S0, same pair"},
		{"calls/task", "client calls/task"},
		{"durable-lag-p99-ms", "lag to the durable write p99 ms"},
	}},
	"requests": {suite: "bench", prefix: "Executor/", columns: []column{
		{"calls/task", "client's own"},
		{"requests/task", "apiserver, every client"},
		{"apiserver-POST-pods/task", "POST pods"},
		{"apiserver-PATCH-pods/task", "PATCH pods"},
		{"apiserver-DELETE-pods/task", "DELETE pods"},
		{"apiserver-GET-pods/task", "GET pods"},
		{"apiserver-POST-pods/binding/task", "POST pods/binding"},
		{"apiserver-PATCH-pods/status/task", "PATCH pods/status"},
		{"apiserver-POST-jobs/task", "POST jobs"},
		{"apiserver-PUT-jobs/status/task", "PUT jobs/status"},
		{"apiserver-DELETE-jobs/task", "DELETE jobs"},
	}},
	"memory":    {suite: "bench", prefix: "Memory/", columns: []column{{"B/pod", "heap bytes per pod"}}},
	"store":     {suite: "bench", prefix: "Store/", columns: []column{{"writes/s", "durable writes/s"}}},
	"run":       {suite: "run", prefix: "Run"},
	"storm":     {suite: "storm"},
	"serve":     {suite: "serve"},
	"clusters":  {suite: "clusters"},
	"podevents": {suite: "podevents"},
	"observe":   {suite: "observe"},
	"recovery":  {suite: "recovery"},
	"machine":   {suite: "machine"},
	"fair":      {suite: "fair"},
	"demo":      {suite: "demo"},
}

// headlines are the blocks `<!-- bench:begin figures=NAME -->` names.
var headlines = map[string][]figure{
	"readme": {
		{"executor, no client limit", "bench", "Executor/kubetask/unlimited", "tasks/s"},
		{"executor / equal-work S0, alternating pairs", "bench", "Pairs/kubetask", "x-S0-equal"},
		{"executor / minimal S0", "bench", "Executor/kubetask/unlimited", "x-S0"},
		{"executor / Job controller, equal QPS 200", "bench", "Executor/kubetask/200", "x-Job"},
		{"executor / Job controller, equal concurrency (16 syncs)", "bench", "Executor/kubetask/unlimited", "x-Job-equal-syncs"},
		{"executor at scale / equal-work S0 at scale", "bench", "Executor/kubetask-at-scale", "x-S0-equal"},
		{"outcome lag p99 to the durable write, no faults", "bench", "Executor/kubetask/unlimited", "durable-lag-p99-ms"},
		{"executor heap per tracked pod", "bench", "Memory/kubetask-executor", "B/pod"},
		{"SQLite durable writes, 64 writers", "bench", "Store/SQLite-64-writers", "writes/s"},
		{"kubetask run / kubectl run, wall time", "run", "Run", "wall-ratio"},
		{"kubetask run / kubectl run, peak RSS", "run", "Run", "rss-ratio"},
		{"outcome lag p99 through the storm", "storm", "Storm", "storm-lag-p99-s"},
		{"outcome lag p99 through the harsh storm", "storm", "Storm", "harsh-lag-p99-s"},
		{"submissions to kubetask serve, distinct specs, open loop, p99", "serve", "ServeSubmit/distinct", "open-submit-p99-ms"},
		{"plain pod creates at the same rate, distinct specs, p99", "serve", "ServeSubmit/distinct", "open-podcreate-p99-ms"},
		{"submissions / plain pod creates, distinct specs, closed loop", "serve", "ServeSubmit/distinct", "submits/podcreates"},
	},
}

// goalSets are the blocks `<!-- bench:begin goals=NAME -->` names: issue
// 34's goals and issue 36's, each judged on the median of the suite's
// latest run.
var goalSets = map[string][]goal{
	"34": {
		{figure{"executor / equal-work S0, 2,000 tasks, alternating pairs", "bench", "Pairs/kubetask", "x-S0-equal"}, false, 0.95, "≥ 0.95x"},
		{figure{"executor / equal-work S0, 10,000 tasks", "bench", "Executor/kubetask-at-scale", "x-S0-equal"}, false, 0.95, "≥ 0.95x"},
		{figure{"executor / Job controller, equal concurrency (16 syncs), no client limit", "bench", "Executor/kubetask/unlimited", "x-Job-equal-syncs"}, false, 2, "≥ 2x"},
		{figure{"executor / Job controller, equal concurrency (16 syncs), equal QPS 200", "bench", "Executor/kubetask/200", "x-Job-equal-syncs"}, false, 2, "≥ 2x"},
		{figure{"executor heap per tracked pod, 10,000 pods", "bench", "Memory/kubetask-executor", "B/pod"}, true, 1024, "≤ 1 KB"},
		{figure{"outcome lag p99 to the durable write, no faults", "bench", "Pairs/kubetask", "durable-lag-p99-ms"}, true, 50, "≤ 50 ms"},
		{figure{"outcome lag p99 through the harsh storm", "storm", "Storm", "harsh-lag-p99-s"}, true, 1, "≤ 1 s"},
		{figure{"kubetask run / kubectl run, wall time", "run", "Run", "wall-ratio"}, true, 1, "≤ 1.0x"},
		{figure{"kubetask run / kubectl run, peak RSS", "run", "Run", "rss-ratio"}, true, 1, "≤ 1.0x"},
		{figure{"submissions / plain pod creates, distinct specs, closed loop", "serve", "ServeSubmit/distinct", "submits/podcreates"}, false, 0.8, "≥ 0.8x"},
		{figure{"submissions to kubetask serve, distinct specs, open loop, p99", "serve", "ServeSubmit/distinct", "open-submit-p99-ms"}, true, 100, "< 100 ms"},
		{figure{"SQLite durable writes, 64 writers", "bench", "Store/SQLite-64-writers", "writes/s"}, false, 20000, "≥ 20,000/s"},
		{figure{"cold `make demo` on a fresh machine", "demo", "Demo/cold", "s"}, true, 13 * 60, "≤ 13 min (780 s)"},
	},
	"36": {
		{figure{"kubetask serve with --pod-events / without, tasks/s (off, on, on, off)", "podevents", "ServePodEvents", "on/off"}, false, 0.95, "≥ 0.95x"},
		{figure{"kubetask serve with pod events, traces and scraped metrics / without, tasks/s (off, on, on, off)", "observe", "ServeObservability", "on/off"}, false, 0.95, "≥ 0.95x"},
	},
}

var blockRE = regexp.MustCompile(`(?s)(<!-- bench:begin (table|figures|goals)=([a-z0-9-]+) -->\n)(.*?)(<!-- bench:end -->)`)

// generate rewrites every bench block of doc from runs; an unknown block
// name is an error.
func generate(doc string, runs map[string]*run) (string, error) {
	var err error
	out := blockRE.ReplaceAllStringFunc(doc, func(m string) string {
		sm := blockRE.FindStringSubmatch(m)
		var body string
		switch sm[2] {
		case "table":
			t, ok := tables[sm[3]]
			if !ok {
				err = fmt.Errorf("unknown table %q", sm[3])
				return m
			}
			body = renderTable(t, runs[t.suite])
		case "figures":
			fs, ok := headlines[sm[3]]
			if !ok {
				err = fmt.Errorf("unknown figures %q", sm[3])
				return m
			}
			body = renderFigures(fs, runs)
		case "goals":
			gs, ok := goalSets[sm[3]]
			if !ok {
				err = fmt.Errorf("unknown goals %q", sm[3])
				return m
			}
			body = renderGoals(gs, runs)
		}
		return sm[1] + body + sm[5]
	})
	return out, err
}

// notMeasured is what a block says for a suite with no results file.
func notMeasured(suite string) string {
	return fmt.Sprintf("*Not measured at this commit: no results file of `%s` in docs/benchmarks-results.*\n", suites[suite])
}

// caption names the run a table comes from: command, commit, date,
// machine, load, and the suite's own configuration.
func caption(r *run) string {
	date := r.config["date"]
	if t, err := time.Parse(time.RFC3339, date); err == nil {
		date = t.UTC().Format("2006-01-02 15:04 UTC")
	}
	first := func(load string) string { return strings.Fields(load + " ?")[0] }
	var extra []string
	for _, k := range r.keys {
		switch k {
		case "suite", "commit", "date", "go", "goos", "goarch", "cpu", "cores", "memory", "load-start", "load-end", "pkg":
		default:
			extra = append(extra, k+" "+r.config[k])
		}
	}
	s := fmt.Sprintf("`%s` at `%s`, %s (%s); %s, %s cores, %s; load %s at the start, %s at the end",
		suites[r.suite()], r.config["commit"], date, r.config["go"], r.config["cpu"], r.config["cores"], r.config["memory"],
		first(r.config["load-start"]), first(r.config["load-end"]))
	if len(extra) > 0 {
		s += "; " + strings.Join(extra, ", ")
	}
	return s + ". Each cell: median (min–max) over n repetitions.\n"
}

func renderTable(t table, r *run) string {
	if r == nil {
		return notMeasured(t.suite)
	}
	var names []string
	for _, n := range r.names {
		if strings.HasPrefix(n, t.prefix) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return caption(r) + "\n*Not measured at this commit: the run has no " + strings.TrimSuffix(t.prefix, "/") + " figures.*\n"
	}
	cols := t.columns
	if cols == nil {
		seen := map[string]bool{}
		for _, n := range names {
			for _, u := range r.units[n] {
				if !seen[u] {
					seen[u] = true
					cols = append(cols, column{u, u})
				}
			}
		}
	}
	// Leave out the columns no row has.
	var used []column
	for _, c := range cols {
		for _, n := range names {
			if _, ok := r.stat(n, c.unit); ok {
				used = append(used, c)
				break
			}
		}
	}
	var b strings.Builder
	b.WriteString(caption(r))
	b.WriteString("\n| run | n |")
	for _, c := range used {
		b.WriteString(" " + c.header + " |")
	}
	b.WriteString("\n| --- | --- |" + strings.Repeat(" --- |", len(used)) + "\n")
	for _, n := range names {
		reps := 0
		var cells []string
		for _, c := range used {
			st, ok := r.stat(n, c.unit)
			if !ok {
				cells = append(cells, "")
				continue
			}
			reps = max(reps, st.n)
			cells = append(cells, cell(st))
		}
		label := strings.TrimPrefix(strings.TrimPrefix(n, t.prefix), "/")
		if label == "" {
			label = n
		}
		fmt.Fprintf(&b, "| %s | %d | %s |\n", label, reps, strings.Join(cells, " | "))
	}
	return b.String()
}

// renderGoals is a goals table: each goal's figure (the median of its
// suite's latest run), whether it is met, and by how much it is missed.
func renderGoals(gs []goal, runs map[string]*run) string {
	var b strings.Builder
	b.WriteString("| figure | goal | median (min–max) | n | met? | run |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, g := range gs {
		r, st, ok := g.measure(runs)
		if !ok {
			fmt.Fprintf(&b, "| %s | %s | not measured at this commit | | | `%s` |\n", g.label, g.show, suites[g.suite])
			continue
		}
		smoke := ""
		if r.smaller() {
			smoke = ", a smoke run"
		}
		fmt.Fprintf(&b, "| %s | %s | %s %s | %d | %s | %s%s |\n", g.label, g.show, cell(st), g.unit, st.n, verdict(g, st.median), g.source(r), smoke)
	}
	return b.String()
}

// verdict says whether median meets g, and otherwise by how much it misses
// it, relative to the target.
func verdict(g goal, median float64) string {
	miss := (g.target - median) / g.target
	if g.atMost {
		miss = (median - g.target) / g.target
	}
	if miss <= 0 {
		return "met"
	}
	return fmt.Sprintf("**missed by %.0f %%**", math.Max(1, math.Round(miss*100)))
}

func renderFigures(fs []figure, runs map[string]*run) string {
	var b strings.Builder
	b.WriteString("| figure | median (min–max) | n | run |\n| --- | --- | --- | --- |\n")
	for _, f := range fs {
		r, st, ok := f.measure(runs)
		if !ok {
			fmt.Fprintf(&b, "| %s | not measured at this commit | | `%s` |\n", f.label, suites[f.suite])
			continue
		}
		smoke := ""
		if r.smaller() {
			smoke = ", smaller than the suite's full run (a smoke run)"
		}
		fmt.Fprintf(&b, "| %s | %s %s | %d | %s%s |\n", f.label, cell(st), f.unit, st.n, f.source(r), smoke)
	}
	return b.String()
}

// measure returns f's suite's latest run and f's figure in it; false when
// the suite has no run or the run does not have the figure.
func (f figure) measure(runs map[string]*run) (*run, stat, bool) {
	r := runs[f.suite]
	if r == nil {
		return nil, stat{}, false
	}
	st, ok := r.stat(f.name, f.unit)
	return r, st, ok
}

// source names r, the run f's figure comes from: command, commit, day and
// load at its start.
func (f figure) source(r *run) string {
	return fmt.Sprintf("`%s` at `%s`, %s, load %s", suites[f.suite], shortCommit(r.config["commit"]),
		strings.SplitN(r.config["date"], "T", 2)[0], strings.Fields(r.config["load-start"] + " ?")[0])
}

func shortCommit(c string) string {
	h, dirty := strings.CutSuffix(c, "-dirty")
	if len(h) > 7 {
		h = h[:7]
	}
	if dirty {
		h += "-dirty"
	}
	return h
}

// cell is a figure's median, with its range when it was measured more than
// once.
func cell(s stat) string {
	if s.n == 1 || s.min == s.max {
		return num(s.median)
	}
	return fmt.Sprintf("%s (%s–%s)", num(s.median), num(s.min), num(s.max))
}

// num formats v to three significant figures, without an exponent for the
// sizes benchmarks have.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case a == 0:
		return "0"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	case a >= 0.001:
		return fmt.Sprintf("%.3f", v)
	default:
		return fmt.Sprintf("%.2g", v)
	}
}
