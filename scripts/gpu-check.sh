#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds everything, runs the GPU tests, the GPU tests under
# compute-sanitizer (memcheck and racecheck), the end-to-end tests with the agents on gpu:0, an
# agent whose kernel faults next to a healthy one, and the GPU benchmarks. Logs go to OUT_DIR
# (default build-gpu/out). Every GPU program runs under `timeout`, so a kernel that never stops
# cannot hang the run.
#
#   scripts/gpu-check.sh [--skip-bench] [--only-bench] [--quick]
#
# --quick: memcheck alone of the three sanitizers, no host tests and no benchmark (what fits
# one 10-minute command on the GPU machine).
#
# Tools the machine lacks (sockperf, memcached, nc) are taken from build-debs/*.deb when there
# (unpacked with dpkg -x; fetch them elsewhere with `apt-get download`).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

skip_bench=0
only_bench=0
quick=0
for a in "$@"; do
  case "$a" in
    --skip-bench) skip_bench=1 ;;
    --quick) quick=1; skip_bench=1 ;;
    --only-bench) only_bench=1 ;;
    *) echo "gpu-check.sh: unknown argument '$a'" >&2; exit 2 ;;
  esac
done

OUT_DIR=${OUT_DIR:-build-gpu/out}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT_DIR"
export PATH="/usr/local/cuda/bin:$PATH"
status=0
step() {  # step NAME COMMAND...: runs it, logs to OUT_DIR/NAME.log, remembers a failure
  local name=$1
  shift
  echo "== $name"
  local start=$SECONDS
  "$@" >"$OUT_DIR/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - start)) s"
  tail -n 15 "$OUT_DIR/$name.log"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}

nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader >"$OUT_DIR/gpu.txt" 2>&1
cat "$OUT_DIR/gpu.txt"

step configure cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo || exit 1
step build cmake --build "$BUILD" -j "$(nproc)" || exit 1

if [ -d build-debs ] && ls build-debs/*.deb >/dev/null 2>&1; then
  tools=$(mktemp -d)
  for d in build-debs/*.deb; do dpkg -x "$d" "$tools"; done
  # dpkg -x runs no maintainer scripts, so the `nc` alternative is not made.
  [ -e "$tools/bin/nc.openbsd" ] && ln -sf nc.openbsd "$tools/bin/nc"
  export PATH="$tools/usr/bin:$tools/bin:$tools/usr/sbin:$PATH"
  export LD_LIBRARY_PATH="$tools/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi

if [ "$only_bench" -eq 0 ]; then
  step gpu-tests timeout 600 ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 300
  sanitize() {  # sanitize TOOL: the accelerator tests with few messages under compute-sanitizer
    CARACAL_GPU_TEST_MESSAGES=40 timeout 900 compute-sanitizer --tool "$1" --error-exitcode 1 \
      "$BUILD/tests/accel/caracal_gpu_accel_test" --gtest_filter='-GpuDevice.*:GpuErrors.Workers*:GpuFault.*'
  }
  step memcheck sanitize memcheck
  if [ "$quick" -eq 0 ]; then
    step racecheck sanitize racecheck
    step synccheck sanitize synccheck
  fi
  step e2e-gpu env CARACAL_E2E_ACCELERATOR=gpu:0 timeout 900 \
    ctest --test-dir "$BUILD" -L e2e --output-on-failure --timeout 300
  # A handler that faults on the GPU (caracal_echo_agent --fault-after: __trap()) under load,
  # next to a healthy agent on the CPU: the agent must log the CUDA error and exit 1, the server
  # fail what was in flight to it with error replies, and the other agent serve on with no
  # error (tests/e2e/agent_stall.sh; e2e-gpu above runs its stalled and slow kernels too).
  step gpu-agent-fault env CARACAL_E2E_ACCELERATOR=gpu:0 CARACAL_STALL_CASES=fault timeout 300 \
    bash tests/e2e/agent_stall.sh "$BUILD" "$PWD"
  if [ "$quick" -eq 0 ]; then
    step host-tests timeout 900 ctest --test-dir "$BUILD" -LE 'gpu|e2e' -j 8 --timeout 300
  fi
fi
if [ "$skip_bench" -eq 0 ] && [ -x bench/gpu/run.sh ]; then
  step bench timeout 900 bench/gpu/run.sh "$BUILD" bench/results
fi
exit "$status"
