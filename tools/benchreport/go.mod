// Module benchreport writes the tables of docs/benchmarks.md and README.md's
// figures from the benchmarks' results files (make bench-docs). It is
// separate from the main module so that golang.org/x/perf stays out of the
// library's module graph.
module github.com/kubetask/kubetask/tools/benchreport

go 1.26.0

require golang.org/x/perf v0.0.0-20260908200009-22c9c6c9d4da

require github.com/aclements/go-moremath v0.0.0-20210112150236-f10218a38794 // indirect
