#!/usr/bin/env bash
# The GPU ring benchmark (caracal_gpu_bench) of this tree against another tree (a baseline
# checkout: `git worktree add .ab-base REV`), built alike and run interleaved on the same GPU.
# Prints each round's 64 B round trip and the 8-queue echo rate, then the medians.
#   bench/gpu/ab.sh BASELINE_TREE OUT_DIR [ROUNDS]
set -euo pipefail
base=${1:?baseline tree}
out=${2:?output directory}
rounds=${3:-3}
cd "$(dirname "$0")/../.."
source bench/lib/bench.sh
mkdir -p "$out"
for t in . "$base"; do
  release_build "$t" "$t/build-ab" "$out/build-$(basename "$t").log" "$(nproc)" -- caracal_gpu_bench
done
for r in $(seq "$rounds"); do
  for side in before after; do
    t=$([ $side = after ] && echo . || echo "$base")
    timeout 300 "$t/build-ab/bench/gpu/caracal_gpu_bench" --commit "$side" \
      --json "$out/$side-$r.json" --markdown "$out/$side-$r.md" >"$out/$side-$r.log" 2>&1
  done
done
# p50 of the ring round trip (64 B) and M msg/s of echo, batch 1, 8 queues, per round.
python3 - "$out" "$rounds" <<'PY'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def read(side, r):
    md = open(f"{out}/{side}-{r}.md").read()
    p50 = float(re.search(r"Caracal: RX ring, echo kernel, TX ring \| ([0-9.]+) us", md).group(1))
    rate = float(re.search(r"\| echo \| 1 \| 8 \| 64 \| 64 \| 8 \| ([0-9.]+) \|", md).group(1))
    return p50, rate
print("| side | round trip 64 B p50 (us), per round | median | echo 8 queues (M msg/s), per round | median |")
print("| --- | --- | --- | --- | --- |")
for side in ("before", "after"):
    v = [read(side, r) for r in range(1, rounds + 1)]
    p = [x[0] for x in v]; m = [x[1] for x in v]
    print(f"| {side} | {', '.join(map(str, p))} | {statistics.median(p)} | "
          f"{', '.join(f'{x:.3f}' for x in m)} | {statistics.median(m):.3f} |")
PY
