#!/usr/bin/env bash
# Heap allocations per request in the steady state: snic_server with the echo agent on the CPU
# accelerator over shm (the engine in the I/O threads, and on engine threads of its own), and
# the CPU server as the baseline, each under caracal_loadgen's closed loop, UDP and TCP, at each
# size. The server runs with libcaracal_alloc_count.so preloaded (alloc_count.cpp); a first
# loadgen run warms it up, and the allocations counted over a second run, divided by that run's
# requests, are the figure. The second run's connection setups are counted with it (a few per
# run: well under 0.001 a request at these counts).
#
#   bench/alloc/run.sh BUILD_DIR [RESULTS_DIR]   (default bench/results/alloc: alloc.json, table.md)
# Environment: SERVERS ("caracal caracal_threads cpu"), PROTOS ("udp tcp"), SIZES ("64 1024"),
# DURATION (3 s measured), CONNECTIONS (4), WINDOW (16), IO_THREADS (2).
set -euo pipefail
BUILD=$(realpath "${1:?usage: run.sh BUILD_DIR [RESULTS_DIR]}")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/bench/results/alloc}
SERVERS=${SERVERS:-caracal caracal_threads cpu}
PROTOS=${PROTOS:-udp tcp}
SIZES=${SIZES:-64 1024}
DURATION=${DURATION:-3}
CONNECTIONS=${CONNECTIONS:-4}
WINDOW=${WINDOW:-16}
IO_THREADS=${IO_THREADS:-2}
# shellcheck source=../lib/bench.sh
source "$SRC/bench/lib/bench.sh"
SERVER_BIN=$BUILD/snic_server/snic_server
AGENT_BIN=$BUILD/examples/echo/caracal_echo_agent
CPU_BIN=$BUILD/bench/baselines/caracal_cpu_server
LOADGEN=$BUILD/bench/loadgen/caracal_loadgen
COUNTER=$BUILD/bench/alloc/libcaracal_alloc_count.so
need_built "$SERVER_BIN" "$AGENT_BIN" "$CPU_BIN" "$LOADGEN" "$COUNTER"
command -v python3 >/dev/null || { echo "run.sh: python3 is missing" >&2; exit 77; }

mkdir -p "$OUT"
WORK=$(mktemp -d)
# The counter files live in memory (tmpfs) where there is one: the server stores into a shared
# mapping of its file on every allocation, and a page of a disk file that cannot be written back
# is a SIGBUS in the server.
COUNT_DIR=$(mktemp -d /dev/shm/caracal-alloc.XXXXXX 2>/dev/null || mktemp -d)
PIDS=()  # stop_all (bench.sh) stops them
trap 'stop_all; rm -rf "$WORK" "$COUNT_DIR"' EXIT
SECRET="alloc-bench-secret-$$"  # at least 16 characters, whatever the pid

# start SERVER: starts it with the counter preloaded; sets UDP and TCP (the ports) and COUNTS
# (its counter file).
start() {
  COUNTS=$COUNT_DIR/$1.counts
  local log=$WORK/$1.log
  if [ "$1" = cpu ]; then
    CARACAL_ALLOC_COUNT_FILE=$COUNTS LD_PRELOAD=$COUNTER "$CPU_BIN" --handler echo \
      --threads "$IO_THREADS" --max-message-bytes 4096 >"$log" 2>&1 &
    PIDS+=("$!")
    wait_for_line "$log" "^listening udp [0-9]+ tcp [0-9]+" 10
    read -r UDP TCP < <(sed -nE 's/^listening udp ([0-9]+) tcp ([0-9]+).*/\1 \2/p' "$log")
    return
  fi
  local engine=0
  [ "$1" = caracal_threads ] && engine=$IO_THREADS
  # The control channel allocates by the clock, not by request: each heartbeat is a message
  # decoded each way (some fifty allocations, from the YAML parser), every 100 ms by default.
  # Heartbeats 2 s apart keep them out of the window, whatever the request rate.
  cat >"$WORK/server.yaml" <<YAML
io_threads: $IO_THREADS
engine_threads: $engine
control: { listen: 127.0.0.1:0, secret: $SECRET, heartbeat_interval_ms: 2000, agent_timeout_ms: 10000 }
services:
  - name: echo
    max_message_bytes: 4096
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 } }
YAML
  CARACAL_ALLOC_COUNT_FILE=$COUNTS LD_PRELOAD=$COUNTER "$SERVER_BIN" --config "$WORK/server.yaml" \
    >"$log" 2>&1 &
  PIDS+=("$!")
  wait_for_line "$log" "serving [0-9]+ service" 10
  local control
  control=$(sed -nE 's/.*control endpoint on .* \(port ([0-9]+)\).*/\1/p' "$log")
  UDP=$(sed -nE 's#.*listening on udp/127.0.0.1:0 \(port ([0-9]+)\).*#\1#p' "$log")
  TCP=$(sed -nE 's#.*listening on tcp/127.0.0.1:0 \(port ([0-9]+)\).*#\1#p' "$log")
  cat >"$WORK/agent.yaml" <<YAML
