# Shale — developer entry points. Needs only Go (see go.mod for the version)
# and make. `make help` lists the targets.
#
# Knobs (override on the command line, e.g. `make fuzz FUZZTIME=2m`):
#   GO            the go command                          (go)
#   GOFLAGS       passed through to every go command      (your environment's)
#   RACE          race-detector flag for `make test`      (-race when cgo works)
#   TEST_TIMEOUT  go test -timeout for `make test`        (35m)
#   FUZZTIME      time per fuzz target for `make fuzz`     (30s)
#   FUZZ_PKGS     packages searched for Fuzz* targets     (./storage/... ./replication/... ./server/... ./backup/... ./proto/... ./client/...)
#   SOAK_TIMEOUT  go test -timeout for `make soak`        (6h)
#   SOAK_PKGS     packages tested by `make soak`          (./...)
#   BENCH_DIR     data directory for shale-bench          (./data/bench)
#   BENCH_ENGINES engines compared by `make bench`        (shale,pebble,goleveldb)
#   BENCH_ARGS    extra arguments for shale-bench          (none)
#   IMAGE         tag of the container image `make image` builds (shale:dev)
#   CHAOS_DURATION how long `make chaos` runs faults         (30m)
#   CHAOS_ARGS    extra flags for `make chaos` (-chaos.seed=N, -chaos.nodes=3,
#                 -chaos.nemeses=kill,pause, -chaos.out=DIR)  (none)

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO ?= go
GOFMT ?= $(shell $(GO) env GOROOT)/bin/gofmt
# GOFLAGS from the environment or the make command line reaches every go
# command unchanged; the targets add only the flags they need (-race, -tags,
# -timeout, -trimpath) on the command line, where they take precedence.

BIN := $(CURDIR)/bin
TEST_TIMEOUT ?= 35m
FUZZTIME ?= 30s
FUZZ_PKGS ?= ./storage/... ./replication/... ./server/... ./backup/... ./proto/... ./client/...
SOAK_TIMEOUT ?= 6h
SOAK_PKGS ?= ./...
BENCH_DIR ?= ./data/bench
BENCH_ENGINES ?= shale,pebble,goleveldb
BENCH_ARGS ?=
IMAGE ?= shale:dev
CHAOS_DURATION ?= 30m
CHAOS_ARGS ?=

# The container tests (chaos/, deploy/) run testcontainers-go without its
# reaper container: there is no registry to pull it from, and the tests
# remove their own containers, networks and volumes.
export TESTCONTAINERS_RYUK_DISABLED := true

# Modules beside the main one, each with its own go.mod, so that their heavy
# dependencies never enter the main module: bench/ (the peer engines),
# deploy/ (kustomize, the Kubernetes API types, testcontainers-go) and
# chaos/ (testcontainers-go); examples/quickstart is a program depending on
# the SDK as an application does. Their tests need a Docker engine (deploy/,
# chaos/: the smoke run of the fault suite, about 4 minutes) and run one
# package at a time, since they start clusters of containers. They run
# uncached (-count=1): the image they test is built from the whole tree,
# which Go's test cache does not see.
SUBMODULES := $(patsubst %/go.mod,%,$(wildcard bench/go.mod deploy/go.mod chaos/go.mod examples/quickstart/go.mod))

# The race detector needs cgo (a C compiler). On a machine without one, Go
# turns cgo off and `make test` runs without -race (with a warning) rather
# than failing. Set RACE= to turn it off explicitly.
CGO_ON := $(shell $(GO) env CGO_ENABLED 2>/dev/null)
ifeq ($(CGO_ON),1)
RACE ?= -race
else
RACE ?=
endif

