#!/usr/bin/env bash
# Runs every Fuzz target in the module for FUZZTIME each (default 60s):
# the msgpack event decoder, the gRPC codec's hand-written paths, the
# config loader, and whatever fuzz targets are added later. CI runs it
# with a short FUZZTIME; `make fuzz` with the default.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-60s}
GO=${GO:-go}
targets=0
while read -r pkg; do
	for fn in $($GO test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		echo "== $pkg $fn ($FUZZTIME)"
		$GO test -run='^$' -fuzz="^${fn}\$" -fuzztime="$FUZZTIME" "$pkg"
		targets=$((targets + 1))
	done
done < <($GO list -f '{{if .TestGoFiles}}{{.ImportPath}}{{end}}' ./...)
echo "fuzzed $targets targets for $FUZZTIME each"
if [ "$targets" -eq 0 ]; then
	echo "no fuzz targets found" >&2
	exit 1
fi
