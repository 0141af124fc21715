#!/usr/bin/env bash
# Installs what kvindex needs to build and test on Debian/Ubuntu: libzmq
# (for the ZeroMQ subscriber, through cgo), pkg-config, a C compiler, and
# promtool (Debian's prometheus package) for the alert rules' tests.
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
