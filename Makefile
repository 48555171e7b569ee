# make test: what CI runs. make build: bin/llm-dedupe-proxy. make run: serve with the defaults.

VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: test deps fmt-check vet chart-test build run bench explore

# TEST_TIMEOUT bounds each package's test binary: a hung test fails its package with the
# names of the tests still running and every goroutine's stack, instead of using up CI's
# budget. Several times the slowest package's time (e2e; see e2e/README.md).
TEST_TIMEOUT ?= 15m

test: deps fmt-check vet
	go test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(MAKE) --no-print-directory chart-test

# The Helm chart's tests: lint, render over several value sets, strict decoding with the
# Kubernetes API types, the rendered configuration through the proxy's own check, promtool
# on the alerts. A module of its own (deploy/helm/charttest; see docs/adr/0053-helm-chart.md),
# which `go test ./...` at the root does not enter.
chart-test:
	cd deploy/helm/charttest && go vet ./... && go test -count=1 -timeout $(TEST_TIMEOUT) ./...

deps:
	bash scripts/ensure-deps.sh

fmt-check:
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi

vet:
	go vet ./...
	go vet -tags pprof ./cmd/...

build:
	go build -ldflags "$(LDFLAGS)" -o bin/llm-dedupe-proxy ./cmd/llm-dedupe-proxy

run:
	go run -ldflags "$(LDFLAGS)" ./cmd/llm-dedupe-proxy serve

# make bench: the benchmark harness (bench/, about 7 minutes; not part of make test). It
# writes BENCHMARKS.md and the raw numbers in bench/results/. BENCHFLAGS=-quick: a smoke run.
bench:
	bash bench/ensure-deps.sh
	go run ./bench $(BENCHFLAGS)

# make explore: the simulator's seeded exploration (singleflight/sim, docs/simulator.md),
# SEEDS seeds from FIRST, for as long as that takes (about 6,000 a minute on 2 cores). A
# seed that breaks an invariant prints the invariant, its timeline and how to replay it.
SEEDS ?= 20000
FIRST ?= 1
explore:
	go test -c -o bin/sim.test ./singleflight/sim
	cd singleflight/sim && bash -o pipefail -c "../../bin/sim.test -test.run '^TestExplore$$' -test.timeout 0 -test.v \
		-sim.seeds=$(SEEDS) -sim.first=$(FIRST) | grep -v -E '^ *(=== (RUN|PAUSE|CONT)|--- PASS)'"
