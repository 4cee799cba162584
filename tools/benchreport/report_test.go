package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestGenerate: each block is replaced by its table from the latest run of
// its suite; repetitions give median (min–max); a suite with no results
// file, or a run without the block's figures, says "not measured".
func TestGenerate(t *testing.T) {
	runs, err := latestRuns("testdata")
	if err != nil {
		t.Fatal(err)
	}
	if got := runs["bench"].config["commit"]; !strings.HasPrefix(got, "0123456") {
		t.Fatalf("latest bench run is %s, want the one of 2026-12-06", got)
	}
	caption := "`make bench` at `0123456789abcdef0123456789abcdef01234567`, 2026-12-06 07:00 UTC (go1.26.8); Test CPU, 2 cores, 23.5 GiB; load 4.10 at the start, 5.20 at the end; size tiny. Each cell: median (min–max) over n repetitions.\n"
	tests := map[string]struct {
		block, want string
	}{
		"executor: only the columns measured": {"table=executor", caption + `
| run | n | tasks/s | vs S0 | client calls/task | lag to the durable write p99 ms |
| --- | --- | --- | --- | --- | --- |
| S0/unlimited | 1 | 60.0 |  | 3.00 |  |
| kubetask/unlimited | 1 | 39.2 | 0.654 | 5.67 | 12.0 |
`},
		"pairs: median and range of three": {"table=pairs", caption + `
| run | n | tasks/s | vs equal-work S0, same pair |
| --- | --- | --- | --- |
| S0-equal | 3 | 52.0 (50.0–55.0) |  |
| kubetask | 3 | 44.0 (40.0–49.4) | 0.800 (0.800–0.950) |
`},
		"no results file of the suite": {"table=storm", "*Not measured at this commit: no results file of `make bench-storm` in docs/benchmarks-results.*\n"},
		"a run without the figures":    {"table=store", caption + "\n*Not measured at this commit: the run has no Store figures.*\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			doc := "before\n<!-- bench:begin " + tc.block + " -->\nhand-typed figures\n<!-- bench:end -->\nafter\n"
			got, err := generate(doc, runs)
			if err != nil {
				t.Fatal(err)
			}
			want := "before\n<!-- bench:begin " + tc.block + " -->\n" + tc.want + "<!-- bench:end -->\nafter\n"
			if got != want {
				t.Errorf("got\n%s\nwant\n%s", got, want)
			}
			if again, _ := generate(got, runs); again != got {
				t.Errorf("not idempotent:\n%s", again)
			}
		})
	}
}

func TestGenerateFigures(t *testing.T) {
	runs, err := latestRuns("testdata")
	if err != nil {
		t.Fatal(err)
	}
	got := renderFigures([]figure{
		{"executor", "bench", "Executor/kubetask/unlimited", "tasks/s"},
		{"pairs", "bench", "Pairs/kubetask", "x-S0-equal"},
		{"storm", "storm", "Storm", "lag-p99-s"},
	}, runs)
	want := `| figure | median (min–max) | n | run |
| --- | --- | --- | --- |
| executor | 39.2 tasks/s | 1 | ` + "`make bench` at `0123456`, 2026-12-06, load 4.10, smaller than the suite's full run (a smoke run)" + ` |
| pairs | 0.800 (0.800–0.950) x-S0-equal | 3 | ` + "`make bench` at `0123456`, 2026-12-06, load 4.10, smaller than the suite's full run (a smoke run)" + ` |
| storm | not measured at this commit | | ` + "`make bench-storm`" + ` |
`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestGenerateGoals: a goal met, one missed (at least and at most), by how
// much, and one not measured.
func TestGenerateGoals(t *testing.T) {
	runs, err := latestRuns("testdata")
	if err != nil {
		t.Fatal(err)
	}
	got := renderGoals([]goal{
		{figure{"pairs", "bench", "Pairs/kubetask", "x-S0-equal"}, false, 0.95, "≥ 0.95x"},
		{figure{"pairs, lower", "bench", "Pairs/kubetask", "x-S0-equal"}, false, 0.75, "≥ 0.75x"},
		{figure{"lag", "bench", "Executor/kubetask/unlimited", "durable-lag-p99-ms"}, true, 10, "≤ 10 ms"},
		{figure{"lag, higher", "bench", "Executor/kubetask/unlimited", "durable-lag-p99-ms"}, true, 12, "≤ 12 ms"},
		{figure{"demo", "demo", "Demo/cold", "s"}, true, 780, "≤ 13 min"},
	}, runs)
	run := "`make bench` at `0123456`, 2026-12-06, load 4.10, a smoke run"
	want := `| figure | goal | median (min–max) | n | met? | run |
| --- | --- | --- | --- | --- | --- |
| pairs | ≥ 0.95x | 0.800 (0.800–0.950) x-S0-equal | 3 | **missed by 16 %** | ` + run + ` |
| pairs, lower | ≥ 0.75x | 0.800 (0.800–0.950) x-S0-equal | 3 | met | ` + run + ` |
| lag | ≤ 10 ms | 12.0 durable-lag-p99-ms | 1 | **missed by 20 %** | ` + run + ` |
| lag, higher | ≤ 12 ms | 12.0 durable-lag-p99-ms | 1 | met | ` + run + ` |
| demo | ≤ 13 min | not measured at this commit | | | ` + "`make bench-demo`" + ` |
`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := generate("<!-- bench:begin goals=34 -->\n<!-- bench:end -->\n", runs); err != nil {
		t.Errorf("issue 34's goals: %v", err)
	}
}

func TestGenerateUnknownBlock(t *testing.T) {
	if _, err := generate("<!-- bench:begin table=nope -->\n<!-- bench:end -->\n", nil); err == nil {
		t.Error("an unknown table generated without an error")
	}
}

func TestNum(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 1234.5: "1234", 39.25: "39.2", 5.666: "5.67", 0.6543: "0.654", 0.00012: "0.00012", -2.5: "-2.50"} {
		if got := num(v); got != want {
			t.Errorf("num(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestDocsAreGenerated: the committed README.md and docs/benchmarks.md are
// what make bench-docs writes from the committed results files, so a
// figure typed by hand into a generated block fails here.
func TestDocsAreGenerated(t *testing.T) {
	stale, err := writeDocs(filepath.Join("..", ".."), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) > 0 {
		t.Errorf("%v differ from what the results files say: run make bench-docs (and do not edit between bench:begin and bench:end)", stale)
	}
}
