# kvindex developer tasks. Tools (buf, protoc-gen-go, protoc-gen-go-grpc)
# are pinned in tools/go.mod and run with `go tool`; libzmq comes from the
# system. scripts/deps.sh installs, on Debian/Ubuntu and only when missing,
# what a target needs: `deps` what building and the demo need (libzmq,
# pkg-config, a C compiler), `deps-test` that and what the tests need.

GO   ?= go
TOOL := $(GO) tool -modfile=tools/go.mod

.PHONY: deps deps-test build test test-go test-modules test-deploy test-gie test-python vet lint-go lint-deploy lint-gie demo demo-fleet bench fuzz proto lint soak chaos architecture image-test

# deps installs libzmq, pkg-config and a C compiler when missing.
deps:
	@scripts/deps.sh build

# deps-test installs deps' packages and the tests' and make proto's:
# promtool (Debian's prometheus), protoc 3.21 and gRPC's Python plugin,
# Debian's Python 3 with grpcio, protobuf, setuptools, venv and pip, openssl.
deps-test:
	@scripts/deps.sh test

# build compiles every binary under cmd/ and testbed/cmd/ into ./bin as
# they ship: paths trimmed, symbol table and DWARF stripped (-s). The
# Dockerfile runs the same two commands (deploy/dockerfile_test.go keeps
# them equal): the first for the production image, the second for the
# testbed image.
build: deps
	$(GO) build -trimpath -ldflags=-s -o bin/ ./cmd/...
	$(GO) build -trimpath -ldflags=-s -o bin/ ./testbed/cmd/...

# test runs lint, then every test (fuzz seed corpora included) with the
# race detector: the service's, those of the deploy/ module (compose file,
# Helm chart, alert rules, dashboard, Dockerfile) and of the clients/gie
# module (the GIE scheduler's scorer plugin), and the Python client's
# (test-python, against a race-built daemon). A -race build compiles the
# indexer's invariant checks in (as the build tag invariants does), so the
# race run checks them too. Lint compiles with -race as well (RACE): go vet
# and staticcheck type-check against the packages the race run links, so
# that each package of the three modules is compiled once, not once per
# mode. The tests that pin hot paths' allocation counts skip under -race
# (it makes sync.Pool drop items), so they run once more without it: the
# only packages compiled twice. The packages make demo's DEMO_TAGS change
# run their tagged tests.
#
# After the service's go vet (which compiles the standard library and the
# dependencies the modules share), the service's lint and tests run beside
# those of deploy/, clients/gie and the Python client (test-modules): the
# service's tests leave a core idle much of the time, which the modules'
# compiles fill. Each job's output is printed whole when it ends
# (docs/benchmarks.md, "A newcomer's first commands").
test: deps-test vet
	$(MAKE) --no-print-directory -j2 --output-sync=target test-go test-modules

# test-go runs the service's lint (but vet) and tests.
test-go: lint-go
	$(RACEENV) $(GO) test -count=1 ./...
	$(GO) test -count=1 -run 'Alloc|FastPath' ./api ./events ./scoring
	$(RACEENV) $(GO) test -count=1 -tags $(DEMO_TAGS) -run 'NoKubernetes|NoEmbedNATS' ./config ./discovery ./testbed/embednats

# test-modules runs the lint and tests of deploy/, then of clients/gie,
# one after the other as they share most of their dependencies, then the
# Python client's tests.
test-modules:
	$(MAKE) --no-print-directory test-deploy
	$(MAKE) --no-print-directory test-gie
	$(RACEENV) $(MAKE) --no-print-directory test-python

test-deploy: lint-deploy
	cd deploy && $(RACEENV) $(GO) test -count=1 ./...

test-gie: lint-gie
	cd clients/gie && $(RACEENV) $(GO) test -count=1 ./...

# RACE is the flag every compile of make test and make lint adds (RACE=
# for none). RACEENV passes it in GOFLAGS, so that it reaches the go
# commands the tests run themselves (integration builds kvindex and
# kvindexctl, the Python client's tests the daemon and kvsim): those
# binaries link the packages the race run compiled. go tool ignores -race
# in GOFLAGS, so staticcheck itself is built without it.
RACE ?= -race
RACEENV = GOFLAGS="$$GOFLAGS $(RACE)"

