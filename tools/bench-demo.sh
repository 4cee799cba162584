#!/usr/bin/env bash
# bench-demo.sh: how long `make demo` takes on a fresh machine (issue 34's
# goal: at most 13 minutes). A fresh clone of HEAD, with empty Go build and
# module caches, an empty component cache (so the control plane is built from
# its pinned modules) and no cluster state, runs `make demo`; the wall time
# goes to docs/benchmarks-results/demo-<date>-<commit>.txt, which
# `make bench-docs` reads. Nothing of the run is left but that file.
#
#   make bench-demo          # about 15-20 min on 2 cores; stop your own local cluster first
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
results=${KUBETASK_BENCH_RESULTS:-$root/docs/benchmarks-results}
work=$(mktemp -d /tmp/kubetask-bench-demo.XXXXXX)
cleanup() {
	(cd "$work/src" 2>/dev/null && KUBETASK_STATE_DIR="$work/state" bin/kubetask cluster down >/dev/null 2>&1) || true
	GOMODCACHE="$work/gomod" go clean -modcache >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

git clone -q "$root" "$work/src"
commit=$(git -C "$work/src" rev-parse HEAD)
export GOCACHE="$work/gocache" GOMODCACHE="$work/gomod" KUBETASK_CACHE_DIR="$work/kcache" KUBETASK_STATE_DIR="$work/state"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
start=$(date +%s.%N)
if ! (cd "$work/src" && make demo) >"$work/demo.log" 2>&1; then
	tail -40 "$work/demo.log" >&2
	echo "bench-demo: make demo failed (its log's end above)" >&2
	exit 1
fi
end=$(date +%s.%N)
seconds=$(echo "$end - $start" | bc)
mkdir -p "$results"
out="$results/demo-$(date -u -d "$date" +%Y%m%dT%H%M%SZ)-${commit:0:7}.txt"
{
	echo "# kubetask benchmark results: Go benchmark format (benchstat, golang.org/x/perf/benchfmt); make bench-docs writes the docs from them"
	echo "suite: demo"
	echo "commit: $commit"
	echo "date: $date"
	echo "go: $(go env GOVERSION)"
	echo "goos: $(go env GOOS)"
	echo "goarch: $(go env GOARCH)"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
	echo "cores: $(nproc)"
	echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "load-start: $load_start"
	echo "size: full"
	echo "load-end: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "BenchmarkDemo/cold 1 $seconds s"
} >"$out"
echo "bench-demo: make demo from a fresh clone with empty caches: $seconds s ($out)"
