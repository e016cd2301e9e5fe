#!/usr/bin/env bash
# threads.sh for this tree's snic_server against another tree's (a baseline checkout:
# `git worktree add .ab-base REV`, or `git archive REV | tar -x -C DIR`), built alike in one
# session: this tree's benchmarks and server in BUILD_DIR, the baseline's server alone in
# BASE_TREE/build-ab. The results of both go to RESULTS_DIR (threads.md, threads.json, plots).
#   bench/compare/threads_ab.sh BASE_TREE BUILD_DIR RESULTS_DIR [NAME...]
# The baseline runs as `old`, this tree as `new`, and as each NAME too: a version that differs
# by threads.sh's per-version knobs alone (GPU_OPTIONS_NAME, SPREAD_NAME, SIZES_NAME). The other
# knobs of threads.sh pass through (SIZES_old gives the baseline fewer sizes).
set -uo pipefail
base=$(realpath "${1:?usage: threads_ab.sh BASE_TREE BUILD_DIR RESULTS_DIR}")
build=${2:?usage: threads_ab.sh BASE_TREE BUILD_DIR RESULTS_DIR}
results=${3:?usage: threads_ab.sh BASE_TREE BUILD_DIR RESULTS_DIR}
shift 3
src=$(cd "$(dirname "$0")/../.." && pwd)
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$results"
jobs=$(nproc)
source "$src/bench/compare/lib.sh"  # release_build
# Both builds at once, each with half the cores.
release_build "$base" "$base/build-ab" "$results/build-old.log" $((jobs / 2 + 1)) \
  -DCARACAL_BUILD_BENCH=OFF -- snic_server &
old_build=$!
release_build "$src" "$build" "$results/build-new.log" $((jobs / 2 + 1)) -- snic_server \
  caracal_loadgen caracal_cpu_server caracal_echo_agent caracal_matvec_agent || exit 2
wait "$old_build" || exit 2
"$src/bench/compare/threads.sh" "$build" "$results" \
  old="$base/build-ab/snic_server/snic_server" new="$build/snic_server/snic_server" \
  "${@/%/=$build/snic_server/snic_server}"
