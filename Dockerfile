# kvindex images, on a slim Debian with libzmq, non-root, binaries built as
# `make build` builds them (-trimpath, stripped):
#
#   docker build -t kvindex .                             # production (default): kvindex, kvindexctl
#   docker build --target testbed -t kvindex-testbed .    # simulator and load tools: kvsim, kvbench, ...
#   docker run --rm -p 50051:50051 -p 9400:9400 kvindex serve --config /etc/kvindex/kvindex.yaml
#
# The compose file's engines and load run the testbed image; agents and
# replicas the production one. `make image-test` builds both from this file
# and runs the compose sim profile (scripts/image-test.sh).
#
# The Go version is go.mod's; deploy/dockerfile_test.go checks it, and that the
# build commands are the Makefile's, so the two cannot drift apart.

ARG GO_VERSION=1.26.8
ARG DEBIAN_RELEASE=bookworm

FROM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
# What scripts/deps.sh installs: libzmq for the ZeroMQ transport (cgo) and
# pkg-config; gcc and libc6-dev are in the golang image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libzmq3-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# make build, the shipped binaries:
RUN go build -trimpath -ldflags=-s -o bin/ ./cmd/...

FROM build AS build-testbed
# make build, the testbed's binaries:
RUN go build -trimpath -ldflags=-s -o bin/ ./testbed/cmd/...

# What both images run on: libzmq, CA roots, the kvindex user (65532).
FROM debian:${DEBIAN_RELEASE}-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends libzmq5 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 kvindex \
 && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/kvindex --create-home --shell /usr/sbin/nologin kvindex
USER 65532:65532
WORKDIR /var/lib/kvindex

# The testbed image: the simulated vLLM engines and the load of the compose
# sim profile (kvsim), the benchmarks and the soak, and kvindexctl, whose
# health command is the simulated engines' health check.
FROM runtime AS testbed
COPY --from=build-testbed /src/bin/kvsim /src/bin/kvbench /src/bin/kvfleetbench /src/bin/kvsoak /src/bin/kvindexctl /usr/local/bin/
# OpenAI API and /metrics, KV events (PUB), replay (ROUTER).
EXPOSE 8000 5557 5567
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["kvindexctl", "health", "--http", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["kvsim"]
CMD ["engine"]

# The production image (the default target): kvindex and kvindexctl only.
FROM runtime AS production
COPY --from=build /src/bin/kvindex /src/bin/kvindexctl /usr/local/bin/
# gRPC, Prometheus /metrics.
EXPOSE 50051 9400
# A real gRPC health check (grpc.health.v1, as kubelet's gRPC probe asks):
# exits non-zero unless the server reports SERVING.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["kvindexctl", "--addr", "127.0.0.1:50051", "--timeout", "3s", "health"]
ENTRYPOINT ["kvindex"]
CMD ["serve"]
