#!/usr/bin/env bash
# Physical reference for the Redis ledger benchmarks: the EVALSHA ceiling of
# this machine for a trivial script and for the real reserve script (server
# side only, no Go client), 64 connections, 5 runs each, median printed.
# Usage: ledger/redisledger/testdata/ceiling.sh [port]   (needs redis-server,
# redis-cli, redis-benchmark; starts and stops its own server)
set -euo pipefail
port=${1:-6397}
dir=$(mktemp -d)
here=$(cd "$(dirname "$0")/.." && pwd)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
  --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
run() { # name n sha numkeys args...
  local name=$1 n=$2; shift 2
  for _ in 1 2 3 4 5; do
    redis-benchmark -p "$port" -n "$n" -r 100000000 -c 64 -q EVALSHA "$@" |
      tr '\r' '\n' | grep 'requests per second' | tail -1 | sed 's/.*: \([0-9.]*\) requests.*/\1/'
  done | median | xargs printf '%-40s median %s scripts/s\n' "$name"
}

trivial=$(redis-cli -p "$port" script load "return 1")
# The header line scripts.go generates (ledger.NumDims, ledger.Slots).
reserve=$(redis-cli -p "$port" script load "$(printf '#!lua\nlocal NDIMS, SLOTS = 8, 6\n'; cat "$here/lua/prelude.lua"; echo; cat "$here/lua/reserve.lua")")
spec='1T/3:3600:1125899906842624:b,0:60:1125899906842624:b,6:0:1048576:b;2K/3:86400:1125899906842624:b'
run 'EVALSHA "return 1"' 100000 "$trivial" 0
run 'EVALSHA reserve.lua (2 scopes, dispatch)' 20000 "$reserve" 6 \
  'sluice:{T}:m' 'sluice:{T}:L' 'sluice:{T}:U' 'sluice:{T}:q:__rand_int__' 'sluice:{T}:s:T' 'sluice:{T}:s:K' \
  '' cand 120000 __rand_int__ 3600000 0 o d 60000 1 '1,512,0,512,0,0,0,0' "$spec" '' 0 0 0
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
