#!/usr/bin/env bash
# scripts/edgecpu.sh: the side-by-side proxy CPU comparison
# (scripts/bench.sh section 2's set-up), alone and extended to streams.
# One run, rounds interleaved over the targets direct / HAProxy / nginx /
# Sluice in front of `sluice sim` (2 replicas, 1 ms decode steps):
#   light   -c 1 non-streamed requests, every target in turn request by
#           request (EDGE_LIGHT_BLOCKS=1: a block per target, as before
#           2026-12-02 round 5): added latency p50/p99;
#   whole   -c 16 non-streamed requests: proxy CPU µs per request and the
#           replica's (simulator's) CPU µs per request;
#   stream  -c 16 streamed requests of EDGE_STREAM_TOKENS tokens: proxy CPU
#           µs per SSE chunk passed (chunks counted by the client);
#   rate    EDGE_RATE_N non-streamed requests, open loop at EDGE_RATE per
#           second (800): the replica's CPU µs per request at one offered
#           load for every target. At -c 16 closed loop a proxy's added
#           latency lowers the replica's throughput and so its batch
#           occupancy, and the simulator's per-step cost is then shared by
#           fewer requests: that column measures the proxy's latency as much
#           as the work it sends upstream. At a fixed rate every target's
#           replica runs the same batches, and what is left is the request.
# CPU is process time (the sum of /proc/PID/task/*/schedstat on-CPU ns, all
# threads; ns resolution, utime+stime in effect), not wall time: steadier on
# a shared machine. Knobs: EDGE_ROUNDS (5), EDGE_N (3000), EDGE_LIGHT_N (400),
# EDGE_RATE (800), EDGE_RATE_N (2400), EDGE_SIM_ENV (environment for the
# simulator, e.g. GOMAXPROCS=1),
# EDGE_STREAM_N (600), EDGE_STREAM_TOKENS (64), EDGE_WHOLE_TOKENS (4: the
# non-streamed requests' max_tokens; above upstream.non_streamed_interval,
# 64 by default, Sluice sends them upstream as coarse streams), EDGE_TARGETS, EDGE_KEEP=1,
# EDGE_RAW=1 (print every round), EDGE_SYSCALLS=1 (after the rounds, one
# more pass per proxy under `perf stat`: system calls, context switches and
# the main calls per request and per chunk), SLUICE_BIN (a prebuilt binary; default:
# build bin/sluice), EDGE_BASE_BIN (a second build, target sluice-base, to
# measure before/after in the same run). Sluice inherits the environment:
# SLUICE_GO_SYSMON=awake measures it with its opt-in sysmon re-exec.
# Prints one table (medians over rounds) on stdout.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=${EDGE_ROUNDS:-5}
N=${EDGE_N:-3000}
LIGHT_N=${EDGE_LIGHT_N:-400}
SN=${EDGE_STREAM_N:-600}
STOK=${EDGE_STREAM_TOKENS:-64}
WTOK=${EDGE_WHOLE_TOKENS:-4}
RATE=${EDGE_RATE:-800}
RN=${EDGE_RATE_N:-2400}
GO=${GO:-go}
WORK=$(mktemp -d /tmp/sluice-edgecpu.XXXXXX)
LIB_NAME=edgecpu LIB_KEEP_VAR=EDGE_KEEP
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh" # cleanup, stop, wait_http, ports_free, median
log() { echo "edgecpu: $*" >&2; }

BASE=$((20000 + (($$ + 600) % 1200) * 10))
ports_free "$BASE" 10
SIM_PORT=$BASE HAP_PORT=$((BASE + 4)) NGX_PORT=$((BASE + 5)) API_PORT=$((BASE + 6)) ADM_PORT=$((BASE + 7))
BASE_API_PORT=$((BASE + 8)) BASE_ADM_PORT=$((BASE + 9))

# cpu_ns PID...: on-CPU nanoseconds of the processes, all their threads.
cpu_ns() {
	local p
	for p in "$@"; do cat /proc/"$p"/task/*/schedstat 2>/dev/null; done | awk '{s += $1} END {printf "%.0f\n", s}'
}
# io_bytes PID: bytes the process read and wrote through system calls
# (rchar + wchar): what the replica was sent and answered, headers included.
io_bytes() { awk '/^(rchar|wchar):/ {s += $2} END {printf "%.0f\n", s}' /proc/"$1"/io; }
# work_ns PID: cpu_ns of a Go process less its runtime monitor (sysmon), the
# thread runtime.main starts before any other (the second-lowest thread id).
# Behind a proxy, under CPU contention, the simulator's sysmon stays at its
# shortest (20 µs) period, and its wake-ups, not the requests, were most of
# the simulator's extra CPU (perf; docs/benchmarks/cpu-per-request.md,
# 2026-12-03 and 2026-12-05). vLLM's Python server has no such thread, so
# the replica's work per request is this figure.
work_ns() {
	local mon
	mon=$(ls /proc/"$1"/task | sort -n | sed -n 2p)
	for d in /proc/"$1"/task/*; do [ "${d##*/}" = "$mon" ] || cat "$d/schedstat" 2>/dev/null; done | awk '{s += $1} END {printf "%.0f\n", s}'
}

