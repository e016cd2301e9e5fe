#!/bin/bash
# Low-load rounds of Caracal alone (UDP echo 64 B, 1 connection, window 1), a fresh server and
# agent each round, with every thread's CPU (per TID), last CPUs and context switches over the
# point and the server's counters. With build-ab/old.tar (git archive of an older commit)
# present, rounds alternate between the old snic_server and the new one. Run from the
# repository root on the GPU machine; results go to $OUT. Knobs: ROUNDS (10), B (the build,
# build/), ACCEL (gpu:0), NO_OLD (set: new only), PERF_SWITCH (set: sched_switch call graphs of
# snic_server over 0.5 s of each round, with $PERF).
B=${B:-build}
if [ ! -x $B/bench/loadgen/caracal_loadgen ]; then
  (export PATH=/usr/local/cuda/bin:$PATH; cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build $B -j --target snic_server caracal_echo_agent caracal_loadgen >/dev/null) || { echo build failed; exit 1; }
fi
ROUNDS=${ROUNDS:-10}
PERF=${PERF:-perf}
VERSIONS="new"
if [ -f build-ab/old.tar ] && [ -z "${NO_OLD:-}" ]; then
  mkdir -p /tmp/old/src && tar -xf build-ab/old.tar -C /tmp/old/src
  (export PATH=/usr/local/cuda/bin:$PATH; cmake -S /tmp/old/src -B /tmp/old/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCARACAL_BUILD_TESTS=OFF -DCARACAL_BUILD_BENCH=OFF >/dev/null && cmake --build /tmp/old/build -j16 --target snic_server >/dev/null) || { echo old build failed; exit 1; }
  VERSIONS="old new"
fi
W=$OUT/ll; mkdir -p $W
SECRET=low-load-rounds-secret
per_tid() { for pid in "$@"; do for t in /proc/$pid/task/*; do s=$(cat $t/stat 2>/dev/null) || continue; n=${s#*(}; n=${n%)*}; set -- ${s##*) }; v=$(awk '/^voluntary_ctxt/ { v = $2 } /^nonvoluntary_ctxt/ { n = $2 } END { print v, n }' $t/status); echo "$n/${t##*/} $((${12} + ${13})) ${37} $v"; done; done; }
steal() { awk '/^cpu[0-9]/ { print $1, $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
for r in $(seq $ROUNDS); do
 for v in $VERSIONS; do
  snic=$B/snic_server/snic_server; [ $v = old ] && snic=/tmp/old/build/snic_server/snic_server
  cat > $W/server.yaml <<Y
io_threads: 4
engine_threads: 0
log_level: warn
control: { listen: 127.0.0.1:0, secret: $SECRET, agent_timeout_ms: 5000 }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 16384
    dispatch: round_robin
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }
Y
  $snic --config $W/server.yaml --log-level info > $W/server-$r.log 2>&1 & spid=$!
  for i in $(seq 100); do grep -q "serving" $W/server-$r.log && break; sleep 0.05; done
  control=$(sed -nE 's/.*control endpoint on .* \(port ([0-9]+)\).*/\1/p' $W/server-$r.log)
  port=$(sed -nE 's#.*listening on udp/127.0.0.1:0 \(port ([0-9]+)\).*#\1#p' $W/server-$r.log | head -1)
  mport=$(sed -nE 's/.*metrics on http:.*:([0-9]+)\/metrics.*/\1/p' $W/server-$r.log)
  cat > $W/agent.yaml <<Y
agent: ll
server: 127.0.0.1:$control
secret: $SECRET
accelerator: ${ACCEL:-gpu:0}
transport: shm
log_level: info
gpu: { workers: 0 }
services:
  - { name: echo, queues: 16, ring_capacity: 512, slot_bytes: 256, max_message_bytes: 16384 }
Y
  $B/examples/echo/caracal_echo_agent --config $W/agent.yaml > $W/agent-$r.log 2>&1 & apid=$!
  for i in $(seq 400); do grep -q "attached" $W/server-$r.log && break; sleep 0.05; done
  b=$(per_tid $spid $apid); st0=$(steal); t0=$(date +%s.%N)
  if [ -n "${PERF_SWITCH:-}" ]; then
    (sleep 0.5; exec $PERF record -q -e sched:sched_switch --call-graph dwarf,8192 -p $spid -o $W/sw.data -- sleep 0.5) > $W/perf.log 2>&1 &
    ppid=$!
  fi
  $B/bench/loadgen/caracal_loadgen --port $port --proto udp --handler echo --size 64 --warmup 0.3 --duration 1.5 --connections 1 --window 1 > $W/lg-$r.out 2>&1
  a=$(per_tid $spid $apid); st1=$(steal); t1=$(date +%s.%N)
  if [ -n "${PERF_SWITCH:-}" ]; then
    wait $ppid
    $PERF script -i $W/sw.data -F tid,trace,ip,sym 2>/dev/null | python3 -c "
import sys, collections
c = collections.Counter(); ev = None
def flush():
    if ev: c[(ev[0], ev[1], ' < '.join(ev[2][:7]))] += 1
for line in sys.stdin:
    if 'prev_comm=' in line:
        flush(); tid = line.split()[0]
        st = line.split('prev_state=')[1].split()[0]
        ev = (tid, st, [])
    elif line.strip() and ev is not None:
        parts = line.split()
        if len(parts) >= 2 and not parts[1].startswith('__schedule') and not parts[1].startswith('schedule'):
            ev[2].append(parts[1].split('+')[0])
flush()
for (tid, st, stack), n in c.most_common(12): print(f'    {n:6d} tid {tid} {st}: {stack}')
"
  fi
  echo "== round $r $v: $(head -1 $W/lg-$r.out | sed -E 's/.*: ([0-9]+ req\/s, p50 [0-9.]+ us).*/\1/')"
  curl -s http://127.0.0.1:$mport/metrics | grep -E "^caracal_engine_spins_cut_total|^caracal_engine_(rounds|sleeps|wakeups)[a-z_]*(\{|) " | head -8
  join <(echo "$b" | sort) <(echo "$a" | sort) | awk -v w="$(awk -v a=$t0 -v b=$t1 "BEGIN { print b - a }")" '{ c = ($6 - $2) / 100 / w; if (c > 0.02) printf "  %-28s %.2f cpu%s->%s vol %d invol %d\n", $1, c, $3, $7, $8 - $4, $9 - $5 }'
  join <(echo "$st0") <(echo "$st1") | awk '{ d = $5 - $3; if (d > 0 && ($4 - $2) / d > 0.02) printf "  steal %s %.0f%%\n", $1, 100 * ($4 - $2) / d }'
  kill $apid; sleep 0.3; kill $spid; wait 2>/dev/null
 done
done
