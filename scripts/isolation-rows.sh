#!/usr/bin/env bash
# scripts/isolation-rows.sh: the three configurations of the isolation rows
# in BENCHMARKS.md ("Isolation on shapes a user might write"), side by side
# with direct vLLM (the simulator) and HAProxy in front of the same two
# replicas, in one run.
#
# Fleet: two `sluice sim` replicas, each really running ISO_SEQS (16)
# sequences at 20 ms a step: 2 × 16 / (128 × 20 ms) = 12.5 rps. Workload:
# the flood preset's shape (three victims at 0.2× capacity = 2.5 rps each,
# one flood at 2× = 25 rps, burstiness 0.25), equal weights, with a 90 s
# client deadline so that the tenants' `queue.max_wait: 60s` is the bound.
# Configurations:
#   a  max_num_seqs correct, per-tenant concurrency = the fleet's batch (32)
#   b  max_num_seqs correct, weights only
#   c  max_num_seqs left out (256 assumed; the replicas run 16), weights only
#   x  two instances of a Redis fleet (b's config each, a redis-server of
#      its own): the victims sent to one, the flood to the other (opt-in:
#      ISO_ROWS="x")
#   haproxy  HAProxy as an operator would set it without Sluice: leastconn
#      over both replicas, `maxconn` = the batch per server (the rest waits
#      in HAProxy's FIFO queue, not vLLM's), `timeout queue` = 60 s
# Each is run without the flood (alone) and with it. Knobs: ISO_S (20)
# seconds of arrivals (the first 5 s a warm-up), ISO_SEQS, ISO_ROWS (the
# rows to run, "direct haproxy a b c"), ISO_UPSTREAM (more `upstream:` keys
# of Sluice's config, one "key: value" per line, e.g. "first_token_stop: 0"),
# ISO_SERVER (the same for `server:`, e.g. "reserve_margin: 0"),
# ISO_KEEP=1 keeps the work dir, records every request
# ($WORK/req-ROW.jsonl, with Sluice's Server-Timing) and Sluice's metrics
# after each run ($WORK/metrics-ROW.txt), ISO_TRACE=1 records the requests
# too and, every 100 ms plus the time of three scrapes (about once a second
# on a loaded machine), each replica's running and waiting and Sluice's
# learned batch, in-flight tokens, reserve ratio, batch limit and sequence
# count ($WORK/trace-ROW.tsv). Prints a Markdown table and the exact commands.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
SLUICE=$ROOT/bin/sluice
WORK=$(mktemp -d /tmp/sluice-iso.XXXXXX)
SECS=${ISO_S:-20}
SEQS=${ISO_SEQS:-16}
CAP=$(awk -v s="$SEQS" 'BEGIN { printf "%g", 2 * s / (128 * 0.02) }')

LIB_NAME=isolation LIB_KEEP_VAR=ISO_KEEP
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

go build -o "$SLUICE" ./cmd/sluice

BASE=$((21000 + ($$ % 1000) * 10))
ports_free "$BASE" 9
SIM_PORT=$BASE API_PORT=$((BASE + 4)) ADM_PORT=$((BASE + 5))

for t in chat-a chat-b chat-c flood; do
	v=KEY_$(echo "$t" | tr 'a-z-' 'A-Z_')
	export "$v=sk-iso-$t-$RANDOM$RANDOM"
done
# The admin token of the Sluice instances the script starts (the trace
# reads GET /admin/replicas).
export SLUICE_ADMIN_TOKEN=adm-iso-$RANDOM$RANDOM$RANDOM

cat >"$WORK/rows.yaml" <<'EOF'
seed: 3
defaults:
  input:  {dist: uniform, mean: 512, range_ratio: 0.25}
  output: {dist: uniform, mean: 128, range_ratio: 0.25}
  arrival: {burstiness: 1.0}
  deadline: 90s
  slo: {ttft_ms: 2000, tpot_ms: 100}
tenants:
  - {name: chat-a, api_key: "${KEY_CHAT_A}", weight: 1, rate: 0.2x}
  - {name: chat-b, api_key: "${KEY_CHAT_B}", weight: 1, rate: 0.2x}
  - {name: chat-c, api_key: "${KEY_CHAT_C}", weight: 1, rate: 0.2x}
  - {name: flood,  api_key: "${KEY_FLOOD}", role: aggressor, weight: 1, rate: 2x, arrival: {burstiness: 0.25}}
