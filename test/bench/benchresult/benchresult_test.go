package benchresult

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLine(t *testing.T) {
	tests := map[string]struct {
		name   string
		values []Value
		want   string
		ok     bool
	}{
		"values in order":   {"Executor/S0/unlimited", []Value{{39.25, "tasks/s"}, {5.666666, "calls/task"}}, "BenchmarkExecutor/S0/unlimited 1 39.25 tasks/s 5.66667 calls/task", true},
		"spaces in a name":  {"Executor/Job controller", []Value{{1, "x"}}, "BenchmarkExecutor/Job_controller 1 1 x", true},
		"NaN left out":      {"X", []Value{{math.NaN(), "a"}, {2, "b"}}, "BenchmarkX 1 2 b", true},
		"bad unit left out": {"X", []Value{{1, "a b"}, {2, ""}}, "BenchmarkX 1", false},
		"no values":         {"X", nil, "BenchmarkX 1", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := Line(tc.name, tc.values...)
			if got != tc.want || ok != tc.ok {
				t.Errorf("Line = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestStartWritesTheFile: the header names the suite, commit, machine and
// load; every Add rewrites the file; a second Start of the suite is the
// same run.
func TestStartWritesTheFile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KUBETASK_BENCH_RESULTS", dir)
	t.Setenv("KUBETASK_BENCH_COMMIT", "0123456789abcdef-dirty")
	r := Start(t, "writertest", "size", "tiny")
	if again := Start(t, "writertest"); again != r {
		t.Error("a second Start of the suite made another run")
	}
	r.Add(t, "A/b", Value{1.5, "tasks/s"})
	r.Add(t, "A/b", Value{2, "tasks/s"})
	if filepath.Dir(r.Path()) != dir || !strings.HasPrefix(filepath.Base(r.Path()), "writertest-") || !strings.HasSuffix(r.Path(), "-0123456-dirty.txt") {
		t.Errorf("path %s", r.Path())
	}
	b, err := os.ReadFile(r.Path())
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, want := range []string{"\nsuite: writertest\n", "\ncommit: 0123456789abcdef-dirty\n", "\ncores: ", "\nload-start: ", "\nload-end: ", "\nsize: tiny\n", "\nBenchmarkA/b 1 1.5 tasks/s\nBenchmarkA/b 1 2 tasks/s\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("file lacks %q:\n%s", want, text)
		}
	}
}

func TestMedian(t *testing.T) {
	if got := Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("odd: %v", got)
	}
	if got := Median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("even: %v", got)
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("none: not NaN")
	}
}
