#!/usr/bin/env bash
# bench-large.sh runs make bench's rows (scripts/bench.sh) on a large
# machine, each process on cores of its own, so that the absolute figures
# printed beside the ratios measure kvindex and not a shared box: the
# headline numbers, where a machine with >= 16 cores is available. On a
# smaller machine it runs the same rows with the cores there are, and says
# how many it had: its ratios stand, its absolute figures are the box's.
#
# Layout with N cores (N >= 4): the process under test (the kvindex
# server, the fleet replica, the Go benchmarks) on the first half, the
# generator (kvbench's grpc-go client, the fleet's engines, agents and
# nats-server) on the second; each process's GOMAXPROCS is its cores.
# With fewer than 4 cores both halves are one core each, as make bench.
#
# Environment: as scripts/bench.sh (COUNT, RPS, DURATION, OUT, SKIP_*,
# LAG_AGENT_PROCS);
# CORES overrides how many cores to use (default: all, from nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

cores=${CORES:-$(nproc)}
if ((cores < 2)); then
	echo "bench-large.sh: $cores core; the server and the generator need one each" >&2
	exit 1
fi
if ((cores >= 4)); then
	half=$((cores / 2)) gprocs=$((cores - cores / 2))
	server="0-$((half - 1))" gen="$half-$((cores - 1))"
else
	half=1 gprocs=1 server=0 gen=1
fi
if ((cores >= 16)); then
	echo "bench-large.sh: $cores cores: server and Go benchmarks on CPUs $server, generator on CPUs $gen"
else
	echo "bench-large.sh: only $cores cores (a large run wants >= 16): server on CPUs $server, generator on CPUs $gen; the ratios hold, the absolute figures are this machine's"
fi
command -v taskset >/dev/null || echo "bench-large.sh: no taskset: processes are not pinned" >&2

# The generator's senders: one connection per generator core, as a router
# with that many cores would open; the rate scaled with the server's cores
# unless RPS is given.
export SERVER_CPU=$server GEN_CPU=$gen
export SERVER_FLAGS="--gomaxprocs $half --gogc 100"
export GEN_FLAGS="--gomaxprocs $gprocs --gogc 100 --connections $gprocs"
export RPS=${RPS:-$((10000 * half))}
export CONNS=${CONNS:-$((8 * gprocs))}
export FLEET_REPLICA_CPU=$server FLEET_GEN_CPU=$gen
# With cores to spare, the lag row's agents (and its floor's forwarders)
# run in processes of their own, one per two generator cores, as a fleet
# runs an agent beside each pod (docs/benchmarks.md, "Lag"): one process's
# heap of every agent's index otherwise sets the path's tail.
if ((gprocs >= 4)); then
	export LAG_AGENT_PROCS=${LAG_AGENT_PROCS:-$((gprocs / 2))}
fi
# The Go benchmarks run pinned to the server's half; Go sizes their
# GOMAXPROCS to it (the one-core rows set their own).
export GO_BENCH_PIN=$server
exec scripts/bench.sh
