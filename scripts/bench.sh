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
#   GRPC_RUNS  generator runs against the separate server process (the headline
#              gRPC row, their median p99; default 5)
#   GRPC_H2_RUNS in-process runs with the lean h2 generator (the second row; default 3)
#   SERVER_FLAGS, GEN_FLAGS  kvbench flags of the server and generator processes
#              (defaults below; why in docs/benchmarks.md, "gRPC Score at 10 k req/s")
#   SERVER_CPU, GEN_CPU  the CPU each process is pinned to (default 0 and 1; set
#              both empty to let the kernel place them)
#   OUT        output directory (default bench-out)
#   SKIP_GRPC  set to 1 to skip the load generator
#   SKIP_GO    set to 1 to skip the Go benchmarks (only the generator rows)
#   SKIP_FLEET set to 1 to skip the fleet rows (kvfleetbench: ingest, sync,
#              lag, wire bytes, agent cost); FLEET_SYNC_WORKERS agents in the
#              sync row (default 1000 x 30,000 blocks; snapshots cached in
#              $OUT/fleet-cache between runs)
#   SKIP_OVERLOAD set to 1 to skip the overload rows (admission control at 3x
#              the server's capacity)
#   OVERLOAD_SHAPE shape flags of the overload rows' server and generator
#              (default below), OVERLOAD_PROBE_RPS the rate that finds the
#              capacity (default 30000), OVERLOAD_CLIENT its client (default h2)
#   CPUPROFILE set to 1 to also write a CPU profile per package into $OUT
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
GRPC_H2_RUNS=${GRPC_H2_RUNS:-3}
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
# saturates at a rate whose triple one generator core can still offer.
OVERLOAD_SHAPE=${OVERLOAD_SHAPE:---prompt-blocks 2048 --shared-blocks 512}
OVERLOAD_PROBE_RPS=${OVERLOAD_PROBE_RPS:-8000}
OVERLOAD_CLIENT=${OVERLOAD_CLIENT:-h2}
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
raw="$OUT/latest.txt"
stamp=$(date -u +%Y%m%dT%H%M%SZ)

# The benchmarks behind the targets. BenchmarkMemory10M builds a 10 M
# residency index: it runs once, apart from the timed ones.
timed='^(BenchmarkDecode|BenchmarkDecodeApply|BenchmarkApply|BenchmarkApplyCached|BenchmarkNaiveApply|BenchmarkPromptKeys32K|BenchmarkPromptKeysFloor|BenchmarkScore128x8|BenchmarkScoreFloor|BenchmarkScore4096x1000|BenchmarkScoreUnderIngest|BenchmarkScoreLoaded|BenchmarkScoreJSON)$'
memory='^BenchmarkMemory10M$'
pkgs=(./indexer ./events ./testbed/benchsuite ./api ./scoring)

# jget <file> <key>: a number from a kvbench JSON report.
jget() { sed -n "s/.*\"$2\": *\([0-9.]*\).*/\1/p" "$1" | head -1; }

status=0
run() { # run <label> <go test args...>: append to $raw, note failures
	local label=$1
	shift
	echo "== $label: $GO test $*" >&2
	if ! "$GO" test "$@" | tee -a "$raw"; then
		echo "bench.sh: $label: go test failed (see $raw); continuing" >&2
		status=1
	fi
}

