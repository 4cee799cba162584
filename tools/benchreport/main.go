// Command benchreport writes the tables of docs/benchmarks.md and README.md's
// figures from the benchmarks' results files (make bench-docs), so that no
// figure is typed by hand: every block between
//
//	<!-- bench:begin table=NAME -->    (or figures=NAME)
//	<!-- bench:end -->
//
// is replaced by what the latest results file of the block's suite in
// docs/benchmarks-results says (test/bench/benchresult writes them), naming that
// run's commit, date, machine and load. A suite with no results file is
// marked "not measured at this commit".
//
//	cd tools/benchreport && go run . -root ../..          # rewrite the docs
//	cd tools/benchreport && go run . -root ../.. -check   # fail when they differ
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// docs are the files, relative to the repository's root, whose blocks are
// generated.
var docs = []string{"README.md", "docs/benchmarks.md"}

// resultsDir is where the benchmarks write their results files, relative
// to the repository's root.
const resultsDir = "docs/benchmarks-results"

func main() {
	root := flag.String("root", "../..", "the repository's root")
	check := flag.Bool("check", false, "write nothing; exit 1 when a document differs from what would be written")
	flag.Parse()
	stale, err := writeDocs(*root, !*check)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(2)
	}
	if *check && len(stale) > 0 {
		fmt.Fprintf(os.Stderr, "benchreport: %v differ from their results files: run make bench-docs\n", stale)
		os.Exit(1)
	}
}

// writeDocs generates every document from the latest runs and, when write is
// set, writes those that changed; it returns the documents that differ.
func writeDocs(root string, write bool) ([]string, error) {
	runs, err := latestRuns(filepath.Join(root, resultsDir))
	if err != nil {
		return nil, err
	}
	var stale []string
	for _, d := range docs {
		path := filepath.Join(root, d)
		old, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		doc, err := generate(string(old), runs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
		if doc == string(old) {
			continue
		}
		stale = append(stale, d)
		if write {
			if err := os.WriteFile(path, []byte(doc), 0o644); err != nil { //nolint:gosec // a document of the repository
				return nil, err
			}
		}
	}
	return stale, nil
}
