#!/usr/bin/env bash
# Captures the FCALLs of a TestPairCPU run (MONITOR) and the library's code,
# then profiles that code line by line in lua5.1 (luaprof.lua; apt-get
# install lua5.1). Usage: testdata/luaprof.sh <test binary> [prof|calls|mem|check] [lines]
#   env: SLUICE_G callers (default 64), SLUICE_GLOBAL=1, N pairs (default 800),
#        KEEP=dir keeps the capture (lib.lua, calls.lua) there.
set -euo pipefail
bin=$(realpath "$1"); shift
here=$(cd "$(dirname "$0")/.." && pwd)
d=${KEEP:-$(mktemp -d)}; mkdir -p "$d"
port=$((20000 + RANDOM % 20000))
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$d" >/dev/null &
rp=$!
trap 'kill $rp 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$d"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$port" monitor >"$d/monitor.txt" &
mp=$!
(cd "$here" && SLUICE_REDIS_ADDR=127.0.0.1:$port SLUICE_PAIRCPU=${N:-800} SLUICE_G=${SLUICE_G:-64} \
  "$bin" -test.run '^TestPairCPU$' >/dev/null)
kill $mp
redis-cli -p "$port" --raw function list withcode | awk 'f {print} /^library_code$/ {f=1}' >"$d/lib.lua"
python3 - "$d/monitor.txt" "$d/calls.lua" <<'PY'
import ast, re, sys
tok = re.compile(r'"((?:[^"\\]|\\.)*)"')
def q(b): return '"' + ''.join('\\%03d' % c if c < 32 or c > 126 or c in (34, 92) else chr(c) for c in b) + '"'
out = ['return {']
for line in open(sys.argv[1], errors='replace'):
    if '"fcall"' not in line.lower(): continue
    p = [ast.literal_eval('b"%s"' % t) for t in tok.findall(line)]
    nk = int(p[2])
    out.append('{keys={%s},args={%s}},' % (','.join(map(q, p[3:3 + nk])), ','.join(map(q, p[3 + nk:]))))
out.append('}')
open(sys.argv[2], 'w').write('\n'.join(out))
PY
lua5.1 "$here/testdata/luaprof.lua" "$d/lib.lua" "$d/calls.lua" "$@"
