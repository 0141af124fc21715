#!/usr/bin/env bash
# bench.sh runs the benchmarks behind kvindex's performance targets (issue
# 4) with Go's benchmark harness, then the kvbench gRPC load generator, and
# prints a table of target vs measured. `make bench` calls it.
#
# Raw, benchstat-friendly output is kept in $OUT/latest.txt (and a
# timestamped copy); kvbench's JSON reports in $OUT/kvbench-*.json. Compare two
# runs with: go run golang.org/x/perf/cmd/benchstat@latest old.txt new.txt
#
# Environment overrides:
#   COUNT      runs of each benchmark (default 6: benchstat wants >= 6 for confidence intervals)
#   BENCHTIME  -benchtime per run (default 1s)
#   RPS        kvbench rate (default 10000), DURATION (default 10s),
#   CONNS      kvbench senders, one connection each (default 8)
#   GRPC_RUNS  generator runs against each of the kvindex server and its floor
#              (the canned server), alternated (the gRPC rows: medians; default 5)
#   SERVER_FLAGS, GEN_FLAGS  kvbench flags of the server and generator processes
#              (defaults below; why in docs/benchmarks.md, "gRPC Score at 10 k req/s")
#   SERVER_CPU, GEN_CPU  the CPU the servers and the generator are pinned to
#              (default 0 and 1; set both empty to let the kernel place them)
#   OUT        output directory (default bench-out)
#   SKIP_GRPC  set to 1 to skip the load generator
#   SKIP_GO    set to 1 to skip the Go benchmarks (only the generator rows)
#   SKIP_FLEET set to 1 to skip the fleet rows (kvfleetbench: ingest, sync,
#              lag, wire bytes, agent cost); FLEET_SYNC_WORKERS agents in the
#              sync row (default 1000 x 30,000 blocks; snapshots cached in
#              $OUT/fleet-cache between runs); FLEET_REPLICA_CPU and
#              FLEET_GEN_CPU the CPUs of the replica (or the lag floor's
#              subscriber) and of the generator (default: unpinned);
#              LAG_ROUNDS runs of the lag path and its floor each,
#              alternated (default 1); LAG_AGENT_PROCS the processes the
#              lag row's agents (and its floor's forwarders) run in beside
#              the generator's, on its CPUs (default 0: in the generator's
#              own; on 2 cores more processes cost the generator the rate,
#              docs/benchmarks.md "What the misses show")
#   SKIP_OVERLOAD set to 1 to skip the overload rows (admission control at 3x
#              the server's capacity)
#   OVERLOAD_SHAPE shape flags of the overload rows' servers and generator
#              (default below), OVERLOAD_PROBE_RPS the offered rates
#              whose highest accepted rate is kvindex's capacity (default
#              "2000 4000 6000 8000"), OVERLOAD_CLIENT the
#              generator's client, kvbench --client (default below)
#   TABLE_ONLY set to 1 to run nothing and print the table of the reports
#              already in $OUT
#   CPUPROFILE set to 1 to also write a CPU profile per package into $OUT
#   GO_BENCH_PIN  CPUs (taskset's list) the Go benchmarks run on (default:
#              unpinned); scripts/bench-large.sh sets it
#
# A benchmark that does not exist yet is reported as "not run", not as a
# failure. A package that fails to build is reported and the rest still run.
set -uo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
COUNT=${COUNT:-6}
BENCHTIME=${BENCHTIME:-1s}
RPS=${RPS:-10000}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-8}
GRPC_RUNS=${GRPC_RUNS:-5}
LAG_ROUNDS=${LAG_ROUNDS:-1}
LAG_AGENT_PROCS=${LAG_AGENT_PROCS:-0}
# The split rows' processes: each on a CPU of its own with GOMAXPROCS 1, as
# a router and kvindex are on machines of their own; collections kept
# short (a small GOGC), because at GOMAXPROCS 1 Go's background sweeper
# keeps the network unpolled until it has swept what the last cycle left;
# the generator's senders share one connection, as a router's one
# api.Client does.
SERVER_FLAGS=${SERVER_FLAGS---gomaxprocs 1 --gogc 25}
GEN_FLAGS=${GEN_FLAGS---gomaxprocs 1 --gogc 50 --connections 1}
SERVER_CPU=${SERVER_CPU-0}
GEN_CPU=${GEN_CPU-1}
# The overload rows' prompts are long (32,768 tokens), so that the server
# saturates at a low rate; their generator is grpc-go sending each distinct
# request pre-encoded, at less than half of grpc-go's client CPU per call
# when it marshals each one. Even so one generator core offers about twice
# kvindex's capacity, not three times (docs/benchmarks.md, "What the
# misses show"): a run that falls behind its rate is marked broken.
OVERLOAD_SHAPE=${OVERLOAD_SHAPE:---prompt-blocks 2048 --shared-blocks 512}
OVERLOAD_PROBE_RPS=${OVERLOAD_PROBE_RPS:-2000 4000 6000 8000}
OVERLOAD_CLIENT=${OVERLOAD_CLIENT:-grpc-preencoded}
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
raw="$OUT/latest.txt"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
hz=$(getconf CLK_TCK)
# TABLE_ONLY=1 runs nothing and prints the table of what $OUT holds.
if [[ ${TABLE_ONLY:-0} == 1 ]]; then
	SKIP_GO=1 SKIP_GRPC=1 SKIP_FLEET=1
