#!/usr/bin/env bash
# Experiment: snic_server built with tunables::kLocalInFlight at several values, side by side
# in one threads.sh run. BASE_TREE is a source tree; each variant is a copy of it with the
# constant changed, built alike; loadgen and agents from BUILD_DIR (built from this tree).
#   bench/compare/local_inflight_ab.sh BASE_TREE BUILD_DIR RESULTS_DIR NAME=VALUE...
set -uo pipefail
base=$(realpath "${1:?}"); build=${2:?}; results=${3:?}; shift 3
src=$(cd "$(dirname "$0")/../.." && pwd)
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$results"
source "$src/bench/compare/lib.sh"
release_build "$src" "$build" "$results/build-tools.log" "$(nproc)" -- caracal_loadgen \
  caracal_cpu_server caracal_echo_agent caracal_matvec_agent snic_server || exit 2
versions=()
for nv in "$@"; do
  name=${nv%%=*}; value=${nv#*=}
  tree=/tmp/variant-$name
  rm -rf "$tree"; cp -r "$base" "$tree"; rm -rf "$tree/build-ab"
  sed -i -E "s/(kLocalInFlight = )[0-9]+;/\1$value;/" "$tree/server/include/caracal/server/tunables.hpp"
  grep -q "kLocalInFlight = $value;" "$tree/server/include/caracal/server/tunables.hpp" || exit 3
  release_build "$tree" "$tree/build-ab" "$results/build-$name.log" "$(nproc)" \
    -DCARACAL_BUILD_BENCH=OFF -- snic_server || exit 2
  versions+=("$name=$tree/build-ab/server/snic_server")
done
"$src/bench/compare/threads.sh" "$build" "$results" "${versions[@]}"
