#!/usr/bin/env bash
# Run on the GPU machine from the tree's root (the device tool's $OUT collects the logs).
set -u
export PATH=/usr/local/cuda/bin:$PATH
S=$SECONDS
[ -x build-gpu/snic_server/snic_server ] || { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCARACAL_BUILD_TESTS=ON -DCARACAL_BUILD_BENCH=ON > $OUT/configure.log 2>&1; ninja -C build-gpu > $OUT/build.log 2>&1 || exit 1; }
echo "built at $((SECONDS-S)) s"
for cfg in "8 16" "8 32" "32 16" "4 16"; do
  set -- $cfg
  mkdir -p /tmp/f-$1-$2
  HANDLERS=face SERVERS="caracal" AGENT_QUEUES=$1 SAT_WINDOW=$2 OPEN_SIZES='' PROTOS=udp CARACAL_COMMIT=9696d7a timeout 150 bench/compare/run.sh compare build-gpu /tmp/f-$1-$2 > $OUT/c-$1-$2.log 2>&1
  echo "queues $1 window $2: $(grep saturation: $OUT/c-$1-$2.log | sed 's/.*window=[0-9]*: //; s/; sent.*\[/ [/')"
  python3 -c "
import json;r=json.load(open('/tmp/f-$1-$2/compare.json'))
for p in r['points']:
  if p['kind']=='saturation': print('  engine idle cores', p['engine_idle_cores'], 'cores', p['cpu_cores'])
"
done
echo "done at $((SECONDS-S)) s"