fi

# The benchmarks behind the targets. BenchmarkMemory10M builds a 10 M
# residency index and BenchmarkMemoryHybrid 1 M with up to 5 M side-group
# blocks: they run once, apart from the timed ones.
timed='^(BenchmarkDecode|BenchmarkDecodeApply|BenchmarkApply|BenchmarkApplyFloor|BenchmarkApplyHybrid|BenchmarkPromptKeys32K|BenchmarkPromptKeysFloor|BenchmarkScore128x8|BenchmarkScoreFloor|BenchmarkScoreHybrid|BenchmarkScore4096x1000|BenchmarkNaiveScore4096x1000|BenchmarkScoreUnderIngest|BenchmarkScoreLoaded|BenchmarkScoreJSON)$'
memory='^(BenchmarkMemory10M|BenchmarkMemoryHybrid)$'
pkgs=(./indexer ./events ./testbed/benchsuite ./api ./scoring)

# jget <file> <key>: a number from a kvbench JSON report.
jget() { sed -n "s/.*\"$2\": *\([0-9.]*\).*/\1/p" "$1" | head -1; }

status=0
run() { # run <label> <go test args...>: append to $raw, note failures
	local label=$1
	shift
	echo "== $label: $GO test $*" >&2
	local pre=()
	[[ -n ${GO_BENCH_PIN:-} ]] && command -v taskset >/dev/null && pre=(taskset -c "$GO_BENCH_PIN")
	if ! "${pre[@]}" "$GO" test "$@" | tee -a "$raw"; then
		echo "bench.sh: $label: go test failed (see $raw); continuing" >&2
		status=1
	fi
}

if [[ ${TABLE_ONLY:-0} == 1 ]]; then touch "$raw"; else : >"$raw"; fi
[[ ${TABLE_ONLY:-0} == 1 ]] || {
	echo "# kvindex make bench, $stamp"
	echo "# $($GO version)"
	echo "# COUNT=$COUNT BENCHTIME=$BENCHTIME"
	echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
} >>"$raw"

prof=()
[[ ${SKIP_GO:-0} == 1 ]] && pkgs=()
for p in "${pkgs[@]}"; do
	if [[ ${CPUPROFILE:-0} == 1 ]]; then
		name=$(basename "$p")
		prof=(-cpuprofile "$OUT/cpu-$name.prof" -o "$OUT/$name.test")
	fi
	run "$p" -run='^$' -bench="$timed" -benchmem -count="$COUNT" -benchtime="$BENCHTIME" -timeout=30m "${prof[@]}" "$p"
done
[[ ${SKIP_GO:-0} == 1 ]] || run "memory" -run='^$' -bench="$memory" -benchmem -count=1 -benchtime=1x -timeout=30m ./indexer
# The endpoint picker's decision for a 4 K-token chat (docs/benchmarks.md,
# "Endpoint picker"): p50/p99 need a fixed number of decisions.
[[ ${SKIP_GO:-0} == 1 ]] || run "picker" -run='^$' -bench='^(BenchmarkPickChat4K|BenchmarkTokenizeChat4K)$' -benchmem -count="$COUNT" -benchtime=5000x -timeout=30m ./picker
if [[ ${TABLE_ONLY:-0} != 1 ]]; then
	echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >>"$raw"
	cp "$raw" "$OUT/bench-$stamp.txt"
fi

