GO ?= go
GOLANGCI_VERSION ?= v2.6.2
# staticcheck 2026.2.2 (module honnef.co/go/tools), fetched from the Go module proxy by `go run`.
STATICCHECK_VERSION ?= v0.8.2

.PHONY: test deps vet verify lint unused fmt-check bench bench-long bench-smoke demo build node-test gpu-check chaos fairness-sweep

build:
	$(GO) build -o bin/sluice ./cmd/sluice

# The test command of the README and CI: installs what a fresh machine lacks,
# then vets, checks that no code is left that nothing uses, and runs every
# test with the race detector.
test: deps unused
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

# Code nothing uses (staticcheck's U1000, the `unused` check), so that what
# was deleted stays deleted. Part of `make test`; `go run` builds the pinned
# staticcheck from the module proxy on first use.
unused:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -checks U1000 ./...

deps:
	./scripts/ensure-deps.sh
	./scripts/npm-deps.sh

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi

lint:
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION) run ./...

bench-smoke:
	$(GO) test -run='^$$' -bench=. -benchtime=1x ./...

# The house-style gate: formatting, lint, the tests, and every benchmark once.
# Lint is kept out of `make test` because building golangci-lint from the
# module proxy takes several minutes on a 2-core machine.
verify: fmt-check lint test bench-smoke

demo: build
	./bin/sluice demo

# Side-by-side benchmarks (direct, HAProxy, nginx, Sluice) and the Go
# benchmarks; writes docs/benchmarks/report.md. About ten minutes.
bench: build
	./scripts/bench.sh

# The same with every preset at its own duration (120–300 s of arrivals):
# about an hour; not part of `make test` or `make bench`.
bench-long: build
	BENCH_SCENARIO_S=full BENCH_OUT=$${BENCH_OUT:-BENCHMARKS-long.md} ./scripts/bench.sh

# The seeded fault simulator (test/chaos) over more seeds than make test
# runs: SEEDS per backend, from BASE (replay one with SEED=n).
SEEDS ?= 50
BASE ?= 1
chaos: deps
	$(GO) test -count=1 -timeout 0 ./test/chaos -run TestChaos -chaos.seeds=$(SEEDS) -chaos.base=$(BASE) $(if $(SEED),-chaos.seed=$(SEED))

# The seeded fairness scenarios (scheduler/gate/fairgen_test.go) over more seeds
# than make test runs: FAIR_SEEDS from FAIR_BASE, violations logged, with a
# summary line; a discrete-event simulation, about a second per 100 seeds.
# FAIR_ONSET=late starts every heavy tenant late (known to the gate, silent);
# trickle does so with each sending a request every few seconds before.
# FAIR_SAMPLES=100 runs each scenario until every light tenant expects 100
# measured requests (a p99 of fewer is the slowest one), up to an hour.
FAIR_SEEDS ?= 500
FAIR_BASE ?= 1
fairness-sweep:
	$(GO) test -count=1 -timeout 0 -v ./scheduler/gate -run TestFairnessScenarios -fairgen.seeds=$(FAIR_SEEDS) -fairgen.base=$(FAIR_BASE) -fairgen.report $(if $(FAIR_ONSET),-fairgen.onset=$(FAIR_ONSET)) $(if $(FAIR_SAMPLES),-fairgen.samples=$(FAIR_SAMPLES))

# On a node with an NVIDIA driver: inventory, then 30 s of NVML telemetry
# (GPU_CHECK_DURATION to change it); fails when NVML cannot be read.
gpu-check:
	./scripts/gpu-check.sh
