#!/usr/bin/env bash
# Run on the GPU machine from the tree's root (the device tool's $OUT collects the logs): the
# agent's own sizing as it now stands (an eighth of the SMs as queues, rings of at most 128 KiB)
# against bench/compare's fixed 8 queues of 512 slots, face at bench/compare's defaults
# otherwise, three rounds in turn, the host-centric server in every round of the first.
set -u
export PATH=/usr/local/cuda/bin:$PATH
S=$SECONDS
mkdir -p /tmp/debs && for d in build-debs/*.deb; do dpkg -x "$d" /tmp/debs; done
export PATH=/tmp/debs/usr/bin:/tmp/debs/bin:$PATH
export LD_LIBRARY_PATH=/tmp/debs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCARACAL_BUILD_TESTS=OFF \
  -DCARACAL_BUILD_BENCH=ON >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
ninja -C build-gpu >"$OUT/build.log" 2>&1 || { grep -B2 -A10 "error" "$OUT/build.log" | head -60; exit 1; }
echo "built at $((SECONDS - S)) s"

run() { # NAME SERVERS ENV...
  local n=$1 servers=$2
  shift 2
  mkdir -p "/tmp/$n"
  env "$@" HANDLERS=face SERVERS="$servers" CARACAL_COMMIT="${COMMIT:-local}" timeout 200 \
    bench/compare/run.sh compare build-gpu "/tmp/$n" >"$OUT/$n.log" 2>&1
  echo "$n rc $?: $(grep -h "service 'face':.*queue" /tmp/"$n"/raw/caracal-face-agent.log | head -1)"
  cp "/tmp/$n/compare.md" "$OUT/$n.md" 2>/dev/null
  cp "/tmp/$n/compare.json" "$OUT/$n.json" 2>/dev/null
  grep "saturation:" "$OUT/$n.log" | sed 's/; sent.*//'
}
for r in 1 2 3; do
  run "auto-r$r" "caracal host_centric" AGENT_QUEUES=auto AGENT_RING_CAPACITY=auto
  run "q8-r$r" caracal AGENT_QUEUES=8 AGENT_RING_CAPACITY=512
done
echo "done at $((SECONDS - S)) s"