# The gRPC rows (docs/benchmarks.md, "Current: every row against its
# floor"). Each is kvindex beside its floor from the same run, measured by
# the same generator at the same rate with the same pinning.
#
# Score at $RPS req/s: two servers, each in a process of its own pinned to
# SERVER_CPU: `kvbench --embedded --serve` (kvindex: the loaded index
# behind api.Server) and `kvbench --embedded --serve --canned` (the floor:
# a grpc-go server with kvindex's transport settings that answers every
# Score with the shape's real answer, encoded once, and does no other
# work). GRPC_RUNS generator processes each, pinned to GEN_CPU and
# alternated kvindex, floor, kvindex, ..., send Scores through kvindex's
# Go client (`kvbench --addr --check --client grpc`, grpc-go), checking
# every reply. The rows: the median p99 of each server's runs, and its
# median CPU per call (the server process's /proc ticks over the run,
# over the calls sent, warm-up included).
#
# Overload: admission control at 3x what kvindex sustains. A kvindex
# server with the daemon's default admission settings and a floor server
# serve OVERLOAD_SHAPE; probes at each of OVERLOAD_PROBE_RPS find
# kvindex's capacity, the highest rate of accepted calls (one probe at a
# high rate measures goodput under heavier overload, which is lower, not
# capacity; refusals cost the generator little); a run offers kvindex 3x
# that, and one offers the floor 1x that. Accepted calls and refusals
# (ResourceExhausted) are timed apart; the generator's pacing lag says
# whether it kept the rate (a run that fell behind is marked broken).
#
# Latency on a shared machine means little without knowing what else ran:
# each run notes the cores the server, the generator and every other
# process used, and the generator's own pacing lag.
[[ ${TABLE_ONLY:-0} == 1 ]] || rm -f "$OUT"/kvbench*.json "$OUT"/kvbench*.ticks "$OUT/kvbench.cpu" "$OUT"/kvbench*-server.log
if [[ ${SKIP_GRPC:-0} != 1 ]]; then
	busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat 2>/dev/null || echo 0; }
	ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
	load=(--rps "$RPS" --duration "$DURATION" --concurrency "$CONNS" --json)
	# kvrun <name> <server pid or 0> [taskset -c N] <kvbench args...>: one
	# generator run into $OUT/<name>.json, the server's CPU ticks over it
	# into $OUT/<name>.ticks, its CPU and everyone else's into kvbench.cpu.
	kvrun() {
		local name=$1 spid=$2 b1 b2 s1 s2 u s r pre=()
		shift 2
		if [[ $1 == taskset ]]; then
			pre=("$1" "$2" "$3")
			shift 3
		fi
		echo "== $name: ${pre[*]} kvbench $*" >&2
		b1=$(busy) s1=0 s2=0
		((spid)) && s1=$(ticks "$spid")
		TIMEFORMAT='%U %S %R'
		if { time "${pre[@]}" "$OUT/kvbench" "$@" >"$OUT/$name.json.tmp"; } 2>"$OUT/kvbench.time"; then
			b2=$(busy)
			((spid)) && s2=$(ticks "$spid")
			mv "$OUT/$name.json.tmp" "$OUT/$name.json"
			echo $((s2 - s1)) >"$OUT/$name.ticks"
			read -r u s r <"$OUT/kvbench.time"
			awk -v b=$((b2 - b1)) -v sv=$((s2 - s1)) -v hz="$hz" -v u="$u" -v s="$s" -v r="$r" -v name="$name" \
				-v lag="$(jget "$OUT/$name.json" lag_p99_ns)" -v p99="$(jget "$OUT/$name.json" p99_ns)" 'BEGIN {
				o = (b / hz - u - s - sv / hz) / r
				printf "%s: p99 %.0f us, generator lag p99 %.0f us; server %.2f cores, generator %.2f cores, other processes %.2f cores\n", name, p99 / 1e3, lag / 1e3, sv / hz / r, (u + s) / r, (o < 0 ? 0 : o)
			}' >>"$OUT/kvbench.cpu"
		else
			echo "bench.sh: kvbench $name failed" >&2
			rm -f "$OUT/$name.json.tmp"
			status=1
		fi
	}
	# pin <cpu>: the command prefix that runs a process on that CPU, none
	# when no CPU is given or taskset is missing.
	pin() {
		if [[ -n $1 ]] && command -v taskset >/dev/null; then
			echo "taskset -c $1"
		elif [[ -n $1 ]]; then
			echo "bench.sh: no taskset; the gRPC rows' processes are not pinned" >&2
		fi
	}
	# serve <log> <kvbench server flags...>: start a server on SERVER_CPU,
	# its pid in spid and address in addr (empty if it did not start).
	serve() {
		local log=$1
		shift
		echo "== server: $spin kvbench --embedded --serve --listen 127.0.0.1:0 $*" >&2
		# shellcheck disable=SC2086 # the prefix is words
		$spin "$OUT/kvbench" --embedded --serve --listen 127.0.0.1:0 "$@" >"$log" 2>&1 &
		spid=$! addr=
		for _ in $(seq 600); do # loading the index takes a few seconds
			addr=$(sed -n 's/^serving .* on \([^ ]*\) (.*/\1/p' "$log")
			[[ -n $addr ]] && break
			kill -0 "$spid" 2>/dev/null || break
			sleep 0.1
		done
		if [[ -z $addr ]]; then
			echo "bench.sh: a kvbench server did not start (see $log)" >&2
			status=1
		fi
	}
	stop() { kill "$@" 2>/dev/null; wait "$@" 2>/dev/null; }
	spin=$(pin "$SERVER_CPU") gpin=$(pin "$GEN_CPU")
	if "$GO" build -o "$OUT/kvbench" ./testbed/cmd/kvbench; then
		# shellcheck disable=SC2086 # flags are words
		serve "$OUT/kvbench-server.log" $SERVER_FLAGS
		kpid=$spid kaddr=$addr
		# shellcheck disable=SC2086
		serve "$OUT/kvbench-floor-server.log" --canned $SERVER_FLAGS
		fpid=$spid faddr=$addr
		if [[ -n $kaddr && -n $faddr ]]; then
			echo "Score runs: servers ${spin:+($spin) }kvbench --embedded --serve [--canned] $SERVER_FLAGS; generator ${gpin:+($gpin) }kvbench --addr --check --client grpc $GEN_FLAGS" >>"$OUT/kvbench.cpu"
			for i in $(seq "$GRPC_RUNS"); do
				# shellcheck disable=SC2086
				kvrun "kvbench-score-$i" "$kpid" $gpin --addr "$kaddr" --check --client grpc "${load[@]}" $GEN_FLAGS
				# shellcheck disable=SC2086
				kvrun "kvbench-floor-$i" "$fpid" $gpin --addr "$faddr" --check --client grpc "${load[@]}" $GEN_FLAGS
			done
		fi
		stop "$kpid" "$fpid"
		if [[ ${SKIP_OVERLOAD:-0} != 1 ]]; then
			# shellcheck disable=SC2086
			serve "$OUT/kvbench-overload-server.log" $SERVER_FLAGS $OVERLOAD_SHAPE
			kpid=$spid kaddr=$addr
			# shellcheck disable=SC2086
			serve "$OUT/kvbench-overload-floor-server.log" --canned $SERVER_FLAGS $OVERLOAD_SHAPE
			fpid=$spid faddr=$addr
			if [[ -n $kaddr && -n $faddr ]]; then
				ov=(--check --client "$OVERLOAD_CLIENT" --concurrency 512 --connections 1 --timeout 5s --json)
				capacity=0 at=0
				for rps in $OVERLOAD_PROBE_RPS; do
					# shellcheck disable=SC2086
					kvrun "kvbench-overload-probe-$rps" "$kpid" $gpin --addr "$kaddr" "${ov[@]}" --rps "$rps" --duration 5s $OVERLOAD_SHAPE $GEN_FLAGS
					pj=$OUT/kvbench-overload-probe-$rps.json
					[[ -f $pj ]] || continue
					c=$(awk -v a="$(jget "$pj" sent)" -v r="$(jget "$pj" refused)" -v e="$(jget "$pj" achieved_rps)" 'BEGIN { printf "%d", (a > 0 ? e * (a - r) / a : 0) }')
					echo "overload probe: offered $rps req/s, accepted $c" >>"$OUT/kvbench.cpu"
					((c > capacity)) && capacity=$c at=$rps
				done
				echo "overload: kvindex's capacity $capacity req/s (accepted at $at offered); offering it $((3 * capacity)), the floor $capacity" >>"$OUT/kvbench.cpu"
				if ((capacity > 0)); then
					# shellcheck disable=SC2086
					kvrun kvbench-overload "$kpid" $gpin --addr "$kaddr" "${ov[@]}" --rps $((3 * capacity)) --duration "$DURATION" $OVERLOAD_SHAPE $GEN_FLAGS
					# shellcheck disable=SC2086
					kvrun kvbench-overload-floor "$fpid" $gpin --addr "$faddr" "${ov[@]}" --rps "$capacity" --duration "$DURATION" $OVERLOAD_SHAPE $GEN_FLAGS
				fi
			fi
			stop "$kpid" "$fpid"
		fi
	else
		echo "bench.sh: kvbench does not build; the gRPC rows are not run" >&2
		status=1
	fi
