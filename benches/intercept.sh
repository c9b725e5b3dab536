#!/usr/bin/env bash
# TLS inspection benchmark: egress-gateway's inspection against mitmproxy (mitmdump,
# installed here from PyPI when missing), its own opaque tunnel and a direct connection,
# in one run on loopback. Prints a markdown table and the ratios against #21's targets.
#
#   bash benches/intercept.sh                      # 5 s per phase
#   LOAD_SECONDS=3 LOAD_CONNS=8 bash benches/intercept.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v mitmdump >/dev/null || python3 -m pip install -q mitmproxy
cargo build --release --locked
exec cargo bench --bench intercept
