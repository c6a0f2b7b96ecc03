#!/usr/bin/env bash
# scripts/shared-replica.sh: two `sluice serve` instances in front of one
# `sluice sim` replica (SCHEDULING §7, "The batch between scrapes"). Each
# instance gets its own `sluice bench run` at SHARED_RATE requests/s (64
# output tokens, 3 ms steps, 16 sequences: about 80 requests/s fill the
# replica), while the sim's vllm:num_requests_waiting is sampled every 20 ms.
# Waiting inside vLLM is work that Sluice's queue no longer orders, sheds or
# expires. Usage:
#   scripts/shared-replica.sh BIN [TAG]      (BIN: a sluice binary)
# Knobs: SHARED_RATE (42 per instance), SHARED_DURATION (15s), SHARED_PORT
# (18300; uses the next 20 ports), SHARED_KEEP=1 (keep the work directory),
# SHARED_REDIS=1 (both instances on one Redis ledger, a redis-server on
# SHARED_PORT+19: a fleet, whose instances split the replica, SCHEDULING §9).
# Prints the sim's waiting (mean, max, share of samples above 0) and each
# instance's summary line.
set -euo pipefail

BIN=$1 TAG=${2:-run}
RATE=${SHARED_RATE:-42} DUR=${SHARED_DURATION:-15s} SIM=${SHARED_PORT:-18300}
W=$(mktemp -d)
KEY=sk-shared-replica-0123456789
PIDS=()
cleanup() {
	kill "${PIDS[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
	[ "${SHARED_KEEP:-}" = 1 ] && echo "kept $W" >&2 || rm -rf "$W"
}
trap cleanup EXIT
wait_http() { for _ in $(seq 100); do curl -fs "$1" >/dev/null && return 0; sleep 0.1; done; echo "no answer from $1" >&2; return 1; }

"$BIN" sim --listen "127.0.0.1:$SIM" --max-num-seqs 16 --decode-step 3ms --seed 7 >"$W/sim.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$SIM/health"
HASH=$(printf '%s\n' "$KEY" | "$BIN" key hash)
LEDGER=""
if [ "${SHARED_REDIS:-}" = 1 ]; then
	redis-server --port $((SIM + 19)) --bind 127.0.0.1 --save "" --appendonly no --dir "$W" --logfile "$W/redis.log" &
	PIDS+=($!)
	for _ in $(seq 100); do redis-cli -p $((SIM + 19)) ping >/dev/null 2>&1 && break; sleep 0.1; done
	LEDGER="ledger: {backend: redis, redis: {addrs: [\"127.0.0.1:$((SIM + 19))\"]}}"
fi
for i in 1 2; do
	# A directory per instance: its data_dir (the config's directory) is its own.
	mkdir -p "$W/s$i"
	cat >"$W/s$i/sluice.yaml" <<YAML
listen: 127.0.0.1:$((SIM + i))
admin_listen: 127.0.0.1:$((SIM + 10 + i))
gpu: {telemetry: off}
server: {drain_timeout: 5s}
$LEDGER
upstream:
  scrape_interval: 200ms
  replicas:
    - {name: r0, url: "http://127.0.0.1:$SIM", max_num_seqs: 16}
tenants:
  - name: t$i
    api_keys: ["$HASH"]
YAML
	"$BIN" serve --config "$W/s$i/sluice.yaml" >"$W/s$i.log" 2>&1 &
	PIDS+=($!)
done
for i in 1 2; do wait_http "http://127.0.0.1:$((SIM + i))/readyz"; done
sleep 1.5 # both instances have scraped the replica

(while :; do
	curl -fs "http://127.0.0.1:$SIM/metrics" | awk '/^vllm:num_requests_waiting[{ ]/ { print $NF }'
	sleep 0.02
done) >"$W/waiting.txt" 2>/dev/null &
SAMPLER=$!
PIDS+=("$SAMPLER")
BENCH=()
for i in 1 2; do
	OPENAI_API_KEY=$KEY "$BIN" bench run --base-url "http://127.0.0.1:$((SIM + i))" --request-rate "$RATE" \
		--duration "$DUR" --warmup-duration 2s --random-input-len 256 --random-output-len 64 --seed "$i" \
		--progress 0 >"$W/b$i.txt" 2>&1 &
	BENCH+=($!)
done
wait "${BENCH[@]}"
kill "$SAMPLER"

awk -v tag="$TAG" '{ n++; s += $1; if ($1 > m) m = $1; if ($1 > 0) z++ }
	END { printf "%s vLLM waiting: mean %.2f max %d above 0 in %.1f%% of %d samples\n", tag, s / n, m, 100 * z / n, n }' "$W/waiting.txt"
for i in 1 2; do
	grep -E "Successful requests|Failed requests|Request throughput|Median TTFT|P99 TTFT" "$W/b$i.txt" |
		tr -s ' ' | paste -sd'|' | sed "s/^/$TAG instance $i: /"
done