: >"$raw"
{
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
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >>"$raw"
cp "$raw" "$OUT/bench-$stamp.txt"

# The gRPC rows (docs/benchmarks.md, "gRPC Score at 10 k req/s").
#
# Headline: the server and the generator in separate processes, as a
# router and kvindex are. One `kvbench --embedded --serve` process holds
# the index and serves it; GRPC_RUNS generator processes in turn,
# `kvbench --addr --check --client grpc`, send Scores through kvindex's Go
# client (api.Client, grpc-go), checking every reply. The row is the
# median p99 of those runs; each must keep the rate with no errors.
#
# Second row: GRPC_H2_RUNS runs of `kvbench --embedded --client h2`, the
# lean HTTP/2 generator in the server's own process, which leaves nearly
# all of both cores to the server: the server's latency with little of the
# generator's cost.
#
# Latency on a shared machine means little without knowing what else ran:
# each run notes the cores the server, the generator and every other
# process used, and the generator's own pacing lag.
rm -f "$OUT"/kvbench*.json "$OUT/kvbench.cpu" "$OUT/kvbench-server.log"
splitruns=() h2runs=()
if [[ ${SKIP_GRPC:-0} != 1 ]]; then
	hz=$(getconf CLK_TCK)
	busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat 2>/dev/null || echo 0; }
	ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
	load=(--rps "$RPS" --duration "$DURATION" --concurrency "$CONNS" --json)
	# kvrun <name> <server pid or 0> [taskset -c N] <kvbench args...>: one
	# generator run into $OUT/<name>.json, its CPU and everyone else's into
	# kvbench.cpu.
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
			read -r u s r <"$OUT/kvbench.time"
			awk -v b=$((b2 - b1)) -v sv=$((s2 - s1)) -v hz="$hz" -v u="$u" -v s="$s" -v r="$r" -v name="$name" -v twoproc="$spid" \
				-v lag="$(jget "$OUT/$name.json" lag_p99_ns)" -v p99="$(jget "$OUT/$name.json" p99_ns)" 'BEGIN {
				o = (b / hz - u - s - sv / hz) / r
				if (twoproc) printf "%s: p99 %.0f us, generator lag p99 %.0f us; server %.2f cores, generator %.2f cores, other processes %.2f cores\n", name, p99 / 1e3, lag / 1e3, sv / hz / r, (u + s) / r, (o < 0 ? 0 : o)
				else printf "%s: p99 %.0f us, generator lag p99 %.0f us; kvbench (server and generator) %.2f cores, other processes %.2f cores\n", name, p99 / 1e3, lag / 1e3, (u + s) / r, (o < 0 ? 0 : o)
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
			echo "bench.sh: no taskset; the split rows' processes are not pinned" >&2
		fi
	}
	spin=$(pin "$SERVER_CPU") gpin=$(pin "$GEN_CPU")
	if "$GO" build -o "$OUT/kvbench" ./testbed/cmd/kvbench; then
		echo "== server: $spin kvbench --embedded --serve --listen 127.0.0.1:0 $SERVER_FLAGS" >&2
		# shellcheck disable=SC2086 # the prefix and flags are words
		$spin "$OUT/kvbench" --embedded --serve --listen 127.0.0.1:0 $SERVER_FLAGS >"$OUT/kvbench-server.log" 2>&1 &
		spid=$! addr=
		for _ in $(seq 600); do # loading the index takes a few seconds
			addr=$(sed -n 's/^serving .* on \([^ ]*\) (.*/\1/p' "$OUT/kvbench-server.log")
			[[ -n $addr ]] && break
			kill -0 "$spid" 2>/dev/null || break
			sleep 0.1
		done
		if [[ -n $addr ]]; then
			echo "split runs: server ${spin:+($spin) }kvbench --embedded --serve $SERVER_FLAGS; generator ${gpin:+($gpin) }kvbench --addr --check --client grpc $GEN_FLAGS" >>"$OUT/kvbench.cpu"
			for i in $(seq "$GRPC_RUNS"); do
				# shellcheck disable=SC2086
				kvrun "kvbench-split-$i" "$spid" $gpin --addr "$addr" --check --client grpc "${load[@]}" $GEN_FLAGS
				[[ -f $OUT/kvbench-split-$i.json ]] && splitruns+=("$OUT/kvbench-split-$i.json")
			done
		else
			echo "bench.sh: the kvbench server did not start (see $OUT/kvbench-server.log)" >&2
			status=1
		fi
		kill "$spid" 2>/dev/null
		wait "$spid" 2>/dev/null
		for i in $(seq "$GRPC_H2_RUNS"); do
			kvrun "kvbench-h2-$i" 0 --embedded --client h2 "${load[@]}"
			[[ -f $OUT/kvbench-h2-$i.json ]] && h2runs+=("$OUT/kvbench-h2-$i.json")
		done
		# Overload: admission control at 3x what the server sustains. A
		# server with its default admission settings (the daemon's) serves
		# OVERLOAD_SHAPE; a probe offered far more than it can take finds
		# its capacity (the rate of accepted calls); then a run offers 3x
		# that. Accepted calls and refusals (ResourceExhausted) are timed
		# apart; the generator's pacing lag says whether it kept the rate.
		if [[ ${SKIP_OVERLOAD:-0} != 1 ]]; then
			echo "== overload server: $spin kvbench --embedded --serve $SERVER_FLAGS $OVERLOAD_SHAPE" >&2
			# shellcheck disable=SC2086
			$spin "$OUT/kvbench" --embedded --serve --listen 127.0.0.1:0 $SERVER_FLAGS $OVERLOAD_SHAPE >"$OUT/kvbench-overload-server.log" 2>&1 &
			spid=$! addr=
			for _ in $(seq 600); do
				addr=$(sed -n 's/^serving .* on \([^ ]*\) (.*/\1/p' "$OUT/kvbench-overload-server.log")
				[[ -n $addr ]] && break
				kill -0 "$spid" 2>/dev/null || break
				sleep 0.1
			done
			if [[ -n $addr ]]; then
				ov=(--addr "$addr" --check --client "$OVERLOAD_CLIENT" --concurrency 512 --connections 1 --timeout 5s --json)
				# shellcheck disable=SC2086
				kvrun kvbench-overload-probe "$spid" $gpin "${ov[@]}" --rps "$OVERLOAD_PROBE_RPS" --duration 5s $OVERLOAD_SHAPE $GEN_FLAGS
				if [[ -f $OUT/kvbench-overload-probe.json ]]; then
					capacity=$(awk -v a="$(jget "$OUT/kvbench-overload-probe.json" sent)" -v r="$(jget "$OUT/kvbench-overload-probe.json" refused)" -v e="$(jget "$OUT/kvbench-overload-probe.json" achieved_rps)" 'BEGIN { printf "%d", (a > 0 ? e * (a - r) / a : 0) }')
					echo "overload: capacity $capacity req/s accepted at $OVERLOAD_PROBE_RPS offered; offering $((3 * capacity))" >>"$OUT/kvbench.cpu"
					# shellcheck disable=SC2086
					kvrun kvbench-overload "$spid" $gpin "${ov[@]}" --rps $((3 * capacity)) --duration "$DURATION" $OVERLOAD_SHAPE $GEN_FLAGS
				fi
			else
				echo "bench.sh: the overload server did not start (see $OUT/kvbench-overload-server.log)" >&2
				status=1
			fi
			kill "$spid" 2>/dev/null
			wait "$spid" 2>/dev/null
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
		frun ingest ingest
		frun sync sync --workers "${FLEET_SYNC_WORKERS:-1000}" --cache-dir "$OUT/fleet-cache"
		frun lag lag
		frun lag-quarter lag --rate 25000
		frun wire wire
		frun agent agent --kvindex "$OUT/kvindex"
	else
		echo "bench.sh: kvfleetbench does not build; the fleet rows are not run" >&2
		status=1
	fi
