#!/usr/bin/env bash
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
  python3 -c "
import json;r=json.load(open('/tmp/$n/compare.json'))
for p in r['points']:
  if p['kind']=='saturation': print('  engine idle', p['engine_idle_cores'], 'threads', p['threads'])
"
}

run q16-gpu AGENT_QUEUES=16
run q8-gpu AGENT_QUEUES=8
echo "done at $((SECONDS-S)) s"