SLUICE=${SLUICE_BIN:-}
if [ -z "$SLUICE" ]; then
	log "building bin/sluice"
	$GO build -o bin/sluice ./cmd/sluice
	SLUICE=$ROOT/bin/sluice
fi

$GO build -o "$WORK/loadloop.bin" ./scripts/loadloop # the load generator (scripts/loadloop)

KEY=sk-edgecpu-$RANDOM$RANDOM$RANDOM
# write_config FILE API_PORT ADMIN_PORT
write_config() {
	{
		echo "listen: 127.0.0.1:$2"
		echo "admin_listen: 127.0.0.1:$3"
		echo "gpu: {telemetry: off}"
		echo "server: {drain_timeout: 5s}"
		echo "upstream:"
		echo "  replicas:"
		for i in 0 1; do echo "    - {name: r$i, url: \"http://127.0.0.1:$((SIM_PORT + i))\", max_num_seqs: 64}"; done
		echo "tenants:"
		echo "  - name: solo"
		echo "    api_keys: [\"$(printf '%s\n' "$KEY" | "$SLUICE" key hash)\"]"
	} >"$1"
}
# start_sluice BIN API_PORT ADMIN_PORT NAME: prints the pid.
start_sluice() {
	# A directory per instance: its data_dir (the config's directory) is its own.
	mkdir -p "$WORK/$4"
	write_config "$WORK/$4/sluice.yaml" "$2" "$3"
	"$1" serve --config "$WORK/$4/sluice.yaml" >"$WORK/$4.log" 2>&1 &
	echo $!
}
# sized ADMIN_PORT: every replica scraped and sized.
sized() {
	local i
	for i in $(seq 1 100); do
		[ "$(curl -fs "http://127.0.0.1:$1/metrics" | awk '/^sluice_replica_capacity_tokens[{ ]/ && $NF > 0 { n++ } END { print n + 0 }')" -ge 2 ] && return 0
		sleep 0.1
	done
	echo "edgecpu: sluice on admin port $1 never sized its replicas" >&2
	return 1
}

${EDGE_SIM_CPUS:+taskset -c "$EDGE_SIM_CPUS"} env ${EDGE_SIM_ENV:-} "$SLUICE" sim --listen "127.0.0.1:$SIM_PORT" --replicas 2 --decode-step 1ms >"$WORK/sim.log" 2>&1 &
SIM_PID=$!
PIDS+=("$SIM_PID")
for i in 0 1; do wait_http "http://127.0.0.1:$((SIM_PORT + i))/health"; done
SLUICE_PID=$(start_sluice "$SLUICE" "$API_PORT" "$ADM_PORT" sluice)
PIDS+=("$SLUICE_PID")
wait_http "http://127.0.0.1:$API_PORT/readyz"
sized "$ADM_PORT"
BASE_PID=""
if [ -n "${EDGE_BASE_BIN:-}" ]; then # a second build to compare in the same run
	BASE_PID=$(start_sluice "$EDGE_BASE_BIN" "$BASE_API_PORT" "$BASE_ADM_PORT" sluice-base)
	PIDS+=("$BASE_PID")
	wait_http "http://127.0.0.1:$BASE_API_PORT/readyz"
	sized "$BASE_ADM_PORT"
fi
{
	printf 'global\n  maxconn 4000\n  nbthread 2\n'
	printf 'defaults\n  mode http\n  timeout connect 5s\n  timeout client 300s\n  timeout server 300s\n'
	printf '  timeout queue 30s\n  option http-keep-alive\n  http-reuse always\n'
	printf 'frontend fe\n  bind 127.0.0.1:%d\n  default_backend be\n' "$HAP_PORT"
	printf 'backend be\n  balance leastconn\n'
	for i in 0 1; do printf '  server s%d 127.0.0.1:%d maxconn 64\n' "$i" $((SIM_PORT + i)); done
} >"$WORK/haproxy.cfg"
haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 &
HAP_PID=$!
PIDS+=("$HAP_PID")
wait_http "http://127.0.0.1:$HAP_PORT/health"
NGINX=$(command -v nginx || true)
[ -n "$NGINX" ] || NGINX=$([ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx || true)
TARGETS=${EDGE_TARGETS:-direct haproxy sluice}
NGX_PID=""
if [ -n "$NGINX" ] && [ -z "${EDGE_TARGETS:-}" ]; then
	mkdir -p "$WORK/nginx"
	{
		[ "$(id -u)" = 0 ] && echo "user root;"
		echo "worker_processes 2; daemon off; pid $WORK/nginx/nginx.pid; error_log $WORK/nginx/error.log warn;"
		echo "events { worker_connections 4096; }"
		echo "http { access_log off;"
		echo "  client_body_temp_path $WORK/nginx/body; proxy_temp_path $WORK/nginx/proxy;"
		echo "  fastcgi_temp_path $WORK/nginx/fcgi; uwsgi_temp_path $WORK/nginx/uwsgi; scgi_temp_path $WORK/nginx/scgi;"
		echo "  upstream sims { server 127.0.0.1:$SIM_PORT; server 127.0.0.1:$((SIM_PORT + 1)); keepalive 64; }"
		echo "  server { listen 127.0.0.1:$NGX_PORT; location / { proxy_pass http://sims; proxy_http_version 1.1;"
		echo "    proxy_set_header Connection \"\"; proxy_buffering off; proxy_read_timeout 300s; } } }"
	} >"$WORK/nginx.conf"
	"$NGINX" -e "$WORK/nginx/error.log" -p "$WORK/nginx" -c "$WORK/nginx.conf" >"$WORK/nginx.log" 2>&1 &
	NGX_PID=$!
	PIDS+=("$NGX_PID")
	wait_http "http://127.0.0.1:$NGX_PORT/health" && TARGETS="direct haproxy nginx sluice"
fi
[ -n "$BASE_PID" ] && TARGETS="$TARGETS sluice-base"
url_of() {
	case $1 in
	direct) echo "http://127.0.0.1:$SIM_PORT,http://127.0.0.1:$((SIM_PORT + 1))" ;; # both replicas, in turn, as the proxies spread
	haproxy) echo "http://127.0.0.1:$HAP_PORT" ;;
	nginx) echo "http://127.0.0.1:$NGX_PORT" ;;
	sluice) echo "http://127.0.0.1:$API_PORT" ;;
	sluice-base) echo "http://127.0.0.1:$BASE_API_PORT" ;;
	esac
}
proxy_pids() {
	case $1 in
	direct) echo "" ;;
	haproxy) echo "$HAP_PID" ;;
	nginx) echo "$NGX_PID" $(ps -o pid= --ppid "$NGX_PID" 2>/dev/null) ;;
	sluice) echo "$SLUICE_PID" ;;
	sluice-base) echo "$BASE_PID" ;;
	esac
}
SMALL="{\"model\":\"sim-model\",\"prompt\":\"hello there\",\"max_tokens\":$WTOK,\"ignore_eos\":true}"
STREAM="{\"model\":\"sim-model\",\"prompt\":\"hello there\",\"max_tokens\":$STOK,\"ignore_eos\":true,\"stream\":true}"
export LOADLOOP_KEY=$KEY
for t in $TARGETS; do
	"$WORK/loadloop.bin" -url "$(url_of "$t")" -n 200 -c 8 -body "$SMALL" >/dev/null
	"$WORK/loadloop.bin" -url "$(url_of "$t")" -n 50 -c 8 -body "$STREAM" -stream >/dev/null
