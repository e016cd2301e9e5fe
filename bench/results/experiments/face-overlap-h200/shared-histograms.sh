#!/usr/bin/env bash
# Run on the GPU machine from the tree's root (the device tool's $OUT collects the logs).
set -u
export PATH=/usr/local/cuda/bin:$PATH
S=$SECONDS
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCARACAL_BUILD_TESTS=OFF -DCARACAL_BUILD_BENCH=ON > $OUT/configure.log 2>&1; ninja -C build-gpu > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "built at $((SECONDS-S)) s"
run() {  # NAME ENV...
  local n=$1; shift
  mkdir -p /tmp/$n
  env "$@" HANDLERS=face SERVERS=caracal OPEN_SIZES='' PROTOS=udp CARACAL_COMMIT=local timeout 150 bench/compare/run.sh compare build-gpu /tmp/$n > $OUT/$n.log 2>&1
  echo "$n: $(grep saturation: $OUT/$n.log | sed 's/.*window=[0-9]*: //; s/; sent.*\[/ [/')"
}
run q8-shared AGENT_QUEUES=8
run q8-nolines AGENT_QUEUES=8 RX_LINES=off TX_LINES=off
run q8-burst4 AGENT_QUEUES=8 GPU_BURST=4
echo "done at $((SECONDS-S)) s"
