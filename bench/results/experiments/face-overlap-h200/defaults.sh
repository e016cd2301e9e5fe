#!/usr/bin/env bash
# Run on the GPU machine from the tree's root: bench/compare's defaults on face, Caracal and the
# host-centric server side by side (the device tool's $OUT collects the report).
set -u
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCARACAL_BUILD_TESTS=OFF -DCARACAL_BUILD_BENCH=ON > "$OUT/configure.log" 2>&1
ninja -C build-gpu > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
mkdir -p /tmp/face
HANDLERS=face SERVERS="caracal host_centric" CARACAL_COMMIT="${COMMIT:-local}" timeout 300 \
  bench/compare/run.sh compare build-gpu /tmp/face > "$OUT/compare.log" 2>&1
echo "compare rc $?"
cp /tmp/face/compare.md /tmp/face/compare.json "$OUT/"
sed -n '/Caracal against the host-centric/,/Where the server/p' "$OUT/compare.md"