EOF

# config VARIANT: the Sluice config of row a, b or c.
config() {
	local v=$1 t k i
	echo "listen: 127.0.0.1:$API_PORT"
	echo "admin_listen: 127.0.0.1:$ADM_PORT"
	echo "gpu: {telemetry: off}"
	echo "server:"
	echo "  drain_timeout: 2s"
	[ -n "${ISO_SERVER:-}" ] && printf '%s\n' "$ISO_SERVER" | sed 's/^/  /'
	echo "upstream:"
	[ -n "${ISO_UPSTREAM:-}" ] && printf '%s\n' "$ISO_UPSTREAM" | sed 's/^/  /'
	echo "  replicas:"
	for i in 0 1; do
		if [ "$v" = c ]; then
			echo "    - {name: r$i, url: \"http://127.0.0.1:$((SIM_PORT + i))\"}"
		else
			echo "    - {name: r$i, url: \"http://127.0.0.1:$((SIM_PORT + i))\", max_num_seqs: $SEQS}"
		fi
	done
	echo "tenants:"
	for t in chat-a chat-b chat-c flood; do
		k=KEY_$(echo "$t" | tr 'a-z-' 'A-Z_')
		echo "  - name: $t"
		echo "    api_keys: [\"$(printf '%s\n' "${!k}" | "$SLUICE" key hash)\"]"
		echo "    queue: {max_depth: 4096, max_wait: 60s}"
		[ "$v" = a ] && echo "    concurrency: $((2 * SEQS))"
	done
	return 0
}

"$SLUICE" sim --listen "127.0.0.1:$SIM_PORT" --replicas 2 --max-num-seqs "$SEQS" --decode-step 20ms >"$WORK/sim.log" 2>&1 &
PIDS+=("$!")
wait_http "http://127.0.0.1:$SIM_PORT/health"
wait_http "http://127.0.0.1:$((SIM_PORT + 1))/health"

wait_idle() {
	local i m
	for i in $(seq 1 240); do
		m=0
		for p in $SIM_PORT $((SIM_PORT + 1)); do
			m=$((m + $(curl -fs "http://127.0.0.1:$p/metrics" | awk '/^vllm:num_requests_(running|waiting)[{ ]/ { s += $NF } END { print s + 0 }')))
		done
		[ "$m" = 0 ] && return 0
		sleep 0.5
	done
}

# trace: every 100 ms plus three scrapes, ms since start, then per replica
# its running and waiting (vLLM's), and Sluice's learned batch, in-flight
# tokens, the part of its pool kept free for light tenants
# (sluice_replica_reserve_ratio), batch limit and sequence count (GET
# /admin/replicas: dispatch to the replica waits while the count is at the
# limit), until killed.
trace() {
	local t0 p i m a rows
	t0=$(date +%s%3N)
	while :; do
		m=$(curl -fs -m 1 "http://127.0.0.1:$ADM_PORT/metrics" 2>/dev/null || true)
		rows=$(curl -fs -m 1 -H "Authorization: Bearer $SLUICE_ADMIN_TOKEN" "http://127.0.0.1:$ADM_PORT/admin/replicas" 2>/dev/null || true)
		printf '%s' "$(($(date +%s%3N) - t0))"
		for i in 0 1; do
			p=$((SIM_PORT + i))
			a=$(curl -fs -m 1 "http://127.0.0.1:$p/metrics" | awk '/^vllm:num_requests_running[{ ]/ { r = $NF } /^vllm:num_requests_waiting[{ ]/ { w = $NF } END { printf "%d\t%d", r, w }')
			printf '\t%s\t%s\t%s\t%s\t%s' "$a" \
				"$(printf '%s\n' "$m" | awk -v r="r$i" '$1 ~ "^sluice_replica_learned_batch" && index($1, "\"" r "\"") { print $NF }')" \
				"$(printf '%s\n' "$m" | awk -v r="r$i" '$1 ~ "^sluice_replica_inflight_tokens" && index($1, "\"" r "\"") { print $NF }')" \
				"$(printf '%s\n' "$m" | awk -v r="r$i" '$1 ~ "^sluice_replica_reserve_ratio" && index($1, "\"" r "\"") { print $NF }')" \
				"$(printf '%s\n' "$rows" | jq -r --arg r "r$i" '(if type == "array" then . else .replicas end)[]? | select(.name == $r) | "\(.batch_limit)\t\(.seqs)"' 2>/dev/null)"
		done
		echo
		sleep 0.1
	done
}

