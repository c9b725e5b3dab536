#!/usr/bin/env bash
# Runs every fuzz target (or those named) for SECONDS_PER_TARGET seconds (default 600),
# two at a time, with the committed corpus as seed; new inputs and crashes land in
# fuzz/corpus/<target>/ and fuzz/artifacts/<target>/. JOBS (default 2) sets how many
# targets run at once. Needs the nightly toolchain and
# cargo-fuzz (cargo install cargo-fuzz).
#
#   bash fuzz/run.sh                       # all targets, 10 minutes each
#   SECONDS_PER_TARGET=60 bash fuzz/run.sh authority git_route
set -euo pipefail
cd "$(dirname "$0")"
T=${SECONDS_PER_TARGET:-600}
JOBS=${JOBS:-2}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
cargo +nightly fuzz build >/dev/null
run() {
  local t=$1
  cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$T" -print_final_stats=1 2>"logs/$t.log" || true
  local execs; execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "logs/$t.log" | grep -o '[0-9]*$' || echo '?')
  local crash; crash=$(ls "artifacts/$t" 2>/dev/null | wc -l)
  echo "$t: $execs execs in ${T}s, $crash crash artifacts"
}
mkdir -p logs
for ((i = 0; i < ${#targets[@]}; i += JOBS)); do
  for ((j = i; j < i + JOBS && j < ${#targets[@]}; j++)); do
    run "${targets[$j]}" &
  done
  wait
done
