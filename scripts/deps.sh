#!/usr/bin/env bash
# Installs what kvindex needs to build and test on Debian/Ubuntu: libzmq
# (for the ZeroMQ subscriber, through cgo), pkg-config, a C compiler, and
# promtool (Debian's prometheus package) for the alert rules' tests, and
# for the Python client (clients/python): protoc 3.21 and gRPC's Python
# plugin for `make proto`, Debian's Python 3 with its grpcio and protobuf
# 3.21 (the runtime the generated code is written for; the tests run
# /usr/bin/python3, whatever python3 is first on PATH), and openssl for the
# client's TLS tests' certificates.
# Does nothing when they are present. Go itself (1.26.8 or newer, go.mod's
# go line) must be on PATH.
set -euo pipefail

if ! command -v go >/dev/null 2>&1; then
	echo "deps: Go 1.26.8 or newer is required (https://go.dev/doc/install); 'go' is not on PATH" >&2
	exit 1
fi

missing=()
pkg-config --exists libzmq 2>/dev/null || missing+=(libzmq3-dev pkg-config)
command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v grpc_python_plugin >/dev/null 2>&1 || missing+=(protobuf-compiler-grpc)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ -x /usr/bin/python3 ]; then
	/usr/bin/python3 -c 'import grpc' 2>/dev/null || missing+=(python3-grpcio)
	/usr/bin/python3 -c 'import google.protobuf' 2>/dev/null || missing+=(python3-protobuf)
else
	missing+=(python3 python3-grpcio python3-protobuf)
fi

if ((${#missing[@]})); then
	sudo=""
	if [ "$(id -u)" != 0 ]; then
		sudo="sudo"
	fi
	echo "deps: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq
	$sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
