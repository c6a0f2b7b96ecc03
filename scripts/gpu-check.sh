#!/usr/bin/env bash
# gpu-check: on a node with an NVIDIA driver, show that Sluice reads its
# GPUs: the inventory (`sluice gpus --json`), then NVML telemetry for
# GPU_CHECK_DURATION (default 30s: utilisation, memory, power, energy and
# busy-time deltas, health transitions; `sluice gpus --watch`). Exits
# non-zero, saying so, when NVML cannot be read.
#
# Nothing is downloaded: the binary is built from the module cache only
# (GOPROXY=off; cgo, which go-nvml needs), or taken from SLUICE_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${GPU_CHECK_DURATION:-30s}
interval=${GPU_CHECK_INTERVAL:-1s}
bin=${SLUICE_BIN:-}
if [ -z "$bin" ]; then
	bin=bin/sluice
	echo "gpu-check: building $bin (cgo, offline)" >&2
	CGO_ENABLED=1 GOPROXY=off GOFLAGS=-mod=readonly go build -o "$bin" ./cmd/sluice
fi

fail() {
	echo "gpu-check: FAIL: $1 (exit $2)" >&2
	exit "$2"
}

echo "== inventory: sluice gpus --json"
"$bin" gpus --json || fail "NVML cannot be read" $?
echo "== NVML telemetry for $duration: sluice gpus --watch $duration --interval $interval"
"$bin" gpus --watch "$duration" --interval "$interval" || fail "NVML telemetry cannot be read" $?
echo "gpu-check: OK"