# test-python installs the Python client as a user would, pip install
# ./clients/python (offline: no index, no build isolation, over Debian's
# setuptools), into a throwaway virtual environment that sees Debian's
# grpcio and protobuf, and runs its tests (clients/python/tests, stdlib
# unittest) with that interpreter against a kvindex daemon and simulated
# engines they build and start (with GOFLAGS: make test's -race). It ends
# with unittest's "OK" or "FAILED (...)" and its status.
test-python: deps-test
	@venv=$$(mktemp -d) && trap 'rm -rf "$$venv" clients/python/build clients/python/kvindex.egg-info' EXIT && \
	/usr/bin/python3 -m venv --system-site-packages "$$venv" && \
	"$$venv/bin/pip" install -q --no-index --no-build-isolation ./clients/python && \
	"$$venv/bin/python" -c 'import kvindex, sys; sys.exit(0 if "site-packages" in kvindex.__file__ else "kvindex not installed: " + kvindex.__file__)' && \
	PYTHONDONTWRITEBYTECODE=1 GO=$(GO) "$$venv/bin/python" -m unittest discover -s clients/python/tests -v

# lint checks formatting, go vet, staticcheck, that go.mod is tidy (the
# service's, deploy/'s, the test-only module of the deployment files, and
# clients/gie's, the GIE scorer plugin with the framework's dependencies), and
# that nothing a router may embed links a package that needs cgo (only the
# ZeroMQ transport, events/zmq, needs libzmq: read from go list, as a
# CGO_ENABLED=0 build would recompile every dependency), and archlint: the
# layers import only downward (docs/architecture.md), the binaries link no
# testbed, and files and functions stay within their budgets. go vet and
# staticcheck (through its go list) compile with RACE, as make test's race
# run does. It compiles what make demo's tags (DEMO_TAGS) change, and
# fails if its build still links what they are to leave out, and that the
# three modules compile every package they share from one version
# (scripts/modalign.sh), so that it is compiled once. vet (gofmt
# and the service's go vet), lint-go (the service's other checks),
# lint-deploy and lint-gie are its parts.
lint: vet lint-go lint-deploy lint-gie

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(RACEENV) $(GO) vet ./...

lint-go:
	$(RACEENV) $(TOOL) staticcheck ./...
	$(GO) mod tidy -diff
	@cgo=$$($(GO) list -deps -f '{{if and .CgoFiles (not .Standard)}}{{.ImportPath}}{{end}}' ./events ./api/... ./indexer/... ./scoring/... ./cmd/kvindexctl); \
	if [ -n "$$cgo" ]; then echo "what a router embeds needs cgo through:"; echo "$$cgo"; exit 1; fi
	$(RACEENV) $(GO) build -tags $(DEMO_TAGS) ./daemon ./testbed/sim
	@left=$$($(GO) list -tags $(DEMO_TAGS) -deps ./testbed/cmd/kvsim | grep -E '^(k8s\.io|github\.com/nats-io/nats-server)/' | head -3); \
	if [ -n "$$left" ]; then echo "make demo's build (-tags $(DEMO_TAGS)) still links:"; echo "$$left"; exit 1; fi
	GO=$(GO) scripts/modalign.sh
	$(GO) -C tools test -count=1 ./archlint
	$(GO) -C tools run ./archlint ..

lint-deploy:
	cd deploy && $(RACEENV) $(GO) vet ./... && $(RACEENV) $(GO) tool -modfile=../tools/go.mod staticcheck ./... && $(GO) mod tidy -diff

lint-gie:
	cd clients/gie && $(RACEENV) $(GO) vet ./... && $(RACEENV) $(GO) tool -modfile=../../tools/go.mod staticcheck ./... && $(GO) mod tidy -diff

# demo is a short live kvsim run (about 10 s): the real daemon, simulated
# vLLM engines publishing KV events over ZMQ, every router side by side
# (precise ones over gRPC), the table printed. It installs only deps'
# packages, and builds with DEMO_TAGS: without Kubernetes discovery and the
# embedded nats-server, which it does not use (a third of a cold build's
# compile time; docs/benchmarks.md, "A newcomer's first commands"). lint
# compiles the daemon and the simulator with them and checks what kvsim
# still links.
DEMO_TAGS := nokubernetes,noembednats
demo: deps
	$(GO) run -tags $(DEMO_TAGS) ./testbed/cmd/kvsim demo

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
# (protoc 3.21 and grpc_python_plugin from Debian, which deps-test installs:
# another protoc release writes other Python, which CI's diff would refuse).
proto: deps-test
	@protoc --version | grep -q '^libprotoc 3\.21\.' || \
		{ echo "proto: needs protoc 3.21 (Debian bookworm's protobuf-compiler), found: $$(protoc --version)" >&2; exit 1; }
	$(TOOL) buf lint
	$(TOOL) buf generate

# architecture redraws docs/architecture.svg from docs/architecture.dot
# (Graphviz: apt-get install graphviz); commit both.
architecture:
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg

# image-test builds the Dockerfile (the production and testbed images),
# runs the compose file's sim profile, and checks every service healthy,
# the load routed by kvindex and both replicas equal to the engines' caches
# (scripts/image-test.sh: Docker where an engine runs, else podman and
# buildah with stand-in bases where no registry answers).
image-test: deps
	scripts/image-test.sh
