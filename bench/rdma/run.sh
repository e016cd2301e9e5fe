#!/usr/bin/env bash
# Builds caracal_rdma_bench (Release, in build-bench/) and runs it inside the Soft-RoCE VM
# (tests/vm/rxe-vm.sh) together with perftest's ib_write_lat and ib_read_lat, writing
#   bench/results/mqueue-rdma-softroce-<hostname>.md    (the markdown report, also shown)
#   bench/results/mqueue-rdma-softroce-<hostname>.json
#
#   bench/rdma/run.sh                      # default: 200 warm-up + 3000 measured, 64 and 1024 B
#   bench/rdma/run.sh --iterations 500     # any options go to caracal_rdma_bench
#
# Environment: JOBS (build parallelism, default 2), RESULTS_DIR (default bench/results), NOTE
# (free text for the report: what else the machine was doing). The VM is emulated (QEMU TCG):
# absolute numbers say little about hardware; the ratios to perftest in the same VM are the point.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/lib/bench.sh

build="build-bench"
results=${RESULTS_DIR:-bench/results}
jobs=${JOBS:-2}

scripts/deps.sh test
release_build . "$build" "$build/build.log" "$jobs" -DCARACAL_WITH_CUDA=OFF -DCARACAL_BUILD_BENCH=ON \
  -- caracal_rdma_bench || exit 1

commit=$(commit_id)
host=$(hostname -s 2>/dev/null || hostname)
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
load=$(cut -d' ' -f1-3 /proc/loadavg)
headers=(
  "host $host: $(cpu_model), $(nproc) CPUs, $(uname -sr); load average at start: $load"
  "date $date, commit $commit"
)
[ -n "${NOTE:-}" ] && headers+=("note: $NOTE")

cmd="./caracal_rdma_bench --ip \"\$RXE_IP\" --device \"\$RXE_DEV\" --gid-index \"\$RXE_GID_IDX\""
cmd+=" --json /tmp/r.json --md /tmp/r.md"
for h in "${headers[@]}"; do cmd+=" --header $(printf %q "$h")"; done
cmd+=" --header \"VM: QEMU TCG (emulated), \$(nproc) vCPUs, guest kernel \$(uname -r), Soft-RoCE rxe0 on a dummy netdev\""
for a in "$@"; do cmd+=" $(printf %q "$a")"; done
cmd+="; rc=\$?; echo CARACAL_JSON_BEGIN; cat /tmp/r.json; echo CARACAL_JSON_END"
cmd+="; echo CARACAL_MD_BEGIN; cat /tmp/r.md; echo CARACAL_MD_END; exit \$rc"

mkdir -p "$results"
base="$results/mqueue-rdma-softroce-$host"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
set +e
tests/vm/rxe-vm.sh -t 900 -f "$build/bench/rdma/caracal_rdma_bench" -- "$cmd" >"$tmp"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  cat "$tmp" >&2
  echo "bench/rdma/run.sh: the VM run failed (exit $rc); previous results kept" >&2
  exit $rc
fi
# Written only when the run succeeds.
sed -n '/^CARACAL_JSON_BEGIN$/,/^CARACAL_JSON_END$/{//!p}' "$tmp" >"$base.json"
sed -n '/^CARACAL_MD_BEGIN$/,/^CARACAL_MD_END$/{//!p}' "$tmp" >"$base.md"
chmod 644 "$base.md" "$base.json"
cat "$base.md"
echo "wrote $base.md and $base.json" >&2
