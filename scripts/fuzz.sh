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
		# Go's fuzzing engine can end a run with "context deadline exceeded"
		# when the time box ends while it is minimizing a new input, with no
		# failing input found; such a run is repeated once. A real failure
		# writes its input under testdata/fuzz and is never repeated.
		for attempt in 1 2; do
			if out=$($GO test -run='^$' -fuzz="^${fn}\$" -fuzztime="$FUZZTIME" "$pkg" 2>&1); then
				echo "$out" | tail -3
				break
			fi
			echo "$out"
			if [[ $attempt == 1 && $out == *"context deadline exceeded"* && $out != *"Failing input written"* ]]; then
				echo "== $fn: the fuzzing engine timed out without a failing input; once more"
				continue
			fi
			exit 1
		done
		targets=$((targets + 1))
	done
done < <($GO list -f '{{if .TestGoFiles}}{{.ImportPath}}{{end}}' ./...)
echo "fuzzed $targets targets for $FUZZTIME each"
if [ "$targets" -eq 0 ]; then
	echo "no fuzz targets found" >&2
	exit 1
fi
