#!/usr/bin/env bash
# redis-server instructions per Reserve+Settle pair, counted by callgrind, so
# the figure does not depend on what else the machine runs (wall time and
# CPU time on a shared machine vary by ±30% run to run). Runs TestPairCPU
# of a compiled test binary twice (N1 and N2 pairs) against a redis-server
# under valgrind and prints (Ir(N2) - Ir(N1)) / (N2 - N1).
# Usage: testdata/pairinstr.sh <test binary> [test flags, e.g. -maxbatch=1]
#   env: SLUICE_G callers (default 64), SLUICE_GLOBAL=1 adds a global scope,
#        N1, N2 (default 800, 2400), REDIS_SERVER (default redis-server from
#        PATH; Debian's is stripped: see docs/benchmarks/ledger-redis.md,
#        round 9, for a build whose profile names Lua's functions), KEEP=dir
#        keeps the second run's callgrind output there. Build the binary with
#        go test -c -o /tmp/rl.test ./ledger/redisledger/
set -euo pipefail
bin=$(realpath "$1"); shift
here=$(cd "$(dirname "$0")/.." && pwd)
run() { # n [test flags] -> Ir
  local n=$1 port=$((20000 + RANDOM % 20000)) d; shift; d=$(mktemp -d)
  valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" "${REDIS_SERVER:-redis-server}" --port "$port" --bind 127.0.0.1 \
    --save "" --appendonly no --dir "$d" >/dev/null 2>"$d/vg.log" &
  local vp=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  (cd "$here" && SLUICE_REDIS_ADDR=127.0.0.1:$port SLUICE_PAIRCPU=$n SLUICE_G=${SLUICE_G:-64} \
    "$bin" -test.run '^TestPairCPU$' "$@" >/dev/null)
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait $vp || true
  grep -m1 '^summary:' "$d/cg.out" | awk '{print $2}'
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$d/cg.out" "$KEEP/cg.$n.out"; fi
  rm -rf "$d"
}
n1=${N1:-800} n2=${N2:-2400}
a=$(run "$n1" "$@"); b=$(run "$n2" "$@")
echo "instructions/pair $(( (b - a) / (n2 - n1) ))"
