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
source bench/lib/bench.sh

build="build-bench"
results=${RESULTS_DIR:-bench/results}
jobs=${JOBS:-2}

release_build . "$build" "$build/build.log" "$jobs" -DCARACAL_BUILD_BENCH=ON -- caracal_mqueue_bench ||
  exit 1

commit=$(commit_id)
note="load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
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