fi

# Fleet mode (docs/fleet.md): kvfleetbench runs each benchmark with the
# replica in a process of its own and the generator (engines, agents, an
# embedded nats-server) in another; each prints one JSON report.
fleet=()
if [[ ${SKIP_FLEET:-0} != 1 ]]; then
	if "$GO" build -o "$OUT/" ./testbed/cmd/kvfleetbench ./cmd/kvindex; then
		frun() { # frun <name> <kvfleetbench args...>
			local name=$1
			shift
			echo "== fleet $name: kvfleetbench $*" >&2
			if "$OUT/kvfleetbench" "$@" >"$OUT/fleet-$name.json.tmp" 2>"$OUT/fleet-$name.log"; then
				mv "$OUT/fleet-$name.json.tmp" "$OUT/fleet-$name.json"
				fleet+=("$name")
			else
				echo "bench.sh: kvfleetbench $name failed (see $OUT/fleet-$name.log)" >&2
				rm -f "$OUT/fleet-$name.json.tmp"
				status=1
			fi
		}
		mkdir -p "$OUT/fleet-cache"
		# kvfleetbench pins the replica (or the lag floor's subscriber)
		# and the generator to FLEET_REPLICA_CPU and FLEET_GEN_CPU when
		# they are set (bench-large.sh sets them). Unset, the kernel
		# places them: on two cores a generator pinned to one cannot
		# offer the lag row's 100 k blocks/s through 100 agents
		# (docs/benchmarks.md, "Current"), and the floor runs the same
		# processes as the path, so both see the same placement.
		if [[ -n ${FLEET_REPLICA_CPU:-}${FLEET_GEN_CPU:-} ]] && ! command -v taskset >/dev/null; then
			echo "bench.sh: no taskset; the fleet rows' processes are not pinned" >&2
			export FLEET_REPLICA_CPU='' FLEET_GEN_CPU=''
		fi
		frun ingest ingest
		frun sync sync --workers "${FLEET_SYNC_WORKERS:-1000}" --cache-dir "$OUT/fleet-cache"
		frun lag lag --rounds "$LAG_ROUNDS" --agent-procs "$LAG_AGENT_PROCS"
		frun lag-quarter lag --rate 25000 --rounds "$LAG_ROUNDS" --agent-procs "$LAG_AGENT_PROCS"
		frun wire wire
		frun agent agent --kvindex "$OUT/kvindex"
	else
		echo "bench.sh: kvfleetbench does not build; the fleet rows are not run" >&2
		status=1
	fi