agent: echo-1
server: 127.0.0.1:$control
secret: $SECRET
accelerator: cpu
transport: shm
services:
  - { name: echo, queues: $IO_THREADS, ring_capacity: 256, slot_bytes: 4096, max_message_bytes: 4096 }
YAML
  "$AGENT_BIN" --config "$WORK/agent.yaml" >"$WORK/agent.log" 2>&1 &
  PIDS+=("$!")
  wait_for_line "$log" "region for service .* attached" 20
}

# counts FILE: "allocations frees bytes", summed over the file's slots.
counts() {
  python3 - "$1" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
magic, used, slots = struct.unpack_from("<QQQ", data, 0)
assert magic == 0x434F4C4C41524143, "not a counter file"
total = [0, 0, 0]
for i in range(min(used, slots)):
    for k, v in enumerate(struct.unpack_from("<QQQ", data, 64 * (i + 1))):
        total[k] += v
print(*total)
EOF
}

: >"$WORK/points.jsonl"
for server in $SERVERS; do
  start "$server"
  for proto in $PROTOS; do
    port=$UDP
    [ "$proto" = tcp ] && port=$TCP
    for size in $SIZES; do
      load=(--port "$port" --proto "$proto" --size "$size" --connections "$CONNECTIONS"
            --window "$WINDOW" --threads 1 --warmup 0)
      "$LOADGEN" "${load[@]}" --duration 1 >/dev/null
      read -r a0 f0 b0 < <(counts "$COUNTS")
      "$LOADGEN" "${load[@]}" --duration "$DURATION" --strict --json "$WORK/run.json" >/dev/null
      read -r a1 f1 b1 < <(counts "$COUNTS")
      python3 - "$WORK/run.json" "$server" "$proto" "$size" "$((a1 - a0))" "$((f1 - f0))" \
        "$((b1 - b0))" >>"$WORK/points.jsonl" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
server, proto, size, allocs, frees, nbytes = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:])
requests = run["counts"]["sent"]
print(json.dumps({"server": server, "proto": proto, "size": size, "requests": requests,
                  "allocations": allocs, "frees": frees, "bytes": nbytes,
                  "per_request": allocs / requests if requests else None}))
EOF
      tail -1 "$WORK/points.jsonl"
    done
  done
  stop_all
done

python3 - "$WORK/points.jsonl" "$OUT" "$SRC" "$DURATION" "$CONNECTIONS" "$WINDOW" "$IO_THREADS" \
  "$(commit_id)" "$(machine_line)" <<'EOF'
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[3], "bench", "lib"))
import caracal_bench as cb
points = [json.loads(l) for l in open(sys.argv[1])]
out, src = sys.argv[2], sys.argv[3]
duration, connections, window, io_threads, commit, machine = sys.argv[4:10]
run = {"commit": commit, "machine": machine, "cpus": os.cpu_count(),
       "duration_s": float(duration), "connections": int(connections), "window": int(window),
       "io_threads": int(io_threads), "points": points}
cb.write_json(os.path.join(out, "alloc.json"), run)
servers = list(dict.fromkeys(p["server"] for p in points))
cases = list(dict.fromkeys((p["proto"], p["size"]) for p in points))
rows = []
for proto, size in cases:
    row = [f"{proto} {size} B"]
    for s in servers:
        p = cb.first(points, server=s, proto=proto, size=size)
        row.append("" if p is None or p["per_request"] is None else f"{p['per_request']:.3f}")
    rows.append(row)
text = (f"Heap allocations per request, echo (commit {commit}, {run['cpus']} CPUs, "
        f"{io_threads} I/O threads, {connections} connections x {window} in flight, "
        f"{duration} s measured)\n\n" + "\n".join(cb.md_table(["case"] + servers, rows)) + "\n")
cb.write_text(os.path.join(out, "table.md"), text)
print(text)
EOF
