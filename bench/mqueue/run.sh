#!/usr/bin/env bash
# Builds caracal_mqueue_bench (Release, in build-bench/) and runs it, writing
#   bench/results/mqueue-shm-cpu-<hostname>.md    (the markdown report, also shown)
#   bench/results/mqueue-shm-cpu-<hostname>.json
#
#   bench/mqueue/run.sh                   # the full default run (about a minute)
#   bench/mqueue/run.sh --quick           # smoke run, a few seconds
#   bench/mqueue/run.sh --same-process    # any other options go to the benchmark
#
# Environment: JOBS (build parallelism, default 2), RESULTS_DIR (default bench/results),
# NOTE (free text recorded in the report, say what else the machine was doing).
# Timings are only worth keeping from a quiet machine: the load average at the start is
# recorded in the report.
set -euo pipefail
cd "$(dirname "$0")/../.."

build="build-bench"
results=${RESULTS_DIR:-bench/results}
jobs=${JOBS:-2}

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCARACAL_BUILD_TESTS=OFF -DCARACAL_BUILD_BENCH=ON >/dev/null
ninja -C "$build" -j "$jobs" caracal_mqueue_bench

commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit-dirty"
fi
load=$(cut -d' ' -f1-3 /proc/loadavg)
note="load average at start: $load"
if [ -n "${NOTE:-}" ]; then note="$NOTE; $note"; fi

host=$(hostname -s 2>/dev/null || hostname)
mkdir -p "$results"
base="$results/mqueue-shm-cpu-$host"
# Write the markdown only when the run succeeds: a failed run keeps the previous results.
tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.json"' EXIT
"$build/bench/mqueue/caracal_mqueue_bench" --json "$tmp.json" --commit "$commit" --note "$note" \
  "$@" | tee "$tmp"
mv "$tmp" "$base.md"
mv "$tmp.json" "$base.json"
chmod 644 "$base.md" "$base.json"
echo "wrote $base.md and $base.json" >&2
