# kubetask's developer entry points. `make help` lists them.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
# The whole suite on a 2-core machine: unit, integration (real control plane),
# fault, simulated-node and end-to-end tests.
TEST_TIMEOUT ?= 75m

# What `kubetask version` reports (internal/version). The date is the commit's
# time, so that two builds of one commit are the same bytes; VERSION is the
# nearest v* tag (git describe), else a Go pseudo-version of the commit.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo -dirty)
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || \
  echo "v0.0.0-$$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S 2>/dev/null)-$$(git rev-parse --short=12 HEAD 2>/dev/null)")
BUILD_DATE := $(shell date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ)
VERSION_PKG := github.com/kubetask/kubetask/internal/version
LDFLAGS := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).commit=$(COMMIT) -X $(VERSION_PKG).date=$(BUILD_DATE)
export SOURCE_DATE_EPOCH

.PHONY: help build image image-test release release-check components lighthouse up demo down test test-repeat unit importcheck lint vet fmt bench bench-run bench-fair bench-storm bench-serve bench-clusters bench-podevents bench-observe bench-recovery bench-machine bench-demo bench-docs bench-docs-check chaos sim clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/kubetask (static, as kubectl's releases: without cgo it maps no libc and starts lighter), its version stamped
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/kubetask ./cmd/kubetask

# The image of `kubetask serve` (docs/deploy.md): built by tools/image with
# go-containerregistry, no container engine; reproducible from the commit.
IMAGE_REPO ?= ghcr.io/kubetask/kubetask
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
# The platform whose image the tar's manifest.json names (docker load, podman load).
IMAGE_TAR_PLATFORM ?= linux/$(shell $(GO) env GOARCH)
image: ## build the kubetask serve image into bin/image: OCI layout, a tar for docker/podman load, ctr import, kind load and crane push, SBOMs
	@set -e; args=; for p in $(IMAGE_PLATFORMS); do \
	  out=$(BIN)/image/$${p/\//_}/kubetask; \
	  echo "go build $$p"; \
	  CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $$out ./cmd/kubetask; \
	  args="$$args -binary $$p=$$out"; \
	done; \
	cd tools/image && $(GO) run . $$args -version $(VERSION) -revision $(COMMIT) -repository $(IMAGE_REPO) -tag latest -platform $(IMAGE_TAR_PLATFORM) \
	  -ca-bundle /etc/ssl/certs/ca-certificates.crt -ca-version "$$(dpkg-query -W -f '$${Version}' ca-certificates 2>/dev/null)" -out $(BIN)/image

# goreleaser from the Go module proxy, pinned (the first run builds it: minutes).
GORELEASER ?= $(GO) run github.com/goreleaser/goreleaser/v2@v2.17.0
release: ## build the CLI for linux and darwin, amd64 and arm64, with archives, checksums.txt and SBOMs into bin/dist (goreleaser, snapshot: offline, publishes nothing)
	$(GORELEASER) release --snapshot --clean

release-check: ## check .goreleaser.yaml, build it for this machine's platform, and compile the CLI for darwin (.ci/run runs it so that make release cannot rot)
	$(GORELEASER) check
	$(GORELEASER) build --snapshot --clean --single-target
	CGO_ENABLED=0 GOOS=darwin GOARCH=arm64 $(GO) build -trimpath -o /dev/null ./cmd/kubetask

image-test: ## the tests of tools/image (its own module, which go test ./... does not reach)
	cd tools/image && $(GO) test -count=1 ./...

components: build ## build (or reuse from the cache) etcd, kube-apiserver, scheduler, controller-manager, kubectl, kwok, jaeger (the tracing tests' receiver); link kubectl into bin/
	$(BIN)/kubetask cluster build
	@ln -sf "$$($(BIN)/kubetask cluster build 2>/dev/null | awk '$$1=="kubectl"{print $$3}')" $(BIN)/kubectl

LIGHTHOUSE := tools/lighthouse/node_modules/.bin/lighthouse
lighthouse: $(LIGHTHOUSE) ## install the pinned Lighthouse that test/e2e/web runs (npm ci in tools/lighthouse)
$(LIGHTHOUSE): tools/lighthouse/package-lock.json
	npm ci --prefix tools/lighthouse --no-audit --no-fund --ignore-scripts --loglevel=error
	@touch $@

up: components ## start the local cluster in the background (one local process node)
	$(BIN)/kubetask cluster up

# The demo builds only what it runs: `cluster up` builds the control plane's
# four components (progress on stderr); kubectl and kwok, which `components`
# also builds, wait for whoever needs them.
demo: build ## run examples/local/sidecar-task.yaml with kubetask run on the local cluster (started, and its components built, if needed)
	$(BIN)/kubetask cluster up >/dev/null
	$(BIN)/kubetask run -f examples/local/sidecar-task.yaml --kubeconfig "$$($(BIN)/kubetask cluster kubeconfig)"

down: build ## stop the local cluster and remove its state
	$(BIN)/kubetask cluster down

vet: ## go vet every package
	$(GO) vet ./...

fmt: ## check formatting (gofmt)
	@out=$$(gofmt -l cmd internal pkg test); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

unit: ## unit tests only (no cluster)
	$(GO) test -count=1 ./internal/... ./pkg/...

importcheck: ## a module outside kubetask imports pkg/executor, pkg/runner, pkg/store, pkg/task (go mod tidy, build, vet)
	GO="$(GO)" test/importcheck/check.sh

test: fmt vet importcheck bench-docs-check components lighthouse ## every test: unit, integration, faults, sim nodes, end-to-end (builds what they need)
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
	cd tools/image && $(GO) test -count=1 ./...

N ?= 5
test-repeat: fmt vet importcheck components lighthouse ## run the whole suite N times in a row (N=5), each run's log in /tmp/kubetask-test-repeat/; fails when any run failed
	@mkdir -p /tmp/kubetask-test-repeat; fails=0; \
	for i in $$(seq 1 $(N)); do \
	  log=/tmp/kubetask-test-repeat/run-$$i.log; start=$$(date +%s); \
	  if { $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./... && (cd tools/image && $(GO) test -count=1 ./...); } >$$log 2>&1; then r=ok; else r=FAILED; fails=$$((fails+1)); fi; \
	  echo "run $$i of $(N): $$r in $$(( $$(date +%s) - start )) s ($$log)"; \
	  grep -E '^(--- FAIL|FAIL)' $$log || true; \
	done; \
	echo "$$(( $(N) - fails )) passed, $$fails failed"; [ $$fails -eq 0 ]

# Every bench target writes its run's results file (test/bench/benchresult: Go
# benchmark format, with the commit, date, machine and load) into
# docs/benchmarks-results; make bench-docs writes the docs' tables from the
# latest file of each suite.
BENCH_RESULTS := $(CURDIR)/docs/benchmarks-results
BENCH_ENV := KUBETASK_BENCH_RESULTS=$(BENCH_RESULTS) KUBETASK_BENCH_COMMIT=$(COMMIT)

bench: components ## the comparison of docs/benchmarks.md (S0 minimal and equal-work, alternating pairs, Job controller, scale, memory, SQLite): about 25 min on 2 cores; KUBETASK_BENCH_SIZE=tiny for a smoke run
	$(BENCH_ENV) $(GO) test ./test/bench/executor -run '^$$' -bench BenchmarkExecutor -benchtime 1x -timeout 90m

PAIRS ?= 12
bench-run: components ## kubetask run against kubectl run on the local cluster (docs/benchmarks.md): PAIRS=12 rounds, BASELINE=path/to/kubetask adds an older build
	$(BENCH_ENV) $(GO) test ./test/bench/run -run '^$$' -bench BenchmarkRun -benchtime 1x -timeout 30m -pairs $(PAIRS) $(if $(BASELINE),-baseline $(BASELINE))

bench-fair: components ## fair slot order against FIFO (test/bench/executor BenchmarkFairShare)
	$(BENCH_ENV) $(GO) test ./test/bench/executor -run '^$$' -bench BenchmarkFairShare -benchtime 1x -timeout 60m

bench-storm: components ## outcomes through a storm of 410 Expired and API server faults (test/bench/storm)
	$(BENCH_ENV) $(GO) test ./test/bench/storm -run '^$$' -bench BenchmarkStorm -benchtime 1x -timeout 60m

bench-serve: components ## kubetask serve: submissions against plain creates, log capture, replicas (test/bench/serve)
	$(BENCH_ENV) $(GO) test ./test/bench/serve -run '^$$' -bench . -benchtime 1x -timeout 150m

bench-clusters: components ## kubetask serve over two clusters against two single-cluster services, placement p99 (test/bench/serve BenchmarkServeClusters)
	$(BENCH_ENV) $(GO) test ./test/bench/serve -run '^$$' -bench BenchmarkServeClusters -benchtime 1x -timeout 40m

bench-podevents: components ## kubetask serve with --pod-events against without, in one run (test/bench/serve BenchmarkServePodEvents)
	$(BENCH_ENV) $(GO) test ./test/bench/serve -run '^$$' -bench BenchmarkServePodEvents -benchtime 1x -timeout 40m

bench-observe: components ## kubetask serve with everything of issue 36 on (pod events, traces to an OTLP receiver, /metrics scraped each second) against off, in one run (test/bench/serve BenchmarkServeObservability)
	$(BENCH_ENV) $(GO) test ./test/bench/serve -run '^$$' -bench BenchmarkServeObservability -benchtime 1x -timeout 40m

bench-recovery: components ## recovery after a restart of the executor or the API server (test/bench/recovery)
	$(BENCH_ENV) $(GO) test ./test/bench/recovery -run '^$$' -bench BenchmarkRecovery -benchtime 1x -timeout 60m

bench-machine: ## how much the machine itself drifts run to run (test/bench/machine)
	$(BENCH_ENV) $(GO) test ./test/bench/machine -run '^$$' -bench BenchmarkMachineDrift -benchtime 1x -timeout 30m

bench-demo: ## cold `make demo` on a fresh machine: a fresh clone, empty Go, module and component caches (tools/bench-demo.sh): about 15-20 min
	tools/bench-demo.sh

bench-docs: ## write docs/benchmarks.md's tables and README.md's figures from the latest results files (tools/benchreport)
	cd tools/benchreport && $(GO) run . -root $(CURDIR)

bench-docs-check: ## the tests of tools/benchreport, and the docs are what make bench-docs writes from the committed results files
	cd tools/benchreport && $(GO) test -count=1 ./...

chaos: components ## the chaos suite at full size (docs/chaos.md): 3 replicas, 2,000+ tasks, 27 faults, the history checker's table; SEED=n replays a run
	KUBETASK_CHAOS_SEED=$(SEED) $(GO) test ./test/faults/chaos -run '^$$' -bench BenchmarkChaos -benchtime 1x -timeout 90m

SEEDS ?= 1000
sim: ## the deterministic simulator (docs/simulation.md) on SEEDS=1000 fresh seeds; stops at the first failing seed, shrinks it and prints its replay command
	KUBETASK_SIM_SEEDS=$(SEEDS) $(GO) test ./internal/simulation -run 'TestSimulation$$' -count=1 -v -timeout 0

lint: ## golangci-lint with the pinned version and .golangci.yml
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0 run ./...

clean: ## remove bin/ (the component cache under ~/.cache/kubetask stays)
	rm -rf $(BIN)
