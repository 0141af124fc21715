#!/usr/bin/env bash
# Fails when a package that more than one of the repository's Go modules
# compiles (the service's, deploy/'s, clients/gie's) comes from different
# versions of its module in them: the build cache then compiles it, and
# everything above it, once per module. Aligned (the highest version in all),
# make test compiles the Kubernetes and gRPC stacks once for the three
# (docs/benchmarks.md, "A newcomer's first commands").
set -euo pipefail
cd "$(dirname "$0")/.."
GO="${GO:-go}"
for m in . deploy clients/gie; do
	(cd "$m" && "$GO" list -deps -test -f '{{if not .Standard}}{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}{{end}}' ./... | sort -u | sed "s|^|$m |")
done | awk '
	{ if (($2 in v) && v[$2] != $3) bad[$2] = bad[$2] " " $1 "@" $3; else if (!($2 in v)) { v[$2] = $3; first[$2] = $1 "@" $3 } }
	END { n = 0; for (m in bad) { print "modalign: " m " differs across modules: " first[m] bad[m]; n++ }
	      if (n) { print "modalign: go get the highest version in every module that compiles it"; exit 1 } }'
