#!/usr/bin/env bash
# Face verification on the GPU machine in one go. STEPS (default "e2e compare") picks, in order:
#   e2e      the end-to-end face test with the agent on gpu:0 (every verdict and error status
#            against the CPU reference, memcached stopped and killed)
#   ab       snic_server versions side by side on the face handler (bench/compare/ab.sh, Caracal
#            alone): AB_ARCHIVES ("NAME=ARCHIVE.tar ...", git archive of each version), the
#            whole list AB_ROUNDS times (2), interleaved; results in RESULTS_DIR/ab/NAME-ROUND
#   compare  bench/compare/run.sh with the face handler on Caracal, the host-centric server and
#            the CPU server side by side
#   gpus     bench/compare/gpus.sh HANDLER=face: Caracal (an agent per GPU) and the host-centric
#            server on 1 to every GPU (COUNTS), results in RESULTS_DIR/gpus
#
#   bench/compare/face_gpu.sh BUILD_DIR RESULTS_DIR [DEBS_DIR]
#
# BUILD_DIR holds a CUDA build (its binaries may come from another machine, with the shared
# libraries they need under BUILD_DIR/lib). DEBS_DIR, when the machine lacks them, holds
# memcached, libevent and netcat .debs (apt-get download memcached libevent-2.1-7
# netcat-openbsd), unpacked here with dpkg -x. The run's knobs are run.sh's; the defaults here
# are those of bench/results/face-h100x4's compare.md: 8 I/O threads each, 64 agent queues (a
# GPU queue serves one face request at a time, so 16 hold one GPU below what 8 I/O threads
# serve: bench/results/EXPERIMENTS.md, face-queues-h100x4), 32 x 16 in flight from 16 client
# threads.
set -uo pipefail
BUILD=$(realpath "${1:?usage: face_gpu.sh BUILD_DIR RESULTS_DIR [DEBS_DIR]}")
RESULTS=${2:?usage: face_gpu.sh BUILD_DIR RESULTS_DIR [DEBS_DIR]}
DEBS=${3:-}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$RESULTS"
RESULTS=$(realpath "$RESULTS")

[ -d "$BUILD/lib" ] && export LD_LIBRARY_PATH="$BUILD/lib:${LD_LIBRARY_PATH:-}"
if [ -n "$DEBS" ]; then
  tools=$(mktemp -d)
  for d in "$DEBS"/*.deb; do dpkg -x "$d" "$tools"; done
  [ -e "$tools/bin/nc.openbsd" ] && ln -sf nc.openbsd "$tools/bin/nc"
  export PATH="$tools/usr/bin:$tools/bin:$PATH"
  export LD_LIBRARY_PATH="$tools/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
command -v memcached >/dev/null || { echo "face_gpu.sh: no memcached (give DEBS_DIR)" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$RESULTS/gpu.txt"

STEPS=${STEPS:-"e2e compare"}
# The run.sh knobs of every face step.
export HANDLERS=face THREADS=${THREADS:-8} AGENT_QUEUES=${AGENT_QUEUES:-64} \
  SAT_CONNECTIONS=${SAT_CONNECTIONS:-32} LOADGEN_THREADS=${LOADGEN_THREADS:-16} \
  DURATION=${DURATION:-2} WARMUP=${WARMUP:-0.5} LOW_LOAD_ROUNDS=0 \
  FACE_PERSONS=${FACE_PERSONS:-10000} MEMCACHED_THREADS=${MEMCACHED_THREADS:-4}
status=0
for step in $STEPS; do
  case "$step" in
    e2e)
      echo "== e2e face_memcached, agent on gpu:0"
      CARACAL_E2E_ACCELERATOR=gpu:0 timeout 300 bash "$SRC/tests/e2e/face_memcached.sh" "$BUILD" \
        "$SRC" >"$RESULTS/e2e-face-gpu.txt" 2>&1 || status=1
      tail -n 25 "$RESULTS/e2e-face-gpu.txt"
      ;;
    ab)
      [ -n "${AB_ARCHIVES:-}" ] || { echo "face_gpu.sh: ab needs AB_ARCHIVES" >&2; status=1; continue; }
      for round in $(seq "${AB_ROUNDS:-2}"); do
        for spec in $AB_ARCHIVES; do
          echo "== ab: ${spec%%=*}, round $round"
          OPEN_SIZES='' timeout 300 "$SRC/bench/compare/ab.sh" "$BUILD" "$RESULTS/ab" \
            "${spec%%=*}-$round=${spec#*=}" || status=1
          grep -h "saturation" "$RESULTS/ab/${spec%%=*}-$round/compare.md" 2>/dev/null | head -4
        done
      done
      ;;
    compare)
      echo "== compare: face on caracal, host_centric, cpu"
      SERVERS=${SERVERS:-"caracal host_centric cpu"} OPEN_SIZES=${OPEN_SIZES:-4104} \
        OPEN_FRACTIONS=${OPEN_FRACTIONS:-"0.5 0.9"} CARACAL_COMMIT=${CARACAL_COMMIT:-unknown} \
        timeout 540 "$SRC/bench/compare/run.sh" "$BUILD" "$RESULTS" || status=1
      ;;
    gpus)
      echo "== gpus: face on 1 to every GPU, caracal and host_centric"
      HANDLER=face AGENT_QUEUES=${GPUS_AGENT_QUEUES:-64} \
        SAT_WINDOW=${SAT_WINDOW:-16} EXPERIMENTS=${GPUS_EXPERIMENTS:-"scaling"} \
        OPEN_FRACTIONS=${GPUS_OPEN_FRACTIONS-"0.5 0.9"} CARACAL_COMMIT=${CARACAL_COMMIT:-unknown} \
        timeout 540 "$SRC/bench/compare/gpus.sh" "$BUILD" "$RESULTS/gpus" || status=1
      ;;
    *) echo "face_gpu.sh: no step '$step' (e2e, ab, compare, gpus)" >&2; status=1 ;;
  esac
done
exit "$status"
