#!/usr/bin/env bash
# Runs caracal_gpu_bench and writes bench/results/gpu-shm-<gpu>.{json,md}.
#   bench/gpu/run.sh BUILD_DIR RESULTS_DIR
set -euo pipefail
build=${1:?build directory}
results=${2:?results directory}
cd "$(dirname "$0")/../.."
mkdir -p "$results"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' A-Z' '-a-z')
# CARACAL_COMMIT names the commit when the tree is a copy whose .git does not (a device run).
commit=${CARACAL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
timeout 600 "$build/bench/gpu/caracal_gpu_bench" --commit "$commit" \
  --json "$results/gpu-shm-$gpu.json" --markdown "$results/gpu-shm-$gpu.md"
