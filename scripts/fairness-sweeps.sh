#!/usr/bin/env bash
# scripts/fairness-sweeps.sh [OUT [flags...]]: the five seeded fairness
# sweeps that BENCHMARKS.md quotes, side by side in one run: 500 seeds each
# at bases 1, 501 and 1001 as drawn, 1–500 with every heavy tenant a closed
# loop (-fairgen.loops=on) and 1–500 with two instances everywhere
# (-fairgen.instances=2). Extra flags go to every sweep (for example
# -fairgen.samples=100, -fairgen.lightloops, -fairgen.onset=late). Each
# sweep's log is OUT/<name>.log (OUT defaults to a new temporary
# directory); prints the seeds holding every invariant per sweep and the
# first sweep's closing lines. About a minute on two cores as drawn.
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=${1:-$(mktemp -d /tmp/sluice-sweeps.XXXXXX)}
shift || true
mkdir -p "$OUT"
go test -c -o "$OUT/gate.test" ./scheduler/gate
run() {
	local name=$1
	shift
	"$OUT/gate.test" -test.count=1 -test.v -test.timeout=0 -test.run TestFairnessScenarios -fairgen.report -fairgen.seeds=500 "$@" >"$OUT/$name.log" 2>&1
}
run s1 -fairgen.base=1 "$@" &
run s501 -fairgen.base=501 "$@" &
run s1001 -fairgen.base=1001 "$@" &
run loops -fairgen.base=1 -fairgen.loops=on "$@" &
run two -fairgen.base=1 -fairgen.instances=2 "$@" &
wait
for f in s1 s501 s1001 loops two; do
	echo "$f: $(grep -o '[0-9]* of 500 seeds hold' "$OUT/$f.log")"
done
grep -h "draws hold\|busy beside\|part of the room the light\|seeds failing by kind\|slower together than direct" "$OUT/s1.log" | sed 's/^ *fairgen_test.go:[0-9]*: //'
echo "logs: $OUT"