done
# measure KIND TARGET ARGS...: one loadloop run; appends
# "TARGET ok fail p50 p99 rps chunks proxy_ns sim_ns sim_work_ns sim_bytes" to
# WORK/KIND.txt (work_ns: without the simulator's sysmon thread).
measure() {
	local kind=$1 t=$2 pids c0=0 c1=0 s0 s1 w0 w1 b0 b1 out
	shift 2
	pids=$(proxy_pids "$t")
	s0=$(cpu_ns "$SIM_PID")
	w0=$(work_ns "$SIM_PID")
	b0=$(io_bytes "$SIM_PID")
	[ -n "$pids" ] && c0=$(cpu_ns $pids)
	out=$("$WORK/loadloop.bin" -url "$(url_of "$t")" "$@")
	[ -n "$pids" ] && c1=$(cpu_ns $pids)
	s1=$(cpu_ns "$SIM_PID")
	w1=$(work_ns "$SIM_PID")
	b1=$(io_bytes "$SIM_PID")
	echo "$t $out $((c1 - c0)) $((s1 - s0)) $((w1 - w0)) $((b1 - b0))" >>"$WORK/$kind.txt"
}
# light_interleaved R: the light measurement of round R for every target at
# once, request by request in turn (loadloop -names), so that each target's
# p50 and p99 come from the same minutes of the host: a block of requests
# per target meets whatever the host did in its own seconds, and p99
# differences between blocks are mostly that. Direct alternates its two
# replicas from one cycle to the next, as the proxies spread.
light_interleaved() {
	local urls="" names="" t cyc k pids line
	local -A c0
	for cyc in 0 1; do
		for ((k = 0; k < ${#TS[@]}; k++)); do
			t=${TS[(k + $1 - 1) % ${#TS[@]}]}
			if [ "$t" = direct ]; then urls="$urls,http://127.0.0.1:$((SIM_PORT + cyc))"; else urls="$urls,$(url_of "$t")"; fi
			names="$names,$t"
		done
	done
	for t in "${TS[@]}"; do
		pids=$(proxy_pids "$t")
		c0[$t]=0
		[ -n "$pids" ] && c0[$t]=$(cpu_ns $pids)
	done
	"$WORK/loadloop.bin" -url "${urls#,}" -names "${names#,}" -n $((LIGHT_N * ${#TS[@]})) -c 1 -body "$SMALL" >"$WORK/light.round"
	while read -r line; do
		t=${line%% *}
		pids=$(proxy_pids "$t")
		[ -n "$pids" ] && echo "$line $(($(cpu_ns $pids) - c0[$t])) 0 0 0" >>"$WORK/light.txt" || echo "$line 0 0 0 0" >>"$WORK/light.txt"
	done <"$WORK/light.round"
}
# Each round starts at the next target, so none is always measured first
# (after the previous target's streams, or on a replica that just idled).
read -ra TS <<<"$TARGETS"
for r in $(seq 1 "$ROUNDS"); do
	[ "${EDGE_LIGHT_BLOCKS:-0}" = 1 ] || light_interleaved "$r"
	for ((k = 0; k < ${#TS[@]}; k++)); do
		t=${TS[(k + r - 1) % ${#TS[@]}]}
		[ "${EDGE_LIGHT_BLOCKS:-0}" = 1 ] && measure light "$t" -n "$LIGHT_N" -c 1 -body "$SMALL"
		measure whole "$t" -n "$N" -c 16 -body "$SMALL"
		measure stream "$t" -n "$SN" -c 16 -body "$STREAM" -stream
		measure rate "$t" -n "$RN" -c 64 -rate "$RATE" -body "$SMALL"
	done
	log "round $r of $ROUNDS done"
done
# per KIND TARGET AWKEXPR: median over rounds of AWKEXPR (fields: $2 ok, $3
# fail, $4 p50, $5 p99, $6 rps, $7 chunks, $8 proxy ns, $9 sim ns, $10 sim
# ns without its sysmon thread, $11 bytes the sim read and wrote).
per() { awk -v t="$2" '$1 == t && $2 > 0 { printf "%.2f\n", '"$3"' }' "$WORK/$1.txt" | median; }
fails=$(cat "$WORK"/*.txt | awk '{s += $3} END {print s + 0}')
if [ "$fails" -gt 0 ]; then
	# Keep the evidence: the work dir (logs, per-round lines) and, on stderr,
	# which targets failed and the end of each Sluice log.
	EDGE_KEEP=1
	cat "$WORK"/light.txt "$WORK"/whole.txt "$WORK"/stream.txt | awk '$3 > 0 { print "edgecpu: failures:", $1, $3, "of", $2 + $3 }' >&2
	for f in "$WORK"/sluice*.log; do echo "edgecpu: tail of $f:" >&2; tail -20 "$f" >&2; done
	for p in $SLUICE_PID $BASE_PID; do kill -0 "$p" 2>/dev/null || echo "edgecpu: process $p has exited" >&2; done
fi
echo "| target | light p50 µs | light p99 µs | proxy CPU µs/req (non-streamed) | replica CPU µs/req | replica CPU µs/req at $RATE/s | — without sysmon | replica bytes/req | proxy CPU µs/chunk (streamed, $STOK tokens) | chunks/req |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for t in $TARGETS; do
	echo "| $t | $(per light "$t" '$4') | $(per light "$t" '$5') | $(per whole "$t" '$8 / 1000 / $2') | $(per whole "$t" '$9 / 1000 / $2') | $(per rate "$t" '$9 / 1000 / $2') | $(per rate "$t" '$10 / 1000 / $2') | $(per rate "$t" '$11 / $2') | $(per stream "$t" '$8 / 1000 / $7') | $(per stream "$t" '$7 / $2') |"
done
# ratio KIND TARGET REF AWKEXPR: median over rounds of TARGET's AWKEXPR ÷
# REF's in the same round (paired: both ran in one round).
ratio() {
	awk -v t="$2" -v r="$3" '$2 > 0 { v = '"$4"'; k[$1]++; if ($1 == t) a[k[$1]] = v; if ($1 == r) b[k[$1]] = v }
		END { for (i in a) if (i in b && b[i] > 0) printf "%.3f\n", a[i] / b[i] }' "$WORK/$1.txt" | median
}
# diff KIND TARGET REF AWKEXPR: the same, TARGET − REF.
delta() {
	awk -v t="$2" -v r="$3" '$2 > 0 { v = '"$4"'; k[$1]++; if ($1 == t) a[k[$1]] = v; if ($1 == r) b[k[$1]] = v }
		END { for (i in a) if (i in b) printf "%.0f\n", a[i] - b[i] }' "$WORK/$1.txt" | median
}
echo
echo "Paired per round (median over rounds): CPU ÷ HAProxy's; latency − HAProxy's; replica CPU ÷ direct (-c 16 closed loop; open loop at $RATE/s, all threads and without the simulator's sysmon)."
echo
echo "| target | CPU/req ÷ HAProxy | CPU/chunk ÷ HAProxy | light p50 − HAProxy µs | light p99 − HAProxy µs | replica CPU/req ÷ direct | at $RATE/s | — without sysmon |"
echo "|---|---|---|---|---|---|---|---|"
for t in $TARGETS; do
	[ "$t" = direct ] && continue
	echo "| $t | $(ratio whole "$t" haproxy '$8 / $2') | $(ratio stream "$t" haproxy '$8 / $7') | $(delta light "$t" haproxy '$4') | $(delta light "$t" haproxy '$5') | $(ratio whole "$t" direct '$9 / $2') | $(ratio rate "$t" direct '$9 / $2') | $(ratio rate "$t" direct '$10 / $2') |"
done
echo
echo "rounds $ROUNDS, $N non-streamed and $SN streamed requests per round and target (-c 16), $LIGHT_N at -c 1, $RN at $RATE/s; failed requests: $fails; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${EDGE_RAW:-0}" = 1 ]; then for k in light whole stream rate; do echo "## $k"; cat "$WORK/$k.txt"; done; fi
# sysstat TARGET ARGS...: one loadloop run under perf stat on the proxy's
# processes; prints "requests chunks" then perf's CSV lines.
sysstat() {
	local t=$1 pids
	shift
	pids=$(proxy_pids "$t" | tr ' ' ',')
	local ev=raw_syscalls:sys_enter,context-switches s
	for s in read readv recvfrom recvmsg write writev sendto sendmsg epoll_wait epoll_pwait futex nanosleep; do ev=$ev,syscalls:sys_enter_$s; done
	perf stat -x, -e "$ev" -p "$pids" -o "$WORK/perf.csv" -- "$WORK/loadloop.bin" -url "$(url_of "$t")" "$@" | awk '{print $1, $6}'
	grep -v '^#' "$WORK/perf.csv" | grep .
}
if [ "${EDGE_SYSCALLS:-0}" = 1 ] && command -v perf >/dev/null; then
	echo
	echo "Per request (non-streamed, -c 16) and per chunk (streamed): system calls and context switches of the proxy's processes (perf stat, one pass each)."
	echo
	echo "| target | kind | syscalls | context switches | reads | writes | epoll waits | futex | nanosleep |"
	echo "|---|---|---|---|---|---|---|---|---|"
	for t in $TARGETS; do
		[ "$t" = direct ] && continue
		for kind in whole stream; do
			if [ $kind = whole ]; then out=$(sysstat "$t" -n "$N" -c 16 -body "$SMALL"); else out=$(sysstat "$t" -n "$SN" -c 16 -body "$STREAM" -stream); fi
			echo "$out" | awk -F, -v t="$t" -v k="$kind" 'NR == 1 { split($0, a, " "); n = (k == "whole") ? a[1] : a[2]; next }
				{ v = $1; e = $3; sub(/.*sys_enter_?/, "", e); c[e] += v }
				END { if (n == 0) exit; printf "| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", t, (k == "whole" ? "per request" : "per chunk"),
					c[""] / n, c["context-switches"] / n, (c["read"] + c["readv"] + c["recvfrom"] + c["recvmsg"]) / n, (c["write"] + c["writev"] + c["sendto"] + c["sendmsg"]) / n,
					(c["epoll_wait"] + c["epoll_pwait"]) / n, c["futex"] / n, c["nanosleep"] / n }'
		done
	done
fi
