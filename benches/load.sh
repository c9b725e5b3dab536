#!/usr/bin/env bash
# Load benchmark: egress-gateway against Squid and tinyproxy (installed here from
# Debian when missing), a bare relay (the floor) and a direct connection, in one run
# on loopback. Prints a markdown table and the gateway's ratios. See benches/load.rs
# for what is measured.
#
#   bash benches/load.sh                     # 3 rounds, about 8 minutes
#   LOAD_ROUNDS=1 LOAD_SECONDS=3 LOAD_ONLY=gateway,direct bash benches/load.sh
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for t in squid tinyproxy wrk openssl redis-server perf; do command -v "$t" >/dev/null || missing+=("$t"); done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq squid tinyproxy wrk openssl redis-server >/dev/null
  # perf counts allocator calls per setup (uprobes); the bench says so when it cannot.
  command -v perf >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null || true
fi
# Squid and tinyproxy are started by the bench itself; stop any packaged instances.
pkill -x squid 2>/dev/null || true
pkill -x tinyproxy 2>/dev/null || true
# 5,000 idle tunnels need about 20,000 descriptors across the client and the proxy.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
exec cargo bench --bench load
