#!/usr/bin/env bash
# DNS firewall benchmark: dnsperf against egress-gateway, Unbound and dnsmasq, each
# configured for the same job (answer only gateway.sandbox.internal, NXDOMAIN for the
# rest), in one run on loopback. Prints queries per second and ratios.
#
#   bash benches/dns_bench.sh            # 10 s per measurement
#   SECONDS_PER_RUN=5 bash benches/dns_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
CLIENTS=${CLIENTS:-8}

missing=()
for t in dnsperf unbound dnsmasq; do command -v "$t" >/dev/null || missing+=("$t"); done
command -v dnsmasq >/dev/null || [ -x /usr/sbin/dnsmasq ] || true
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dnsperf unbound dnsmasq-base >/dev/null
fi
cargo build --release --quiet

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
GW_PORT=$(free_port); UB_PORT=$(free_port); DM_PORT=$(free_port)

mkdir -p "$work/policy"
cat > "$work/gateway.toml" <<TOML
[log]
format = "json"
level = "warn"
[policy]
dir = "policy"
[dns]
listen = "127.0.0.1:$GW_PORT"
hostnames = ["gateway.sandbox.internal"]
addresses = ["127.0.0.1", "::1"]
# dnsperf is one source: the per-source limit would measure the limiter, not the server.
rate_limit_qps = 0
udp_sockets = ${UDP_SOCKETS:-0}
TOML
./target/release/egress-gateway serve --config "$work/gateway.toml" --listen 127.0.0.1:0 2>"$work/gw.log" &
pids+=($!)
sed -e "s|@PORT@|$UB_PORT|g" -e "s|@DIR@|$work|g" benches/dns/unbound.conf > "$work/unbound.conf"
unbound -c "$work/unbound.conf" 2>"$work/unbound.log" &
pids+=($!)
dnsmasq --conf-file=benches/dns/dnsmasq.conf --port="$DM_PORT" --user=root --pid-file="$work/dnsmasq.pid" 2>"$work/dnsmasq.log" &
pids+=($!)
sleep 1.5

qps() { # server port mode
  dnsperf -s 127.0.0.1 -p "$1" -m "$2" -d benches/dns/queries.txt -l "$RUN" -c "$CLIENTS" -q 200 2>/dev/null \
    | awk '/Queries per second/ {print int($4)}'
}
check() { # sanity: each server answers the gateway name and blocks another
  local out; out=$(dnsperf -s 127.0.0.1 -p "$1" -d benches/dns/queries.txt -n 1 2>/dev/null)
  grep -q "NOERROR" <<<"$out" && grep -q "NXDOMAIN" <<<"$out" || { echo "server on port $1 does not do the job:"; echo "$out"; exit 1; }
}
for p in $GW_PORT $UB_PORT $DM_PORT; do check "$p"; done

printf "%-10s %14s %14s\n" server "udp qps" "tcp qps"
declare -A U T
for name in gateway unbound dnsmasq; do
  case $name in gateway) p=$GW_PORT;; unbound) p=$UB_PORT;; dnsmasq) p=$DM_PORT;; esac
  U[$name]=$(qps "$p" udp); T[$name]=$(qps "$p" tcp)
  printf "%-10s %14s %14s\n" "$name" "${U[$name]}" "${T[$name]}"
done
ratio() { python3 -c "print(f'{$1/max($2,1):.2f}')"; }
best_udp=$(( U[unbound] > U[dnsmasq] ? U[unbound] : U[dnsmasq] ))
best_tcp=$(( T[unbound] > T[dnsmasq] ? T[unbound] : T[dnsmasq] ))
echo
echo "gateway/unbound   udp $(ratio "${U[gateway]}" "${U[unbound]}")x   tcp $(ratio "${T[gateway]}" "${T[unbound]}")x"
echo "gateway/dnsmasq   udp $(ratio "${U[gateway]}" "${U[dnsmasq]}")x   tcp $(ratio "${T[gateway]}" "${T[dnsmasq]}")x"
echo "gateway/best peer udp $(ratio "${U[gateway]}" "$best_udp")x   tcp $(ratio "${T[gateway]}" "$best_tcp")x"
echo "(machine: $(nproc) cores; dnsperf -c $CLIENTS -l $RUN on loopback)"
