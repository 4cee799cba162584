package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/perf/benchfmt"
)

// run is one results file: its configuration (commit, date, machine, load,
// the suite's own keys) and every figure by benchmark name and unit, one
// value per repetition.
type run struct {
	file   string
	config map[string]string
	keys   []string // config keys in file order
	names  []string // benchmark names in first-appearance order, without "Benchmark"
	units  map[string][]string
	values map[string]map[string][]float64 // name -> unit -> repetitions
}

func (r *run) suite() string { return r.config["suite"] }

// smaller reports whether the run is not its suite's full run: its size
// says so, or environment variables changed it. The binaries a run
// measures (KUBETASK_BENCH_BIN, and KUBETASK_BENCH_BASELINE_BIN beside it)
// change what is measured, not how much.
func (r *run) smaller() bool {
	size, ok := r.config["size"]
	if ok && size != "full" {
		return true
	}
	for _, kv := range strings.Fields(r.config["env"]) {
		if name, _, _ := strings.Cut(kv, "="); name != "KUBETASK_BENCH_BIN" && name != "KUBETASK_BENCH_BASELINE_BIN" {
			return true
		}
	}
	return false
}

// readRun reads one results file with benchfmt. The configuration is the
// file's whole header, including load-end, which precedes the results.
func readRun(name string, in io.Reader) (*run, error) {
	r := &run{file: name, config: map[string]string{}, units: map[string][]string{}, values: map[string]map[string][]float64{}}
	rd := benchfmt.NewReader(in, name)
	for rd.Scan() {
		switch rec := rd.Result().(type) {
		case *benchfmt.SyntaxError:
			return nil, rec
		case *benchfmt.Result:
			for _, c := range rec.Config {
				if _, ok := r.config[c.Key]; !ok && c.File {
					r.keys = append(r.keys, c.Key)
				}
				r.config[c.Key] = string(c.Value)
			}
			n := strings.TrimPrefix(string(rec.Name.Full()), "Benchmark")
			if _, ok := r.values[n]; !ok {
				r.names = append(r.names, n)
				r.values[n] = map[string][]float64{}
			}
			for _, v := range rec.Values {
				unit, val := v.OrigUnit, v.OrigValue
				if unit == "" {
					unit, val = v.Unit, v.Value
				}
				if _, ok := r.values[n][unit]; !ok {
					r.units[n] = append(r.units[n], unit)
				}
				r.values[n][unit] = append(r.values[n][unit], val)
			}
		}
	}
	if err := rd.Err(); err != nil {
		return nil, err
	}
	if len(r.names) > 0 && r.suite() == "" {
		return nil, fmt.Errorf("%s: no suite line", name)
	}
	return r, nil
}

// latestRuns reads every *.txt in dir and keeps each suite's latest run by
// its date line (then by file name). A file without a figure (its
// configuration is known only through its results) is left out.
func latestRuns(dir string) (map[string]*run, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return nil, err
	}
	slices.Sort(paths)
	latest := map[string]*run{}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		r, err := readRun(filepath.Base(p), f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("results file %s: %w", p, err)
		}
		if len(r.names) == 0 {
			continue // a run that failed before its first figure
		}
		if old := latest[r.suite()]; old == nil || cmp.Compare(r.config["date"], old.config["date"]) >= 0 {
			latest[r.suite()] = r
		}
	}
	return latest, nil
}

// stat is one figure over its repetitions.
type stat struct {
	min, median, max float64
	n                int
}

func (r *run) stat(name, unit string) (stat, bool) {
	vs := slices.Clone(r.values[name][unit])
	if len(vs) == 0 {
		return stat{}, false
	}
	slices.Sort(vs)
	med := vs[len(vs)/2]
	if len(vs)%2 == 0 {
		med = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	return stat{min: vs[0], median: med, max: vs[len(vs)-1], n: len(vs)}, true
}
