#!/usr/bin/env bash
# Builds Caracal and runs its main job. Until the network server lands, that is the mqueue
# benchmark: the shm transport carrying requests from a SmartNIC-side process to the CPU
# accelerator in another process and back, with latency percentiles and throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target caracal_mqueue_bench
exec build/bench/mqueue/caracal_mqueue_bench "$@"