# Binaries: every cmd/<name>/ directory holding Go files (none exist before
# the first binary lands, and the wildcard keeps `make build` working then).
CMD_DIRS := $(sort $(patsubst %/,%,$(dir $(wildcard cmd/*/*.go))))

# shale-bench lives in bench/, a separate module so that the peer engines it
# compares against (Pebble, goleveldb, etcd) never enter the main module.
BENCH_MAIN := bench/cmd/shale-bench
HAVE_BENCH := $(and $(wildcard bench/go.mod),$(wildcard $(BENCH_MAIN)/*.go))

.PHONY: help
help: ## List the targets.
	@echo "Shale make targets:"
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-11s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## Download the module dependencies (main module, bench/, deploy/, chaos/).
	$(GO) mod download
	@for m in $(SUBMODULES); do echo "cd $$m && $(GO) mod download"; (cd $$m && $(GO) mod download); done

# Both steps build with the same flags (-trimpath), so the second takes
# every package from the build cache the first filled: one compilation.
.PHONY: build
build: ## Compile every package (CGO_ENABLED=0) and put the binaries in ./bin.
	CGO_ENABLED=0 $(GO) build -trimpath ./...
	@$(MAKE) --no-print-directory binaries

.PHONY: binaries
binaries: ## Build only the binaries under cmd/ into ./bin (what make run needs).
ifneq ($(CMD_DIRS),)
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ $(addprefix ./,$(CMD_DIRS))
else
	@echo "binaries: no binaries under cmd/ yet"
endif

# The S3-compatible server the backup tests write to: versitygw, built from
# the Go module proxy at a pinned release (internal/s3test.Version) into
# $(BIN)/versitygw-$(VERSITYGW_VERSION), linked as $(BIN)/versitygw. About
# two minutes the first time; nothing after.
VERSITYGW_VERSION := v1.8.0
VERSITYGW := $(BIN)/versitygw-$(VERSITYGW_VERSION)

.PHONY: s3-server
s3-server: $(VERSITYGW) ## Build versitygw, the S3-compatible server the S3 backup tests start (from the Go module proxy).

$(VERSITYGW):
	@mkdir -p $(BIN)/.versitygw
	GOBIN=$(BIN)/.versitygw CGO_ENABLED=0 $(GO) install -trimpath github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)
	mv $(BIN)/.versitygw/versitygw $@
	ln -sf $(notdir $@) $(BIN)/versitygw

.PHONY: test
test: deps proto-check s3-server python-deps ## Check generated code, go vet, the lint tests, then all tests with -race (and the other modules' tests).
ifeq ($(RACE),)
	@echo "test: WARNING: running without the race detector (it needs cgo and a C compiler; CGO_ENABLED=$(CGO_ON))" >&2
endif
	$(GO) vet ./...
	$(GO) test -count=1 ./internal/lint/
	SHALE_TEST_VERSITYGW=$(VERSITYGW) $(GO) test $(RACE) -timeout $(TEST_TIMEOUT) ./...
# The allocation checks the race detector skips (it makes sync.Pool drop objects), and the storage
# model and crash tests at their full seeds (under -race they run two per option set), run without it.
ifneq ($(RACE),)
	$(GO) test -count=1 -run '^(TestIterZeroAllocs|TestDirectCalls)$$' ./storage/sstable/ ./client/
	$(GO) test -count=1 -run '^(TestModel|TestCrash)$$' ./storage/
endif
	@for m in $(SUBMODULES); do \
		echo "cd $$m && $(GO) vet ./... && $(GO) test -p 1 -count=1 -timeout $(TEST_TIMEOUT) ./..."; \
		(cd $$m && $(GO) vet ./... && $(GO) test -p 1 -count=1 -timeout $(TEST_TIMEOUT) ./...) || exit 1; \
	done

.PHONY: test-short
test-short: ## Quick tests: go test -short ./... (no race detector).
	$(GO) test -short -timeout 10m ./...

.PHONY: lint
lint: ## gofmt (generated *.pb.go excepted), go vet, and the lint tests.
	@unformatted="$$(find . \( -path ./.git -o -path ./bin -o -path ./data -o -name testdata \) -prune \
		-o -name '*.go' -not -name '*.pb.go' -print0 | xargs -0 -r $(GOFMT) -l)"; \
	if [ -n "$$unformatted" ]; then \
		echo "lint: these files need gofmt -w:"; echo "$$unformatted"; exit 1; \
	fi
	$(GO) vet ./...
	$(GO) test -count=1 ./internal/lint/

.PHONY: image
image: ## Build the container image (shale:dev) FROM scratch (static binaries, non-root user; needs Docker, pulls nothing).
	scripts/build-image.sh $(IMAGE)

.PHONY: run
run: binaries ## Build the binaries and start a local 3-node cluster (data in ./data); Ctrl-C stops it.
	@SHALE_BIN_DIR=$(BIN) scripts/run-cluster.sh

.PHONY: bench
bench: ## Storage benchmark of Shale against its peers; prints a table.
ifeq ($(HAVE_BENCH),)
	@echo "bench: shale-bench ($(BENCH_MAIN), module bench/) does not exist yet."
	@exit 1
else
	@mkdir -p $(BIN) $(BENCH_DIR)
	cd bench && $(GO) build -trimpath -o $(BIN)/shale-bench ./cmd/shale-bench
	$(BIN)/shale-bench storage --engines $(BENCH_ENGINES) --dir $(BENCH_DIR) $(BENCH_ARGS)
endif

.PHONY: bench-cluster
bench-cluster: build ## Cluster benchmark: a 3-node Shale cluster against a 3-member etcd cluster (BENCH_ARGS="--quick" for a short run).
	@mkdir -p $(BIN) ./data/bench-cluster
	cd bench && $(GO) build -trimpath -o $(BIN)/shale-bench ./cmd/shale-bench
	$(BIN)/shale-bench cluster --shale-server $(BIN)/shale-server --dir ./data/bench-cluster $(BENCH_ARGS)

.PHONY: bench-idle
bench-idle: build ## CPU of 1,000 idle shards on a 3-node cluster, against a 1-shard baseline.
	@mkdir -p $(BIN) ./data/bench-idle
	cd bench && $(GO) build -trimpath -o $(BIN)/shale-bench ./cmd/shale-bench
	$(BIN)/shale-bench idle --shale-server $(BIN)/shale-server --dir ./data/bench-idle $(BENCH_ARGS)

.PHONY: fuzz
fuzz: ## Run every Fuzz* target (storage, replication, server, backup, proto, client) for FUZZTIME each (default 30s).
	@pkgs="$$($(GO) list $(FUZZ_PKGS))"; n=0; \
	for pkg in $$pkgs; do \
		listed="$$($(GO) test -run '^$$' -list '^Fuzz' "$$pkg")"; \
		targets="$$(grep -E '^Fuzz' <<<"$$listed" || true)"; \
		for target in $$targets; do \
			echo "fuzz: $$pkg $$target ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) "$$pkg"; \
			n=$$((n+1)); \
		done; \
	done; \
	echo "fuzz: ran $$n target(s) for $(FUZZTIME) each"

.PHONY: soak
soak: ## Long tests: -tags soak, SHALE_SOAK=1 (crash tests run more iterations).
	SHALE_SOAK=1 $(GO) test $(RACE) -tags soak -count=1 -timeout $(SOAK_TIMEOUT) $(SOAK_PKGS)

.PHONY: chaos
chaos: ## Fault suite on a 5-node containerised cluster for CHAOS_DURATION (30m); see chaos/README.md.
	cd chaos && $(GO) test -run 'TestChaos$$' -count=1 -v -timeout 0 . -chaos.duration=$(CHAOS_DURATION) -chaos.nemeses=all $(CHAOS_ARGS)

# Pinned code generators for proto/ (installed into .tools/ by `make proto`).
BUF_VERSION ?= v1.75.0
PROTOC_GEN_GO_VERSION ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.6.2
# protoc-gen-go-vtproto (github.com/planetscale/vtprotobuf, BSD-3-Clause)
# writes the reflection-free MarshalVT/UnmarshalVT/SizeVT methods
# (*_vtproto.pb.go) that proto/codec uses. Their runtime, the module's
# protohelpers package, is in go.mod at the version gRPC's own go.mod asks
# for (a commit after v0.6.0 whose protohelpers is v0.6.0's, unchanged). The
# generator stays at v0.6.0: that commit's generator writes a wrong size for
# a oneof case holding a nil message (TestNilMessageInOneof). The binary
# prints no version: the check reads the module version Go recorded in it.
PROTOC_GEN_GO_VTPROTO_VERSION ?= v0.6.0
TOOLS := $(CURDIR)/.tools

.PHONY: proto-tools
proto-tools: ## Install the pinned buf, protoc-gen-go, protoc-gen-go-grpc and protoc-gen-go-vtproto into .tools/.
	@mkdir -p $(TOOLS)
	@[ -x $(TOOLS)/buf ] && $(TOOLS)/buf --version | grep -qx '$(BUF_VERSION:v%=%)' || GOBIN=$(TOOLS) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	@[ -x $(TOOLS)/protoc-gen-go ] && $(TOOLS)/protoc-gen-go --version | grep -q '$(PROTOC_GEN_GO_VERSION)$$' || GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@[ -x $(TOOLS)/protoc-gen-go-grpc ] && $(TOOLS)/protoc-gen-go-grpc --version | grep -q '$(PROTOC_GEN_GO_GRPC_VERSION:v%=%)$$' || GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	@[ -x $(TOOLS)/protoc-gen-go-vtproto ] && $(GO) version -m $(TOOLS)/protoc-gen-go-vtproto | grep -qE '^\s+mod\s+github.com/planetscale/vtprotobuf\s+$(PROTOC_GEN_GO_VTPROTO_VERSION)\s' || GOBIN=$(TOOLS) $(GO) install github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto@$(PROTOC_GEN_GO_VTPROTO_VERSION)

.PHONY: python-deps
python-deps: ## Install (apt-get) what the Python code needs: python3-grpcio, python3-protobuf, pytest, protoc, venv, pip, setuptools, mypy.
	@scripts/python-deps.sh

.PHONY: proto
proto: proto-tools python-deps ## Regenerate the Go code of proto/ (package shale.v1) with the pinned generators, and the Python code under clients/python.
	cd proto && PATH=$(TOOLS):$$PATH buf lint && PATH=$(TOOLS):$$PATH buf generate
	scripts/gen-python.sh clients/python

.PHONY: proto-check
proto-check: proto-tools python-deps ## Fail if the committed generated code (Go and Python) differs from what `make proto` would write.
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	(cd proto && PATH=$(TOOLS):$$PATH buf generate -o $$tmp/go) && \
	scripts/gen-python.sh $$tmp/py && \
	for f in $$(cd $$tmp/go && find . -name '*.go'); do \
		cmp -s $$tmp/go/$$f proto/$$f || { echo "proto-check: proto/$$f is stale; run 'make proto' and commit" >&2; exit 1; }; \
	done && \
	for f in $$(cd proto && find . -name '*.pb.go'); do \
		[ -f $$tmp/go/$$f ] || { echo "proto-check: proto/$$f has no .proto source; delete it" >&2; exit 1; }; \
	done && \
	for f in $$(cd $$tmp/py && find . -type f); do \
		cmp -s $$tmp/py/$$f clients/python/$$f || { echo "proto-check: clients/python/$$f is stale; run 'make proto' and commit" >&2; exit 1; }; \
	done && \
	for f in $$(cd clients/python && find . -name '*_pb2*.py*'); do \
		[ -f $$tmp/py/$$f ] || { echo "proto-check: clients/python/$$f has no .proto source; delete it" >&2; exit 1; }; \
	done && echo "proto-check: generated code is current"

.PHONY: clean
clean: ## Remove ./bin, ./data and the test cache.
	rm -rf $(BIN) ./data
	$(GO) clean -testcache
