#!/usr/bin/env bash
# Runs caracal_gpu_bench and writes bench/results/gpu-shm-<gpu>.{json,md}.
#   bench/gpu/run.sh BUILD_DIR RESULTS_DIR
set -euo pipefail
build=${1:?build directory}
results=${2:?results directory}
cd "$(dirname "$0")/../.."
source bench/lib/bench.sh
mkdir -p "$results"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' A-Z' '-a-z')
timeout 600 "$build/bench/gpu/caracal_gpu_bench" --commit "$(commit_id)" \
  --json "$results/gpu-shm-$gpu.json" --markdown "$results/gpu-shm-$gpu.md"