CMDS=()
# run LABEL URL ARGS...
run() {
	local label=$1 url=$2 tp=
	shift 2
	[ "${WAIT_IDLE:-1}" = 1 ] && wait_idle
	echo "isolation: $label" >&2
	if [ "${ISO_TRACE:-0}" = 1 ] || [ "${ISO_KEEP:-0}" = 1 ]; then
		set -- "$@" --save-requests "$WORK/req-$label.jsonl"
	fi
	if [ "${ISO_TRACE:-0}" = 1 ]; then
		trace >"$WORK/trace-$label.tsv" &
		tp=$!
	fi
	local args=(--workload "$WORK/rows.yaml" --capacity "$CAP" --duration "${SECS}s" --warmup-duration 5s
		--drain-timeout 65s --progress 0 --save-result --result-dir "$WORK/res" --result-filename "$label.json" "$@")
	"$SLUICE" bench run --base-url "$url" "${args[@]}" >"$WORK/$label.txt" 2>&1 || echo "isolation: $label failed" >&2
	if [ "${ISO_KEEP:-0}" = 1 ]; then
		# Only Sluice's rows have metrics there (not direct or HAProxy).
		curl -fs -m 2 "http://127.0.0.1:$ADM_PORT/metrics" >"$WORK/metrics-$label.txt" 2>/dev/null ||
			rm -f "$WORK/metrics-$label.txt"
	fi
	[ -n "$tp" ] && kill "$tp" 2>/dev/null
	CMDS+=("| $label | \`sluice bench run --base-url <$url> ${args[*]//$WORK/\$WORK}\` |")
}

direct="http://127.0.0.1:$SIM_PORT"
# Direct vLLM: the load generator spreads over one replica URL only, so
# the direct rows use one replica with both replicas' batch.
"$SLUICE" sim --listen "127.0.0.1:$((SIM_PORT + 2))" --replicas 1 --max-num-seqs $((2 * SEQS)) --decode-step 20ms >"$WORK/sim1.log" 2>&1 &
PIDS+=("$!")
wait_http "http://127.0.0.1:$((SIM_PORT + 2))/health"
direct="http://127.0.0.1:$((SIM_PORT + 2))"
ROWS=${ISO_ROWS:-direct haproxy a b c}
if [[ " $ROWS " = *" direct "* ]]; then
	run direct-alone "$direct" --exclude-tenant flood
	run direct-flooded "$direct"
fi
if [[ " $ROWS " = *" haproxy "* ]]; then
	HAP_PORT=$((BASE + 3))
	{
		printf 'global\n  maxconn 4000\n  nbthread 2\n'
		printf 'defaults\n  mode http\n  timeout connect 5s\n  timeout client 300s\n  timeout server 300s\n'
		printf '  timeout queue 60s\n  option http-keep-alive\n  http-reuse always\n'
		printf 'frontend fe\n  bind 127.0.0.1:%d\n  default_backend be\n' "$HAP_PORT"
		printf 'backend be\n  balance leastconn\n'
		for i in 0 1; do printf '  server s%d 127.0.0.1:%d maxconn %d\n' "$i" $((SIM_PORT + i)) "$SEQS"; done
	} >"$WORK/haproxy.cfg"
	haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 &
	HP=$!
	PIDS+=("$HP")
	wait_http "http://127.0.0.1:$HAP_PORT/health"
	run haproxy-alone "http://127.0.0.1:$HAP_PORT" --exclude-tenant flood
	run haproxy-flooded "http://127.0.0.1:$HAP_PORT"
	stop "$HP"
fi