fi

# The table. Each row: benchmark name (sub-benchmarks included), unit,
# direction (min: at least the target; max: at most; a leading i marks a
# row reported without a target), target, label. With -count > 1 a
# benchmark's value is its median; with several sub-benchmarks the row
# shows the worst of them, and which it was.
rows='BenchmarkDecodeApply|blocks/s|min|3000000|decode + apply BlockStored batches, one core
BenchmarkApply|blocks/s|min|8000000|apply alone
BenchmarkApplyCached|blocks/s|imin|0|(apply with everything in cache, 16-batch window)
BenchmarkNaiveApply|blocks/s|imin|0|(apply on the map+mutex baseline)
BenchmarkDecode|blocks/s|imin|0|(decode alone, 8 events x 4 blocks x 16 tokens)
BenchmarkPromptKeys32K|ns/op|max|14000|content keys, 32 K-token prompt
BenchmarkPromptKeysFloor|ratio|imax|0|(content keys / chained-xxh3 floor, same run)
BenchmarkScoreFloor|ratio|max|1.3|Score / chained-xxh3 floor, p50 (128, 2048, 15000 blocks)
BenchmarkScore128x8|p50-ns|max|5000|Score 128 blocks x 8 workers, full hit, p50
BenchmarkScore128x8|allocs/op|max|0|Score 128x8 heap allocations beyond the response
BenchmarkScore4096x1000|p99-ns|max|100000|Score 4096 blocks x 1000 workers, p99
BenchmarkScoreUnderIngest|ratio|max|2|Score p99 under 1 M blocks/s ingest / idle p99
BenchmarkScoreUnderIngest|busy-switches/kop|imax|0|(scoring thread switched out, per 1,000 Scores)
BenchmarkScoreLoaded|ratio|max|1.1|Scorer.Score with 1,000 routes in flight and live scrapes / without, mean
BenchmarkScoreJSON|ratio|imax|0|Score over HTTP/JSON / over gRPC, same run, mean
BenchmarkScoreJSON|json-ns|imax|0|(Score over HTTP/JSON, 2,048 tokens, mean)
BenchmarkScoreJSON|grpc-ns|imax|0|(same over gRPC, same run)
BenchmarkMemory10M|all-bytes/residency|max|24|memory per (block, worker) residency, engine maps included
BenchmarkMemory10M|bytes/residency|imax|0|(of which the residency index)
BenchmarkMemory10M|engine-bytes/block|imax|0|(of which the engine-hash maps, per block)
BenchmarkPickChat4K/cached|p99_us|max|1000|picker decision, 4 K-token chat, tokens cached, p99
BenchmarkPickChat4K/cached|p50_us|imax|0|(same, p50)
BenchmarkPickChat4K/uncached|p50_us|imax|0|(picker decision, uncached, p50)
BenchmarkTokenizeChat4K|p50_us|imax|0|(its /tokenize round trip alone, p50)'