fi

# The table. Every row prints kvindex's figure, its floor from the same run
# and their ratio, which is the result: on a shared 2-core machine an
# absolute time measures the box (docs/benchmarks.md, "Ratios"). Each row:
# label | benchmark | unit | what the floor is | floor benchmark | floor unit
# | ratio unit (a ratio the benchmark measured itself, interleaving both
# call by call; empty: kvindex over the floor, medians) | direction of the
# ratio's goal (min: at least; max: at most; a leading i: reported without
# a goal) | goal. With -count > 1 a figure is its median; a benchmark
# name matches its sub-benchmarks too and the row shows the worst.
#
# The hybrid rows (KV-cache groups beside the prefix group: gpt-oss one
# sliding window, Gemma 3 five, Qwen3-Next three mamba groups) have no
# issue target; their goals are what we aim for (docs/benchmarks.md,
# "KV-cache groups"): apply, a side group costing no more per block than
# the prefix group, i.e. a ratio of at least 1/(1 + side groups); Score
# within 2x of prefix-only workers; a side group's heap per block no more
# than the prefix group's (tree and engine map) per residency.
rows='content keys, 32 K-token prompt, p50|BenchmarkPromptKeysFloor|keys-p50-ns|bare chained xxh3, same tokens|BenchmarkPromptKeysFloor|floor-p50-ns|ratio|max|1.10
Score 128 blocks x 8 workers, p50|BenchmarkScoreFloor/128x8|p50-ns|chained-hash floor|BenchmarkScoreFloor/128x8|floor-p50-ns|ratio|max|1.30
Score 2,048 blocks x 8 workers, p50|BenchmarkScoreFloor/2048x8|p50-ns|chained-hash floor|BenchmarkScoreFloor/2048x8|floor-p50-ns|ratio|max|1.30
Score 15,000 blocks x 96 workers, p50|BenchmarkScoreFloor/15000x96|p50-ns|chained-hash floor|BenchmarkScoreFloor/15000x96|floor-p50-ns|ratio|max|1.30
apply with removals, one core|BenchmarkApplyFloor|apply-blocks/s|Go map insert + delete|BenchmarkApplyFloor|floor-blocks/s|ratio|min|0.70
apply, gpt-oss (1 window group), thread CPU|BenchmarkApplyHybrid/gpt-oss|apply-blocks/s|prefix-only worker, same batches|BenchmarkApplyHybrid/gpt-oss|prefix-blocks/s|ratio|min|0.50
apply, Gemma 3 (5 window groups), thread CPU|BenchmarkApplyHybrid/gemma3|apply-blocks/s|prefix-only worker, same batches|BenchmarkApplyHybrid/gemma3|prefix-blocks/s|ratio|min|0.17
apply, Qwen3-Next (3 mamba groups), thread CPU|BenchmarkApplyHybrid/qwen3-next|apply-blocks/s|prefix-only worker, same batches|BenchmarkApplyHybrid/qwen3-next|prefix-blocks/s|ratio|min|0.25
Score 128x8, gpt-oss, window holds, p50|BenchmarkScoreHybrid/gpt-oss/hit|p50-ns|prefix-only workers, same prompts|BenchmarkScoreHybrid/gpt-oss/hit|prefix-p50-ns|ratio|max|2
Score 128x8, Gemma 3, windows hold, p50|BenchmarkScoreHybrid/gemma3/hit|p50-ns|prefix-only workers, same prompts|BenchmarkScoreHybrid/gemma3/hit|prefix-p50-ns|ratio|max|2
Score 128x8, Qwen3-Next, states held, p50|BenchmarkScoreHybrid/qwen3-next/hit|p50-ns|prefix-only workers, same prompts|BenchmarkScoreHybrid/qwen3-next/hit|prefix-p50-ns|ratio|max|2
Score 128x8, gpt-oss, worst of hit/cut/miss, p50|BenchmarkScoreHybrid/gpt-oss|p50-ns|prefix-only workers, same prompts|BenchmarkScoreHybrid/gpt-oss|prefix-p50-ns|ratio|max|2
Score 128x8, Gemma 3, worst of hit/cut/miss, p50|BenchmarkScoreHybrid/gemma3|p50-ns|prefix-only workers, same prompts|BenchmarkScoreHybrid/gemma3|prefix-p50-ns|ratio|max|2
Score 128x8, Qwen3-Next, worst of hit/cut/miss, p50|BenchmarkScoreHybrid/qwen3-next|p50-ns|prefix-only workers, same prompts|BenchmarkScoreHybrid/qwen3-next|prefix-p50-ns|ratio|max|2
(decode + apply, one core)|BenchmarkDecodeApply|blocks/s|apply alone (no decode)|BenchmarkApply|blocks/s||imin|0
(Score 128x8 heap allocations beyond the response)|BenchmarkScore128x8|allocs/op|(none: a count)||||max|0
(Score 4,096 blocks x 1,000 workers, Match p99)|BenchmarkScore4096x1000|match-p99-ns|map+mutex baseline|BenchmarkNaiveScore4096x1000|match-p99-ns||imax|0
Score p99 under 1 M blocks/s ingest|BenchmarkScoreUnderIngest|p99-ns|idle p99, same run|BenchmarkScoreUnderIngest|p99-idle-ns|ratio|max|2
Scorer.Score, 1,000 routes in flight + scrapes, mean|BenchmarkScoreLoaded|busy-mean-ns|without them, same run|BenchmarkScoreLoaded|idle-mean-ns|ratio|max|1.1
(Score over HTTP/JSON, 2,048 tokens, mean)|BenchmarkScoreJSON|json-ns|the same over gRPC|BenchmarkScoreJSON|grpc-ns|ratio|imax|0
(picker decision, 4 K-token chat, cached, p99)|BenchmarkPickChat4K/cached|p99_us|its /tokenize round trip|BenchmarkTokenizeChat4K|p99_us||imax|0
heap per (block, worker) residency, 10 M, unshared|BenchmarkMemory10M/unshared|all-bytes/residency|(none: bytes)||||max|24
(same, a shared fleet)|BenchmarkMemory10M/shared|all-bytes/residency|(none: bytes)||||imax|0
side-group heap per (block, group), worst layout|BenchmarkMemoryHybrid|side-bytes/block|tree + engine map per residency|BenchmarkMemoryHybrid|tree-bytes/block|ratio|max|1'

