#!/usr/bin/env bash
# scripts/durable-cost.sh: what the durable default costs a client, side by
# side in one run: the simulator directly, `sluice serve` on the defaults
# (data_dir = the config's directory: the embedded ledger journaled, the
# pending-writes log), and the same config with `data_dir: ""` (memory
# only). Rounds interleave the three targets. Knobs: DUR_STEP (20ms) the
# simulator's decode step, DUR_MAX_TOKENS (16), DUR_N (400) requests and
# DUR_C (16) workers per run, DUR_ROUNDS (3), DUR_KEEP=1 keeps the work dir.
# Prints one line per run: round target ok failed p50_us p99_us rps.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d /tmp/sluice-durable.XXXXXX)
LIB_NAME=durable-cost LIB_KEEP_VAR=DUR_KEEP
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

STEP=${DUR_STEP:-20ms} MT=${DUR_MAX_TOKENS:-16} N=${DUR_N:-400} C=${DUR_C:-16} ROUNDS=${DUR_ROUNDS:-3}
go build -o "$WORK/sluice" ./cmd/sluice
go build -o "$WORK/loadloop" ./scripts/loadloop

BASE=$((23000 + ($$ % 1000) * 5))
ports_free "$BASE" 5
SIM=$BASE
KEY=sk-durable-$RANDOM$RANDOM
HASH=$(printf '%s\n' "$KEY" | "$WORK/sluice" key hash)

"$WORK/sluice" sim --listen "127.0.0.1:$SIM" --replicas 1 --max-num-seqs 64 --decode-step "$STEP" >"$WORK/sim.log" 2>&1 &
PIDS+=("$!")
wait_http "http://127.0.0.1:$SIM/health"

# serve NAME PORT EXTRA: a node whose config (and so its data_dir) is WORK/NAME.
serve() {
	mkdir -p "$WORK/$1"
	{
		echo "listen: 127.0.0.1:$2"
		echo "admin_listen: 127.0.0.1:$(($2 + 1))"
		echo "gpu: {telemetry: off}"
		[ -n "$3" ] && echo "$3"
		echo "upstream:"
		echo "  replicas:"
		echo "    - {name: r0, url: \"http://127.0.0.1:$SIM\", max_num_seqs: 64}"
		echo "tenants:"
		echo "  - name: t"
		echo "    api_keys: [\"$HASH\"]"
	} >"$WORK/$1/sluice.yaml"
	"$WORK/sluice" serve --config "$WORK/$1/sluice.yaml" >"$WORK/$1.log" 2>&1 &
	PIDS+=("$!")
	wait_http "http://127.0.0.1:$2/readyz"
}
serve durable $((BASE + 1)) ""
serve memory $((BASE + 3)) 'data_dir: ""'
[ -s "$WORK/durable/journal" ] || [ -e "$WORK/durable/journal" ] || echo "durable-cost: no journal in $WORK/durable" >&2

declare -A URL=([direct]="http://127.0.0.1:$SIM" [durable]="http://127.0.0.1:$((BASE + 1))" [memory]="http://127.0.0.1:$((BASE + 3))")
BODY="{\"model\":\"sim-model\",\"prompt\":\"hello there\",\"max_tokens\":$MT,\"ignore_eos\":true}"
export LOADLOOP_KEY=$KEY
for t in direct durable memory; do "$WORK/loadloop" -url "${URL[$t]}" -n 100 -c 8 -body "$BODY" >/dev/null; done
for r in $(seq 1 "$ROUNDS"); do
	for t in direct durable memory; do
		echo "$r $t $("$WORK/loadloop" -url "${URL[$t]}" -n "$N" -c "$C" -body "$BODY")"
	done
done