table=$(awk -v rows="$rows" '
function fmtval(v, unit) {
	if (unit == "blocks/s") return sprintf("%.2f M/s", v / 1e6)
	if (unit ~ /ns/) {
		if (v >= 1e6) return sprintf("%.2f ms", v / 1e6)
		if (v >= 1e3) return sprintf("%.2f us", v / 1e3)
		return sprintf("%.0f ns", v)
	}
	if (unit ~ /_us$/) return (v >= 1e3) ? sprintf("%.2f ms", v / 1e3) : sprintf("%.0f us", v)
	if (unit == "ratio") return sprintf("%.2fx", v)
	if (unit ~ /bytes/) return sprintf("%.1f B", v)
	if (unit == "allocs/op") return sprintf("%d allocs/op", v)
	return sprintf("%g %s", v, unit)
}
function median(list,    n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
	if (n % 2) return a[(n + 1) / 2]
	return (a[n / 2] + a[n / 2 + 1]) / 2
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
	printf "%-52s %-14s %-24s %s\n", "target", "goal", "measured", "status"
	n = split(rows, r, "\n")
	for (k = 1; k <= n; k++) {
		split(r[k], f, "|"); bench = f[1]; unit = f[2]; dir = f[3]; goal = f[4]; label = f[5]
		found = 0; worst = ""; which = ""
		for (o = 1; o <= norder; o++) {
			split(order[o], kv, SUBSEP)
			if (kv[2] != unit) continue
			if (kv[1] != bench && index(kv[1], bench "/") != 1) continue
			m = median(vals[order[o]])
			low = (dir == "min" || dir == "imin")
			if (!found || (low && m < worst) || (!low && m > worst)) { worst = m; which = kv[1] }
			found = 1
		}
		g = (dir == "min") ? ">= " fmtval(goal, unit) : "<= " fmtval(goal, unit)
		if (dir ~ /^i/) g = "(reported)"
		if (!found) { printf "%-52s %-14s %-24s %s\n", label, g, "-", "not run"; continue }
		st = "info"
		if (dir == "min") st = (worst >= goal) ? "met" : "MISSED"
		if (dir == "max") st = (worst <= goal) ? "met" : "MISSED"
		meas = fmtval(worst, unit)
		if (which != bench) { sub(/^[^\/]*\//, "", which); meas = meas " (" which ")" }
		printf "%-52s %-14s %-24s %s\n", label, g, meas, st
	}
}' "$raw")

row() { printf "%-52s %-14s %-24s %s\n" "$@"; }
fmtms() { awk -v v="$1" 'BEGIN { if (v >= 1e6) printf "%.2f ms", v / 1e6; else printf "%.0f us", v / 1e3 }'; }
# grpcrow <label> <goal or ""> <json files...>: the median p99 of the runs,
# each listed; met when every run kept the rate with no errors and the
# median is within the goal.
grpcrow() {
	local label=$1 goal=$2 p99s=() ok=1 med st all f
	shift 2
	if (($# == 0)); then
		table+=$'\n'$(row "$label" "${goal:-(reported)}" "-" "not run")
		return
	fi
	for f in "$@"; do
		p99s+=("$(jget "$f" p99_ns)")
		awk -v a="$(jget "$f" achieved_rps)" -v e="$(jget "$f" errors)" -v x="$(jget "$f" refused)" -v r="$RPS" 'BEGIN { exit !(e == 0 && x == 0 && a >= 0.98 * r) }' || ok=0
	done
	med=$(printf "%s\n" "${p99s[@]}" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
	all=$(for v in "${p99s[@]}"; do fmtms "$v"; echo; done | paste -sd, - | sed "s/,/, /g")
	if [[ -n $goal ]]; then
		st=MISSED
		((ok)) && awk -v m="$med" 'BEGIN { exit !(m <= 1e6) }' && st=met
	else
		st=info
		((ok)) || st="info (errors or rate missed)"
	fi
	table+=$'\n'$(row "$label" "${goal:-(reported)}" "$(fmtms "$med") (median of $#: $all)" "$st")
}
grpcrow "gRPC Score p99 at $RPS req/s, grpc-go, 2 processes" "<= 1.00 ms" "${splitruns[@]}"
grpcrow "(same, lean h2 generator in the server process)" "" "${h2runs[@]}"
# The fleet rows.
fget() { jget "$OUT/fleet-$1.json" "$2"; }
frow() { # frow <label> <goal text> <value text> <ok 0/1, or "" for info>
	local st=info
	[[ -n $4 ]] && { ((${4})) && st=met || st=MISSED; }
	table+=$'\n'$(row "$1" "$2" "$3" "$st")
}
if [[ -f $OUT/fleet-ingest.json ]]; then
	v=$(fget ingest blocks_per_cpu_s) b=$(fget ingest baseline_blocks_per_cpu_s)
	frow "fleet ingest, agent -> NATS -> replica, per replica core" ">= 2.00 M/s" "$(awk -v v="$v" -v b="$b" 'BEGIN { printf "%.2f M/s (%.2fx the apply-only baseline)", v / 1e6, v / b }')" "$(awk -v v="$v" -v p="$(fget ingest problems)" 'BEGIN { print (v >= 2e6 && p == 0) ? 1 : 0 }')"
fi
if [[ -f $OUT/fleet-sync.json ]]; then
	v=$(fget sync ready_ns)
	frow "fleet sync, $(fget sync workers) agents, $(fget sync keys) blocks, ready" "<= 5.00 s" "$(awk -v v="$v" -v f="$(fget sync floor_ns)" 'BEGIN { printf "%.2f s (restore floor %.2f s)", v / 1e9, f / 1e9 }')" "$(awk -v v="$v" -v w="$(fget sync workers)" 'BEGIN { print (v <= 5e9 && w >= 1000) ? 1 : 0 }')"
	frow "(fleet sync peak RSS)" "(reported)" "$(awk -v v="$(fget sync peak_rss)" 'BEGIN { printf "%.0f MiB", v / 1048576 }')" ""
fi
if [[ -f $OUT/fleet-lag.json ]]; then
	v=$(fget lag p99_ns)
	frow "fleet lag engine -> replica p99 at $(awk -v r="$(fget lag rate)" 'BEGIN { printf "%.0f k", r / 1e3 }') blocks/s" "<= 5.00 ms" "$(fmtms "$v") (engine -> agent $(fmtms "$(fget lag agent_p99_ns)"))" "$(awk -v v="$v" -v r="$(fget lag rate)" 'BEGIN { print (v <= 5e6 && r >= 1e5) ? 1 : 0 }')"
fi
if [[ -f $OUT/fleet-lag-quarter.json ]]; then
	v=$(fget lag-quarter p99_ns)
	frow "(fleet lag p99 at $(awk -v r="$(fget lag-quarter rate)" 'BEGIN { printf "%.0f k", r / 1e3 }') blocks/s: the generator with headroom)" "(reported)" "$(fmtms "$v")" ""
fi
if [[ -f $OUT/fleet-wire.json ]]; then
	frow "(NATS bytes per block stored / removed, realistic)" "(reported)" "$(awk -v s="$(fget wire wire_per_store)" -v r="$(fget wire wire_per_remove)" 'BEGIN { printf "%.1f B / %.1f B", s, r }')" ""
fi
if [[ -f $OUT/fleet-agent.json ]]; then
	frow "(agent CPU and RSS, one pod at $(fget agent rate) blocks/s)" "(reported)" "$(awk -v c="$(fget agent cpu_cores)" -v r="$(fget agent rss)" 'BEGIN { printf "%.3f cores, %.0f MiB", c, r / 1048576 }')" ""
fi

# The overload rows: accepted p99 <= 5 ms and refusals p99 <= 1 ms at 3x
# capacity, with no other errors and the generator keeping the rate (its
# lag p99 under 1 ms).
if [[ -f $OUT/kvbench-overload.json ]]; then
	f=$OUT/kvbench-overload.json
	okrun=$(awk -v e="$(jget "$f" errors)" -v l="$(jget "$f" lag_p99_ns)" -v x="$(jget "$f" refused)" 'BEGIN { print (e == 0 && l < 1e6 && x > 0) ? 1 : 0 }')
	st() { if ((okrun)); then awk -v v="$1" -v g="$2" 'BEGIN { print (v <= g) ? "met" : "MISSED" }'; else echo "MISSED (errors, no refusals or generator lag)"; fi; }
	a99=$(jget "$f" accepted_p99_ns) r99=$(jget "$f" refused_p99_ns)
	table+=$'\n'$(row "overload 3x capacity: accepted p99 ($(jget "$f" refused) of $(jget "$f" sent) refused)" "<= 5.00 ms" "$(fmtms "$a99")" "$(st "$a99" 5e6)")
	table+=$'\n'$(row "overload 3x capacity: refusals p99" "<= 1.00 ms" "$(fmtms "$r99")" "$(st "$r99" 1e6)")
elif [[ ${SKIP_GRPC:-0} != 1 && ${SKIP_OVERLOAD:-0} != 1 ]]; then
	table+=$'\n'$(row "overload 3x capacity" "" "-" "not run")
fi

echo
echo "$table" | tee "$OUT/table.txt"
[[ -f $OUT/kvbench.cpu ]] && sed 's/^/gRPC /' "$OUT/kvbench.cpu" | tee -a "$OUT/table.txt"
echo
echo "raw benchmark output: $raw; load generator reports: $OUT/kvbench-*.json"
exit $status
