#!/usr/bin/env bash
# Where snic_server's CPU goes per request, two build trees side by side on one machine. For
# each round, protocol and size, each tree's snic_server (one I/O thread, hosting the engine)
# and echo agent (CPU accelerator over shm, one worker, four queues) run under caracal_loadgen
# at saturation (4 connections x 16 in flight, one client thread); the trees take turns first.
# A point records requests per second of the server's CPU (utime + stime, /proc) and a
# cpu-clock profile of the server (perf record -F 999, flat), which parts.py sums by part:
# kernel, listener and framing, ring, engine, reply, locks, heap, memcpy, Asio, idle.
#
#   bench/profile/run.sh BEFORE_BUILD AFTER_BUILD [RESULTS_DIR]
#       (default bench/results/profile: summary.md; the points and profiles in RESULTS_DIR/raw)
# Environment: ROUNDS (3), PROTOS ("udp tcp"), SIZES ("64 1024"), DURATION (4 s profiled),
# LOADGEN (AFTER_BUILD's caracal_loadgen, used for both trees).
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BEFORE=$(realpath "${1:?usage: run.sh BEFORE_BUILD AFTER_BUILD [RESULTS_DIR]}")
AFTER=$(realpath "${2:?usage: run.sh BEFORE_BUILD AFTER_BUILD [RESULTS_DIR]}")
OUT=${3:-$SRC/bench/results/profile}
ROUNDS=${ROUNDS:-3}
PROTOS=${PROTOS:-udp tcp}
SIZES=${SIZES:-64 1024}
DURATION=${DURATION:-4}
# shellcheck source=../lib/bench.sh
source "$SRC/bench/lib/bench.sh"
# A program of a build tree, wherever that tree's layout put it.
program() { find "$1" -name "$2" -type f -perm -u+x -not -path '*/CMakeFiles/*' | head -1; }
LOADGEN=${LOADGEN:-$(program "$AFTER" caracal_loadgen)}
for b in "$BEFORE" "$AFTER"; do
  need_built "$(program "$b" snic_server)" "$(program "$b" caracal_echo_agent)"
done
need_built "$LOADGEN"
command -v perf >/dev/null || { echo "run.sh: perf is missing (linux-perf)" >&2; exit 77; }
perf record -q -o /dev/null -- true 2>/dev/null ||
  { echo "run.sh: perf record is not allowed here (kernel.perf_event_paranoid)" >&2; exit 77; }

RAW=$OUT/raw
mkdir -p "$RAW"
: >"$RAW/points.txt"
WORK=$(mktemp -d)
PIDS=()  # stop_all (bench.sh) stops them
trap 'stop_all; rm -rf "$WORK"' EXIT
SECRET="profile-bench-secret-$$"
cat >"$WORK/server.yaml" <<YAML
io_threads: 1
log_level: info
control: { listen: 127.0.0.1:17100, secret: $SECRET }
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - { protocol: udp, listen: 127.0.0.1:17000 }
      - protocol: tcp
        listen: 127.0.0.1:17001
        framing: { kind: length_prefixed, prefix_bytes: 4, byte_order: big }
YAML
cat >"$WORK/agent.yaml" <<YAML
agent: echo-1
server: 127.0.0.1:17100
secret: $SECRET
accelerator: cpu
transport: shm
log_level: warn
cpu: { workers: 1 }
services:
  - { name: echo, queues: 4, ring_capacity: 512, slot_bytes: 256, max_message_bytes: 1024 }
YAML

# point TREE BUILD PROTO SIZE ROUND: one measured point, appended to points.txt as
# "NAME RPS SERVER_CORES".
point() {
  local tree=$1 build=$2 proto=$3 size=$4 round=$5 port=17000
  [ "$proto" = tcp ] && port=17001
  local name=$tree-$proto-$size-r$round
  "$(program "$build" snic_server)" -c "$WORK/server.yaml" >"$WORK/$name.server.log" 2>&1 &
  local server=$!
  PIDS=("$server")
  wait_for_line "$WORK/$name.server.log" "serving 1 service" 10 || exit 1
  "$(program "$build" caracal_echo_agent)" --config "$WORK/agent.yaml" >"$WORK/$name.agent.log" 2>&1 &
  PIDS+=("$!")
  wait_attached "$WORK/$name.server.log" 1 || exit 1
  "$LOADGEN" --port "$port" --proto "$proto" --connections 4 --window 16 --threads 1 \
    --size "$size" --warmup 1 --duration $((DURATION + 2)) --json "$WORK/$name.json" \
    >"$WORK/$name.out" 2>&1 &
  local load=$!
  sleep 1.5
  local t0 c0 t1 c1
  t0=$(date +%s.%N) c0=$(pid_ticks "$server")
  perf record -q -F 999 -p "$server" -o "$WORK/$name.perf.data" -- sleep "$DURATION" \
    >/dev/null 2>&1
  t1=$(date +%s.%N) c1=$(pid_ticks "$server")
  wait "$load" || { echo "run.sh: the loadgen failed at $name:" >&2; tail "$WORK/$name.out" >&2; exit 1; }
  stop_all
  perf report -i "$WORK/$name.perf.data" --stdio --sort dso,sym 2>/dev/null |
    grep -v '^#' | grep -v '^$' >"$RAW/$name.perf.txt"
  local cores
  cores=$(python3 -c "print(($c1 - $c0) / $(getconf CLK_TCK) / ($t1 - $t0))")
  echo "$name $(saturation_rps "$WORK/$name.json") $cores" | tee -a "$RAW/points.txt"
}

for r in $(seq "$ROUNDS"); do
  trees="before after"
  [ $((r % 2)) = 0 ] && trees="after before"
  for proto in $PROTOS; do
    for size in $SIZES; do
      for t in $trees; do
        b=$BEFORE
        [ "$t" = after ] && b=$AFTER
        point "$t" "$b" "$proto" "$size" "$r"
      done
    done
  done
done
{
  echo "# Server CPU per request, by part"
  echo
  echo "$(machine_line); before: $(SRC=$BEFORE/.. commit_id), after: $(SRC=$AFTER/.. commit_id); $ROUNDS rounds, $(date -u +%F)."
  echo
  python3 "$SRC/bench/profile/parts.py" "$RAW"
} >"$OUT/summary.md"
cat "$OUT/summary.md"
