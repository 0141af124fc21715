# kvindex developer tasks. Tools (buf, protoc-gen-go, protoc-gen-go-grpc)
# are pinned in tools/go.mod and run with `go tool`; libzmq comes from the
# system (scripts/deps.sh installs it on Debian/Ubuntu when missing).

GO   ?= go
TOOL := $(GO) tool -modfile=tools/go.mod

.PHONY: deps build test test-python demo demo-fleet bench fuzz proto lint soak chaos architecture

# deps installs libzmq and a C toolchain when missing (Debian/Ubuntu).
deps:
	@scripts/deps.sh

# build compiles every binary under cmd/ into ./bin. The Dockerfile runs
# the same command (deploy/dockerfile_test.go keeps them equal).
build: deps
	$(GO) build -o bin/ ./cmd/... ./testbed/cmd/...

# test runs lint, then every test (fuzz seed corpora included) with the
# race detector, those of the deploy/ module (compose file, Helm chart,
# alert rules, dashboard, Dockerfile) and of the clients/gie module (the
# GIE scheduler's scorer plugin), then the Python client's (test-python). A -race build compiles the indexer's invariant checks in
# (as the build tag invariants does), so the race run checks them too. The
# tests that pin hot paths' allocation counts skip under -race (it makes
# sync.Pool drop items), so they run once more without it.
test: deps lint
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run 'Alloc|FastPath' ./api ./events ./scoring
	cd deploy && $(GO) test -race -count=1 ./...
	cd clients/gie && $(GO) test -race -count=1 ./...
	$(MAKE) --no-print-directory test-python

# test-python runs the Python client's tests (clients/python/tests, stdlib
# unittest) with Debian's interpreter, which has Debian's grpcio and
# protobuf, against a kvindex daemon and simulated engines it builds and
# starts. It ends with unittest's "OK" or "FAILED (...)" and its status.
test-python: deps
	PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=clients/python GO=$(GO) \
		/usr/bin/python3 -m unittest discover -s clients/python/tests -v

# lint checks formatting, go vet, staticcheck, that go.mod is tidy (the
# service's, deploy/'s, the test-only module of the deployment files, and
# clients/gie's, the GIE scorer plugin with the framework's dependencies), and
# that everything a router may embed builds without cgo (only the ZeroMQ
# transport, events/zmq, needs libzmq), and archlint: the layers import
# only downward (docs/architecture.md), the binaries link no testbed, and
# files and functions stay within their budgets.
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(TOOL) staticcheck ./...
	$(GO) mod tidy -diff
	cd deploy && $(GO) vet ./... && $(GO) tool -modfile=../tools/go.mod staticcheck ./... && $(GO) mod tidy -diff
	cd clients/gie && $(GO) vet ./... && $(GO) tool -modfile=../../tools/go.mod staticcheck ./... && $(GO) mod tidy -diff
	CGO_ENABLED=0 $(GO) build ./events ./api/... ./indexer/... ./scoring/... ./cmd/kvindexctl
	$(GO) -C tools test -count=1 ./archlint
	$(GO) -C tools run ./archlint ..

# demo is a short live kvsim run (about 10 s): the real daemon, simulated
# vLLM engines publishing KV events over ZMQ, every router side by side
# (precise ones over gRPC), the table printed.
demo: deps
	$(GO) run ./testbed/cmd/kvsim demo

# demo-fleet is the same run in fleet mode: an embedded NATS server, a
# kvindex agent beside each simulated engine, two kvindex replicas the
# routers ask in turn; the same table, and both replicas checked equal to
# the engines' caches (docs/fleet.md).
demo-fleet: deps
	$(GO) run ./testbed/cmd/kvsim demo --fleet

# bench runs the benchmarks behind the performance targets and the gRPC
# load generator, and prints target vs measured (COUNT, BENCHTIME, RPS,
# DURATION override; raw output in bench-out/). See docs/benchmarks.md.
bench: deps
	scripts/bench.sh

# fuzz runs every fuzz target in the module for FUZZTIME each (default
# 60s): the msgpack event decoder, the gRPC codec and the config loader.
FUZZTIME ?= 60s
fuzz: deps
	FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

# soak runs the daemon binary for SOAK_DURATION (default 2m, loopback
# only) under engine and daemon restarts, hostile input and gRPC load, and
# fails naming any wrong answer, unexpected error, counter moved by
# garbage, or growth of its RSS or goroutines (docs/reliability.md).
# SOAK_FLAGS adds kvsoak flags, e.g. SOAK_FLAGS="--seed 7 --keep".
SOAK_DURATION ?= 2m
soak: deps
	$(GO) run ./testbed/cmd/kvsoak --duration $(SOAK_DURATION) --go $(GO) $(SOAK_FLAGS)

# chaos runs the fleet (simulated engines, kvindex agents with checkpoints,
# nats-server with JetStream, CHAOS_REPLICAS replicas) as processes behind
# fault-injecting links under SEEDS seeded fault schedules of
# CHAOS_DURATION each, from seed CHAOS_SEED, checking every answer against
# the engines' caches; it fails naming each failing seed's first broken
# invariant, its schedule and the command that replays it
# (docs/reliability.md, "Chaos"). CI runs seeds 1 to 3 for 30s each.
SEEDS ?= 3
CHAOS_SEED ?= 1
CHAOS_DURATION ?= 40s
CHAOS_REPLICAS ?= 2
chaos: deps
	$(GO) run ./testbed/cmd/kvsoak chaos --seeds $(SEEDS) --seed $(CHAOS_SEED) --duration $(CHAOS_DURATION) --replicas $(CHAOS_REPLICAS) --go $(GO) $(CHAOS_FLAGS)

# proto lints the contract and regenerates the committed code from it:
# proto/kvindex/v1/*.pb.go and the Python client's clients/python/kvindex/v1
# (protoc 3.21 and grpc_python_plugin from Debian, which deps installs:
# another protoc release writes other Python, which CI's diff would refuse).
proto: deps
	@protoc --version | grep -q '^libprotoc 3\.21\.' || \
		{ echo "proto: needs protoc 3.21 (Debian bookworm's protobuf-compiler), found: $$(protoc --version)" >&2; exit 1; }
	$(TOOL) buf lint
	$(TOOL) buf generate

# architecture redraws docs/architecture.svg from docs/architecture.dot
# (Graphviz: apt-get install graphviz); commit both.
architecture:
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg
