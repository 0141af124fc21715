#!/usr/bin/env bash
# Installs, from Debian/Ubuntu packages, what a make target needs, and only
# that; does nothing when it is present. Go itself (1.26.8 or newer, go.mod's
# go line) must be on PATH.
#
#   scripts/deps.sh build   libzmq (the ZeroMQ subscriber, through cgo),
#                           pkg-config and a C compiler: what `make build`
#                           and `make demo` need
#   scripts/deps.sh test    the above, and promtool (Debian's prometheus
#                           package) for the alert rules' tests; for the
#                           Python client (clients/python): protoc 3.21 and
#                           gRPC's Python plugin for `make proto`, Debian's
#                           Python 3 with its grpcio and protobuf 3.21 (the
#                           runtime the generated code is written for),
#                           venv, pip and setuptools to pip-install the client
#                           offline, and openssl for its TLS tests' certificates
set -euo pipefail

what="${1:-build}"
if ! command -v go >/dev/null 2>&1; then
	echo "deps: Go 1.26.8 or newer is required (https://go.dev/doc/install); 'go' is not on PATH" >&2
	exit 1
fi

missing=()
pkg-config --exists libzmq 2>/dev/null || missing+=(libzmq3-dev pkg-config)
command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
case "$what" in
build) ;;
test)
	command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
	command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
	command -v grpc_python_plugin >/dev/null 2>&1 || missing+=(protobuf-compiler-grpc)
	command -v openssl >/dev/null 2>&1 || missing+=(openssl)
	if [ -x /usr/bin/python3 ]; then
		/usr/bin/python3 -c 'import grpc' 2>/dev/null || missing+=(python3-grpcio)
		/usr/bin/python3 -c 'import google.protobuf' 2>/dev/null || missing+=(python3-protobuf)
		/usr/bin/python3 -c 'import setuptools' 2>/dev/null || missing+=(python3-setuptools)
		/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
		/usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
	else
		missing+=(python3 python3-grpcio python3-protobuf python3-setuptools python3-venv python3-pip)
	fi
	;;
*)
	echo "deps: unknown set $what (build or test)" >&2
	exit 2
	;;
esac

if ((${#missing[@]})); then
	sudo=""
	if [ "$(id -u)" != 0 ]; then
		sudo="sudo"
	fi
	echo "deps: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq
	# No recommended packages: prometheus alone would bring a node exporter
	# and its service.
	$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
