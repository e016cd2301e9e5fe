#!/usr/bin/env bash
# The io_threads run with both UDP spreads, in one call on a GPU machine: builds this tree
# (Release, with and without the engine's stage timers), runs threads.sh with the same
# snic_server as two versions, `flows` and `datagrams` (SPREAD_NAME), taking turns at each
# I/O thread count, then engine_profile.sh at PROFILE_THREADS for matvec 1 KiB over UDP and TCP.
#
#   bench/compare/spread_threads.sh RESULTS_DIR
#
# Knobs (environment): BUILD_DIR (build-spread), PROFILE_THREADS ("8 16"; empty: no profile),
# PROFILE_SPREAD (datagrams); the rest pass through to threads.sh (IO_THREADS, PIN,
# AGENT_QUEUES, SAT_CONNECTIONS, SAT_WINDOW, LOADGEN_THREADS, CARACAL_ACCEL ...).
set -uo pipefail
results=${1:?usage: spread_threads.sh RESULTS_DIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-build-spread}
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$results"
results=$(realpath "$results")
jobs=$(nproc)
lscpu >"$results/lscpu.txt" 2>&1 || true
nvidia-smi -L >"$results/gpu.txt" 2>&1 || true
git -C "$src" rev-parse HEAD >"$results/commit.txt" 2>/dev/null || true

source "$src/bench/compare/lib.sh"  # release_build
profile=${PROFILE_THREADS-"8 16"}
if [ -n "$profile" ]; then
  release_build "$src" "$build-profile" "$results/build-profile.log" $((jobs / 2 + 1)) \
    -DCARACAL_BUILD_BENCH=OFF -DCARACAL_ENGINE_PROFILE=ON -- snic_server &
  profile_build=$!
fi
release_build "$src" "$build" "$results/build.log" $((jobs / 2 + 1)) -- snic_server \
  caracal_loadgen caracal_cpu_server caracal_echo_agent caracal_matvec_agent || exit 2

snic=$(realpath "$build/snic_server/snic_server")
SPREAD_flows=flows SPREAD_datagrams=datagrams \
  "$src/bench/compare/threads.sh" "$build" "$results/threads" flows="$snic" datagrams="$snic"
failed=$?

if [ -n "$profile" ]; then
  wait "$profile_build" || exit 2
  for n in $profile; do
    SNIC="$build-profile/snic_server/snic_server" THREADS=$n SPREAD=${PROFILE_SPREAD:-datagrams} \
      LOADGEN_THREADS=${LOADGEN_THREADS:-16} SAT_CONNECTIONS=${SAT_CONNECTIONS:-16} \
      AGENT_QUEUES=${AGENT_QUEUES:-16} POINTS="matvec:udp:1024 matvec:tcp:1024" \
      "$src/bench/compare/engine_profile.sh" "$build" "$results/profile-t$n" ||
      failed=$((failed + 1))
  done
fi
exit "$failed"
