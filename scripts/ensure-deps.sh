#!/usr/bin/env bash
# Installs what the tests need and a fresh Debian machine lacks: redis-server
# (ledger conformance against a real Redis), haproxy (bench peer), promtool
# (alert rules), chromium (the headless-browser test of the status page).
# Idempotent; does nothing when everything is present.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "ensure-deps: installing ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts the packaged services; the tests start their own on
  # loopback ports, so stop these (systemd, or sysvinit in containers).
  for svc in redis-server prometheus haproxy; do
    $sudo systemctl stop "$svc" >/dev/null 2>&1 || $sudo service "$svc" stop >/dev/null 2>&1 || true
  done
fi
