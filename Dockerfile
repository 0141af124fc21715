# kvindex image: every binary under cmd/ and testbed/cmd/ (kvindex, kvindexctl, kvsim,
# kvbench, ...), built as `make build` builds them, on a slim Debian with libzmq.
#
#   docker build -t kvindex .
#   docker run --rm -p 50051:50051 -p 9400:9400 kvindex serve --config /etc/kvindex/kvindex.yaml
#
# The Go version is go.mod's; deploy/dockerfile_test.go checks it, and that the
# build command is the Makefile's, so the two cannot drift apart.

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
# make build:
RUN go build -o bin/ ./cmd/... ./testbed/cmd/...

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libzmq5 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 kvindex \
 && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/kvindex --create-home --shell /usr/sbin/nologin kvindex
COPY --from=build /src/bin/ /usr/local/bin/
USER 65532:65532
WORKDIR /var/lib/kvindex
# gRPC, Prometheus /metrics; simulated engines (kvsim engine) use 8000, 5557, 5567.
EXPOSE 50051 9400
# A real gRPC health check (grpc.health.v1, as kubelet's gRPC probe asks):
# exits non-zero unless the server reports SERVING.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["kvindexctl", "--addr", "127.0.0.1:50051", "--timeout", "3s", "health"]
ENTRYPOINT ["kvindex"]
CMD ["serve"]