table=$(awk -v rows="$rows" '
function fmtval(v, unit) {
	if (unit ~ /blocks\/s$/) return sprintf("%.2f M/s", v / 1e6)
	if (unit ~ /ns$/) {
		if (v >= 1e6) return sprintf("%.2f ms", v / 1e6)
		if (v >= 1e3) return sprintf("%.2f us", v / 1e3)
		return sprintf("%.0f ns", v)
	}
	if (unit ~ /_us$/) return (v >= 1e3) ? sprintf("%.2f ms", v / 1e3) : sprintf("%.0f us", v)
	if (unit ~ /bytes/) return sprintf("%.1f B", v)
	if (unit == "allocs/op") return sprintf("%d", v)
	return sprintf("%g %s", v, unit)
}
function median(list,    n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
	if (n % 2) return a[(n + 1) / 2]
	return (a[n / 2] + a[n / 2 + 1]) / 2
}
# find(bench, unit, low): the worst median of unit over bench and its
# sub-benchmarks (the lowest when low), in got/gotwhich; 0 when none ran.
function find(bench, unit, low,    o, kv, m, found) {
	found = 0
	for (o = 1; o <= norder; o++) {
		split(order[o], kv, SUBSEP)
		if (kv[2] != unit) continue
		if (kv[1] != bench && index(kv[1], bench "/") != 1) continue
		m = median(vals[order[o]])
		if (!found || (low && m < got) || (!low && m > got)) { got = m; gotwhich = kv[1] }
		found = 1
	}
	return found
}
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name)
	for (i = 3; i < NF; i += 2) {
		key = name SUBSEP $(i + 1)
		vals[key] = (key in vals) ? vals[key] " " $i : $i
		if (!(key in seen)) { seen[key] = 1; order[++norder] = key }
	}
}
END {
	printf "%-52s %-22s %-40s %-8s %-8s %s\n", "row", "kvindex", "floor (same run)", "ratio", "goal", "status"
	n = split(rows, r, "\n")
	for (k = 1; k <= n; k++) {
		split(r[k], f, "|"); label = f[1]; bench = f[2]; unit = f[3]; flabel = f[4]; fbench = f[5]; funit = f[6]; runit = f[7]; dir = f[8]; goal = f[9]
		low = (unit ~ /\/s$/)
		if (!find(bench, unit, low)) { printf "%-52s %-22s %-40s %-8s %-8s %s\n", label, "-", flabel, "-", "-", "not run"; continue }
		v = got; which = gotwhich
		meas = fmtval(v, unit)
		if (which != bench) { w = which; sub(/^[^\/]*\//, "", w); meas = meas " (" w ")" }
		fl = flabel; ratio = ""
		if (fbench != "" && find(fbench, funit, !low)) {
			fl = fmtval(got, funit) " " flabel
			ratio = (runit != "" && find(bench, runit, low)) ? got : ((got > 0) ? v / got : "")
		}
		# The goal applies to the ratio where there is one, else to the figure.
		x = (ratio != "") ? ratio : v
		g = (dir ~ /min$/) ? ">= " goal : "<= " goal
		if (dir ~ /^i/) g = "-"
		st = "info"
		if (dir == "min") st = (x >= goal) ? "met" : "MISSED"
		if (dir == "max") st = (x <= goal) ? "met" : "MISSED"
		printf "%-52s %-22s %-40s %-8s %-8s %s\n", label, meas, fl, (ratio != "") ? sprintf("%.2fx", ratio) : "-", g, st
	}
}' "$raw")

row() { printf "%-52s %-22s %-40s %-8s %-8s %s\n" "$@"; } # label kvindex floor ratio goal status
fmtms() { awk -v v="$1" 'BEGIN { if (v >= 1e6) printf "%.2f ms", v / 1e6; else printf "%.0f us", v / 1e3 }'; }
# ratiorow <label> <kvindex> <floor> <floor text> <kvindex text> <dir> <goal> [ok]:
# a network row, its ratio kvindex over floor; ok=0 marks a run that broke
# (errors, rate not kept), which misses whatever the ratio.
ratiorow() {
	local label=$1 v=$2 fl=$3 ftext=$4 vtext=$5 dir=$6 goal=$7 ok=${8:-1} ratio st g
	ratio=$(awk -v v="$v" -v f="$fl" 'BEGIN { if (f > 0) printf "%.2f", v / f }')
	g="-" st=info
	if [[ -n $ratio && $dir != i* ]]; then
		g="$( [[ $dir == min ]] && echo ">=" || echo "<=") $goal"
		st=$(awk -v x="$ratio" -v g="$goal" -v d="$dir" 'BEGIN { print ((d == "min" && x >= g) || (d == "max" && x <= g)) ? "met" : "MISSED" }')
		((ok)) || st="MISSED (run broke)"
	fi
	table+=$'\n'$(row "$label" "$vtext" "${ftext:--}" "${ratio:+${ratio}x}" "$g" "$st")
}
# median <numbers...>
median() { printf "%s\n" "$@" | sort -n | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# runs <prefix>: the reports $OUT/<prefix>-N.json of a series of runs.
runs() { find "$OUT" -maxdepth 1 -name "$1-[0-9]*.json" 2>/dev/null | sort -V; }
# percall <report>: the server's CPU per call over a run, ns: its ticks
# over the whole generator session (warm-up included) over its calls.
percall() {
	local t
	t=$(cat "${1%.json}.ticks" 2>/dev/null || echo 0)
	awk -v t="$t" -v hz="$hz" -v n="$(jget "$1" sent)" -v w="$(jget "$1" warmup_sent)" 'BEGIN { if (n + w > 0) printf "%.0f", t / hz * 1e9 / (n + w) }'
}
# runok <report>: whether the run kept its rate (95%) with no errors.
runok() { awk -v a="$(jget "$1" achieved_rps)" -v e="$(jget "$1" errors)" -v r="$(jget "$1" rate)" 'BEGIN { exit !(e == 0 && a >= 0.95 * r) }'; }
fmtus() { awk -v v="$1" 'BEGIN { printf "%.1f us", v / 1e3 }'; }
# The Score rows: kvindex's runs and the floor's, medians of each.
mapfile -t kvr < <(runs kvbench-score)
mapfile -t flr < <(runs kvbench-floor)
if ((${#kvr[@]} && ${#flr[@]})); then
	ok=1 kp=() fp=() kc=() fc=()
	for f in "${kvr[@]}"; do
		kp+=("$(jget "$f" p99_ns)") kc+=("$(percall "$f")")
		runok "$f" && (($(jget "$f" refused) == 0)) || ok=0
	done
	for f in "${flr[@]}"; do
		fp+=("$(jget "$f" p99_ns)") fc+=("$(percall "$f")")
		runok "$f" && (($(jget "$f" refused) == 0)) || ok=0
	done
	rate=$(awk -v r="$(jget "${kvr[0]}" rate)" 'BEGIN { printf "%g k", r / 1e3 }')
	v=$(median "${kp[@]}") f=$(median "${fp[@]}")
	ratiorow "gRPC Score p99, $rate req/s, grpc-go generator" "$v" "$f" "$(fmtms "$f") canned grpc-go server" "$(fmtms "$v") (median of ${#kvr[@]})" max 1.20 "$ok"
	v=$(median "${kc[@]}") f=$(median "${fc[@]}")
	ratiorow "gRPC server CPU per Score call, same runs" "$v" "$f" "$(fmtus "$f") same canned server" "$(fmtus "$v")" max 1.50 "$ok"
else
	table+=$'\n'$(row "gRPC Score p99 and server CPU per call" "-" "canned grpc-go server" "-" "-" "not run")
fi
# The fleet rows, each against its floor from the same kvfleetbench run.
fget() { jget "$OUT/fleet-$1.json" "$2"; }
if [[ -f $OUT/fleet-ingest.json ]]; then
	v=$(fget ingest blocks_per_cpu_s) b=$(fget ingest baseline_blocks_per_cpu_s)
	ratiorow "replica ingest through NATS, per replica core" "$v" "$b" "$(awk -v b="$b" 'BEGIN { printf "%.2f M/s", b / 1e6 }') ApplyDelta in-process" \
		"$(awk -v v="$v" 'BEGIN { printf "%.2f M/s", v / 1e6 }')" min 0.80 "$(awk -v p="$(fget ingest problems)" 'BEGIN { print (p == 0) ? 1 : 0 }')"
fi
if [[ -f $OUT/fleet-sync.json ]]; then
	v=$(fget sync ready_ns) f=$(fget sync floor_ns)
	ratiorow "replica sync, $(fget sync workers) agents x $(awk -v k="$(fget sync keys)" -v w="$(fget sync workers)" 'BEGIN { printf "%.1f k", k / w / 1e3 }') blocks" "$v" "$f" \
		"$(awk -v f="$f" 'BEGIN { printf "%.2f s", f / 1e9 }') snapshot restore in-process" "$(awk -v v="$v" 'BEGIN { printf "%.2f s", v / 1e9 }')" max 1.30
	table+=$'\n'$(row "(replica sync peak RSS)" "$(awk -v v="$(fget sync peak_rss)" 'BEGIN { printf "%.0f MiB", v / 1048576 }')" "-" "-" "-" info)
fi
# lagrow <name> <label> <dir> <goal>: a lag run against its floor from
# the same kvfleetbench run; lost frames, problems, differing digests or
# engines that fell behind the offered rate (95%) break it.
lagrow() {
	local n=$1 v f ok=1
	v=$(fget "$n" p99_ns) f=$(fget "$n" floor_p99_ns)
	awk -v p="$(fget "$n" problems)" -v q="$(fget "$n" floor_problems)" -v r="$(fget "$n" rate)" -v fr="$(fget "$n" floor_rate)" -v o="$(fget "$n" offered_rate)" \
		'BEGIN { exit !(p == 0 && q == 0 && r >= 0.95 * o && fr >= 0.95 * o) }' || ok=0
	grep -q '"digests_ok": true' "$OUT/fleet-$n.json" || ok=0
	ratiorow "$2, $(awk -v r="$(fget "$n" offered_rate)" -v k="$(fget "$n" rate)" 'BEGIN { printf "%.0f k blocks/s, kept %.0f k", r / 1e3, k / 1e3 }')" "$v" "$f" \
		"$(fmtms "$f") frames ZMQ -> NATS -> subscriber" "$(fmtms "$v")" "$3" "$4" "$ok"
}
[[ -f $OUT/fleet-lag.json ]] && lagrow lag "engine -> replica lag p99" max 2.0
[[ -f $OUT/fleet-lag-quarter.json ]] && lagrow lag-quarter "(same lag)" imax 0
if [[ -f $OUT/fleet-wire.json ]]; then
	table+=$'\n'$(row "(NATS bytes per block stored / removed)" "$(awk -v s="$(fget wire wire_per_store)" -v r="$(fget wire wire_per_remove)" 'BEGIN { printf "%.1f B / %.1f B", s, r }')" "-" "-" "-" info)
fi
if [[ -f $OUT/fleet-agent.json ]]; then
	table+=$'\n'$(row "(agent CPU and RSS at $(awk -v r="$(fget agent rate)" 'BEGIN { printf "%.0f", r }') blocks/s)" "$(awk -v c="$(fget agent cpu_cores)" -v r="$(fget agent rss)" 'BEGIN { printf "%.3f cores, %.0f MiB", c, r / 1048576 }')" "-" "-" "-" info)
fi
# The overload rows: kvindex offered 3x its capacity against the floor
# server offered 1x; a run whose generator fell behind its rate, or with
# errors, is broken.
o=$OUT/kvbench-overload.json of=$OUT/kvbench-overload-floor.json
if [[ -f $o && -f $of ]]; then
	ok=1
	runok "$o" && runok "$of" || ok=0
	v=$(jget "$o" accepted_p99_ns) f=$(jget "$of" p99_ns)
	ratiorow "overload 3x capacity: accepted p99 ($(awk -v r="$(jget "$o" refused)" -v n="$(jget "$o" sent)" -v e="$(jget "$o" achieved_rps)" -v c="$(jget "$of" achieved_rps)" 'BEGIN { printf "%.0f%% refused, offered %.1fx", (n > 0 ? 100 * r / n : 0), (c > 0 ? e / c : 0) }'))" "$v" "$f" "$(fmtms "$f") p99, canned server at 1x" "$(fmtms "$v")" max 1.50 "$ok"
	v=$(jget "$o" refused_p99_ns) f=$(jget "$of" p50_ns)
	ratiorow "overload 3x capacity: refusals p99" "$v" "$f" "$(fmtms "$f") p50, canned server at 1x" "$(fmtms "$v")" max 1.00 "$ok"
elif [[ ${SKIP_OVERLOAD:-0} != 1 ]]; then
	table+=$'\n'$(row "overload 3x capacity" "-" "canned grpc-go server at 1x" "-" "-" "not run")
fi

# Where each process ran: the ratios compare runs with the same pinning.
pins="pinning: gRPC servers CPU ${SERVER_CPU:-any}, generator CPU ${GEN_CPU:-any}"
if [[ -f $OUT/fleet-lag.json ]]; then
	r=$(sed -n 's/.*"replica": *"\([^"]*\)".*/\1/p' "$OUT/fleet-lag.json" | head -1)
	g=$(sed -n 's/.*"generator": *"\([^"]*\)".*/\1/p' "$OUT/fleet-lag.json" | head -1)
	a=$(fget lag agent_procs)
	pins+="; fleet lag replica/subscriber CPU ${r:-any}, generator CPU ${g:-any}, agents in $( ((${a:-0} > 0)) && echo "$a processes of their own" || echo "the generator's process")"
fi
echo
{
	echo "$table"
	echo "$pins"
} | tee "$OUT/table.txt"
[[ -f $OUT/kvbench.cpu ]] && sed 's/^/gRPC /' "$OUT/kvbench.cpu" | tee -a "$OUT/table.txt"
echo
echo "raw benchmark output: $raw; load generator reports: $OUT/kvbench-*.json"
exit $status
