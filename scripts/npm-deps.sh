#!/usr/bin/env bash
# Installs the official openai and Anthropic npm packages that test/openaie2e drives
# Sluice with: `npm ci` in test/openai-node when node_modules is missing or
# older than package-lock.json. Idempotent; does nothing when up to date.
# Needs Node.js >= 20 with npm (Debian 12's own nodejs, 18, is too old).
set -euo pipefail
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/test/openai-node"
min_major=20

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "npm-deps: node and npm are required (Node.js >= ${min_major}, e.g. from nodejs.org or NodeSource) for test/openaie2e" >&2
  exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "${major}" -lt "${min_major}" ]; then
  echo "npm-deps: node $(node --version) is too old; the openai package needs Node.js >= ${min_major}" >&2
  exit 1
fi

# npm ci writes node_modules/.package-lock.json; a lockfile newer than it
# (a pull that changed the pin) means node_modules is stale.
stamp="${dir}/node_modules/.package-lock.json"
if [ -f "${stamp}" ] && [ ! "${dir}/package-lock.json" -nt "${stamp}" ]; then
  exit 0
fi
echo "npm-deps: npm ci in test/openai-node"
if ! (cd "${dir}" && npm ci --no-audit --no-fund --loglevel=error); then
  echo "npm-deps: npm ci failed in ${dir} (is the npm registry reachable?)" >&2
  exit 1
fi