ROWS_SLUICE=${ROWS//direct/}
ROWS_SLUICE=${ROWS_SLUICE//haproxy/}
if [[ " $ROWS " = *" x "* ]]; then
	ROWS_SLUICE=${ROWS_SLUICE//x/}
	RPORT=$((BASE + 6)) API2=$((BASE + 7)) ADM2=$((BASE + 8))
	redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no >"$WORK/redis.log" 2>&1 &
	PIDS+=("$!")
	for _ in $(seq 1 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
	mkdir -p "$WORK/x1" "$WORK/x2" # each instance's data_dir
	{ config b; echo "ledger: {backend: redis, redis: {addrs: [\"127.0.0.1:$RPORT\"]}}"; } >"$WORK/x1/sluice.yaml"
	{ API_PORT=$API2 ADM_PORT=$ADM2 config b; echo "ledger: {backend: redis, redis: {addrs: [\"127.0.0.1:$RPORT\"]}}"; } >"$WORK/x2/sluice.yaml"
	XP=()
	for i in 1 2; do
		"$SLUICE" serve --config "$WORK/x$i/sluice.yaml" >"$WORK/sluice-x$i.log" 2>&1 &
		XP+=("$!")
		PIDS+=("$!")
	done
	wait_http "http://127.0.0.1:$API_PORT/readyz"
	wait_http "http://127.0.0.1:$API2/readyz"
	sleep 2 # every replica scraped once
	run x-alone "http://127.0.0.1:$API2" --exclude-tenant flood
	# The flood at the first instance, the victims at the second, at once.
	wait_idle
	echo "isolation: x-flooded (flood at the first instance)" >&2
	fargs=(--workload "$WORK/rows.yaml" --capacity "$CAP" --duration "${SECS}s" --warmup-duration 5s
		--drain-timeout 65s --progress 0 --save-result --result-dir "$WORK/res" --result-filename x-flood.json --exclude-tenant chat-a,chat-b,chat-c)
	"$SLUICE" bench run --base-url "http://127.0.0.1:$API_PORT" "${fargs[@]}" >"$WORK/x-flood.txt" 2>&1 &
	FP=$!
	CMDS+=("| x-flood | \`sluice bench run --base-url <http://127.0.0.1:$API_PORT> ${fargs[*]//$WORK/\$WORK}\` (beside x-flooded) |")
	WAIT_IDLE=0 run x-flooded "http://127.0.0.1:$API2" --exclude-tenant flood
	wait "$FP" || echo "isolation: x-flood failed" >&2
	for p in "${XP[@]}"; do stop "$p"; done
fi
for v in $ROWS_SLUICE; do
	config "$v" >"$WORK/sluice-$v.yaml"
	"$SLUICE" serve --config "$WORK/sluice-$v.yaml" >"$WORK/sluice-$v.log" 2>&1 &
	SP=$!
	PIDS+=("$SP")
	wait_http "http://127.0.0.1:$API_PORT/readyz"
	sleep 2 # every replica scraped once
	run "$v-alone" "http://127.0.0.1:$API_PORT" --exclude-tenant flood
	run "$v-flooded" "http://127.0.0.1:$API_PORT"
	stop "$SP"
done

jget() { jq -r "$2" "$WORK/res/$1.json" 2>/dev/null || echo "n/a"; }
p99() { jget "$1" '[.tenants | to_entries[] | select(.key | startswith("chat-")) | .value.p99_ttft_ms] | max | . * 10 | round / 10'; }
lost() { jget "$1" '[.tenants | to_entries[] | select(.key | startswith("chat-")) | .value.outcomes | to_entries[] | select(.key != "success" and .key != "late") | .value | to_entries[] | .value] | add // 0'; }
share504() { # the flood's requests answered 504 deadline_exceeded, % of its requests
	jget "$1" '[.tenants.flood.outcomes[] | to_entries[]] | ((map(select(.key == "deadline_exceeded") | .value) | add // 0) * 1000 / (map(.value) | add) | round / 10)'
}
echo "| target | victims' worst p99 TTFT alone (ms) | flooded (ms) | flooded ÷ alone | victim requests lost | flood answered 504 (%) |"
echo "|---|---|---|---|---|---|"
for r in $ROWS; do
	a=$(p99 "$r-alone")
	f=$(p99 "$r-flooded")
	fl=$r-flooded
	[ "$r" = x ] && fl=x-flood
	echo "| $r | $a | $f | $(awk -v a="$a" -v b="$f" 'BEGIN { if (a + 0 > 0) printf "%.2f", b / a; else print "n/a" }') | $(lost "$r-flooded") | $(share504 "$fl") |"
done
echo
echo "| run | command |"
echo "|---|---|"
printf '%s\n' "${CMDS[@]}"
[ "${ISO_KEEP:-0}" = 1 ] && echo "work dir: $WORK" >&2
exit 0
