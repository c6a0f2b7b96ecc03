# shellcheck shell=bash
# scripts/lib.sh: the process, port and statistics helpers that bench.sh and
# edgecpu.sh share. Source it after setting LIB_NAME (the message prefix),
# WORK (the work directory) and LIB_KEEP_VAR (the name of the variable
# that, set to 1 by the time the script exits, keeps WORK). Every
# process a script starts goes into PIDS and is stopped on exit, failure and
# Ctrl-C.

PIDS=()
cleanup() {
	local rc=$? p
	set +e
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
	if [ "${!LIB_KEEP_VAR:-0}" = 1 ]; then echo "$LIB_NAME: work dir kept: $WORK" >&2; else rm -rf "$WORK"; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# stop PID: ends one process this script started and forgets it.
stop() {
	local p=$1 keep=() q
	kill "$p" 2>/dev/null || true
	wait "$p" 2>/dev/null || true
	for q in "${PIDS[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
	PIDS=("${keep[@]}")
}

# wait_http URL: until it answers 200 (10 s).
wait_http() {
	local i
	for i in $(seq 1 200); do
		if curl -fs -o /dev/null "$1"; then return 0; fi
		sleep 0.05
	done
	echo "$LIB_NAME: $1 never became ready" >&2
	return 1
}

# ports_free BASE N: exits unless the N ports from BASE are all free.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
ports_free() {
	local i
	for i in $(seq 0 $(($2 - 1))); do
		port_free $(($1 + i)) || { echo "$LIB_NAME: port $(($1 + i)) busy" >&2; exit 1; }
	done
}

# median: of the numbers on stdin, one per line ("n/a" for none).
median() { sort -g | awk '{v[NR]=$1} END {if (NR == 0) print "n/a"; else if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
