#!/usr/bin/env bash
# A chaos run: steady pipelined load over UDP and TCP at once while the agents are killed and the
# server is restarted, then every request reconciled with what the server counted.
#
#   bench/chaos/run.sh BUILD_DIR OUT_DIR
#
# One snic_server (UDP and length-prefixed TCP listeners on loopback, both with error replies)
# serves service echo from two caracal_echo_agent processes (CPU accelerator, shm). Two
# caracal_loadgen clients, one per protocol (--client-id 1 and 2: every request carries its
# client, slot and sequence number, so a reply for another client or another request is caught),
# keep CONNECTIONS x WINDOW requests in flight each for the whole run; the TCP client connects
# again by itself after the server closes its connections (--reconnect-ms).
#
# Then CYCLES times: kill -9 one agent (echo-1 and echo-2 in turn), wait a random AGENT_DOWN_MS,
# start it again and wait until the server has its region, then let both serve a random
# SETTLE_MS. After every SERVER_EVERY cycles the server itself restarts: SIGTERM and a wait for
# its exit (what `systemctl restart` does), or kill -9 for the restarts listed in SERVER_KILL;
# the agents keep running and must register again by themselves, the clients reconnect by
# themselves. Before each restart (and at the end) the metrics endpoint is scraped; a stopped
# server also logs its final counters ("final counter" lines), which are what the
# reconciliation takes for that incarnation; for a killed one only its last scrape is known.
#
# At the end the clients are stopped (SIGINT: no new requests, those in flight get TIMEOUT_MS)
# and bench/chaos/reconcile.py checks every request against the counters by category, writing
# OUT_DIR/summary.json and OUT_DIR/report.md; its exit status is this script's. Faults the
# driver sees itself (a process that dies unasked, a server that does not stop or start, an
# agent that does not come back, load that stalls) stop the run with exit 1.
#
# Settings (environment; defaults in brackets):
#   CYCLES [50]           agent kill cycles
#   SERVER_EVERY [10]     a server restart after every this many cycles (0: none)
#   SERVER_KILL [2,4]     which restarts (1-based) are kill -9 instead of SIGTERM
#   AGENT_DOWN_MS [20:500]  how long a killed agent stays down, random in this range
#   SETTLE_MS [200:800]   both agents up this long between kills, random in this range
#   CONNECTIONS [8] WINDOW [8]  per client: connections (UDP: groups of sockets) x in flight
#   SIZES [16:1,256:1,1000:1]   request sizes and weights (echo, at most 1024 bytes)
#   TIMEOUT_MS [1000]     a UDP request unanswered this long is lost; the drain at the end
#   ENGINE_THREADS [2]    the server's engine threads (io_threads is 2)
#   LOAD_PERCENT [100]    scales the replies each new server incarnation must serve before the
#                         run goes on (CARACAL_E2E_LOAD_PERCENT when set)
#   TIME_SCALE [1]        multiplies the waits for processes (CARACAL_E2E_TIME_SCALE when set)
#   SEED [random]         seeds the random waits and the clients' requests (recorded)
#   CARACAL_COMMIT        the commit named in the report (default: git rev-parse of the source)
BUILD=$(realpath "${1:?usage: run.sh BUILD_DIR OUT_DIR}")
OUT=${2:?usage: run.sh BUILD_DIR OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
TIME_SCALE=${TIME_SCALE:-${CARACAL_E2E_TIME_SCALE:-1}}
set -- "$BUILD" "$SRC"
source "$SRC/bench/lib/bench.sh"
# Its cleanup stops every process of PIDS at the end, and on a failure shows the queue metrics.
source "$SRC/tests/e2e/lib.sh"
AGENT_BIN=$ECHO_AGENT
LOADGEN="$BUILD/bench/loadgen/caracal_loadgen"
need_built "$SERVER_BIN" "$AGENT_BIN" "$LOADGEN"
need curl python3

CYCLES=${CYCLES:-50}
SERVER_EVERY=${SERVER_EVERY:-10}
SERVER_KILL=${SERVER_KILL:-2,4}
AGENT_DOWN_MS=${AGENT_DOWN_MS:-20:500}
SETTLE_MS=${SETTLE_MS:-200:800}
CONNECTIONS=${CONNECTIONS:-8}
WINDOW=${WINDOW:-8}
SIZES=${SIZES:-16:1,256:1,1000:1}
TIMEOUT_MS=${TIMEOUT_MS:-1000}
ENGINE_THREADS=${ENGINE_THREADS:-2}
LOAD_PERCENT=${LOAD_PERCENT:-${CARACAL_E2E_LOAD_PERCENT:-100}}
SEED=${SEED:-$(((RANDOM << 15) | RANDOM))}
COMMIT=$(commit_id)
RANDOM=$SEED

mkdir -p "$OUT"
OUT=$(realpath "$OUT")
rm -f "$OUT"/*.log "$OUT"/*.json "$OUT"/*.jsonl "$OUT"/*.prom "$OUT"/*.yaml "$OUT"/report.md
EVENTS="$OUT/events.jsonl"
: >"$EVENTS"

# event NAME [KEY VALUE]...: one line of events.jsonl (values are numbers or plain words).
event() {
  local line
  line="{\"t\": $(now), \"event\": \"$1\""
  shift
  while [ $# -ge 2 ]; do
    if [[ $2 =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; then
      line+=", \"$1\": $2"
    else
      line+=", \"$1\": \"$2\""
    fi
    shift 2
  done
  echo "$line}" >>"$EVENTS"
}
# pick LOW:HIGH: a random whole number in the range.
pick() { local lo=${1%:*} hi=${1#*:}; echo $((lo + RANDOM % (hi - lo + 1))); }
sleep_ms() { sleep "$(awk -v ms="$1" 'BEGIN { printf "%.3f", ms / 1000 }')"; }
fault() {
  echo "FAULT: $*" >&2
  event fault what "$(echo "$*" | tr -d '"\\' | tr ' ' '_')"
  exit 1
}

SERVER_PID=
AGENT_PIDS=(0 0 0)
CLIENT_PIDS=()

# wait_until SECONDS COMMAND...: 0 once COMMAND succeeds, 1 after SECONDS (times TIME_SCALE).
wait_until() {
  local secs=$(($1 * TIME_SCALE))
  shift
  for _ in $(seq $((secs * 20))); do
    "$@" && return 0
    sleep 0.05
  done
  return 1
}

# Ports below the ephemeral range, so that no socket bound to port 0 can hold one (the server
# binds the same ones again at every restart): UDP, TCP, control, metrics in a row.
ports_free() {
  local p
  command -v ss >/dev/null || return 0
  for p in "$@"; do
    if ss -Hlnut "sport = :$p" 2>/dev/null | grep -q .; then return 1; fi
  done
}
for _ in $(seq 20); do
  # shellcheck disable=SC2154 # tests/e2e/lib.sh reads the kernel's ephemeral range
  BASE=$((10000 + RANDOM % (ephemeral_low - 10010)))
  ports_free "$BASE" $((BASE + 1)) $((BASE + 2)) $((BASE + 3)) && break
done
UDP_PORT=$BASE TCP_PORT=$((BASE + 1)) CONTROL_PORT=$((BASE + 2)) METRICS_PORT=$((BASE + 3))

cat >"$OUT/server.yaml" <<YAML
io_threads: 2
engine_threads: $ENGINE_THREADS
control: { listen: 127.0.0.1:$CONTROL_PORT, secret: $SECRET, heartbeat_interval_ms: 50, agent_timeout_ms: $((1000 * TIME_SCALE)) }
metrics: { listen: 127.0.0.1:$METRICS_PORT }
services:
  - name: echo
    max_message_bytes: 1024
    dispatch: round_robin
    listeners:
      - { protocol: udp, listen: 127.0.0.1:$UDP_PORT, error_reply: 'ERROR {reason}' }
      - { protocol: tcp, listen: 127.0.0.1:$TCP_PORT, framing: { kind: length_prefixed, prefix_bytes: 4 }, error_reply: 'ERROR {reason}' }
YAML
for a in 1 2; do
  cat >"$OUT/echo-$a.yaml" <<YAML
agent: echo-$a
server: 127.0.0.1:$CONTROL_PORT
secret: $SECRET
accelerator: cpu
transport: shm
reconnect_interval_ms: 100
services:
  - { name: echo, queues: 2, ring_capacity: 64, slot_bytes: 256, max_message_bytes: 1024 }
YAML
done

INCARNATION=0
attached() { grep -c "agent '$1' region for service 'echo' attached" "$OUT/server-$INCARNATION.log" 2>/dev/null || true; }
serving() { grep -q "serving [0-9]* service" "$OUT/server-$INCARNATION.log" 2>/dev/null; }
# scrape: the metrics of this incarnation, kept as its last scrape (and when it was taken).
scrape() {
  local t
  t=$(now)
  if curl -sf -m 2 "http://127.0.0.1:$METRICS_PORT/metrics" >"$OUT/scrape.tmp"; then
    mv "$OUT/scrape.tmp" "$OUT/server-$INCARNATION.prom"
    event scrape incarnation "$INCARNATION" taken "$t"
  fi
}
alive() { kill -0 "$1" 2>/dev/null; }
check_alive() {
  alive "$SERVER_PID" || fault "snic_server (incarnation $INCARNATION) died: $(tail -3 "$OUT/server-$INCARNATION.log")"
  local a
  for a in 1 2; do
    [ "${AGENT_PIDS[$a]}" = 0 ] || alive "${AGENT_PIDS[$a]}" ||
      fault "agent echo-$a died unasked: $(tail -3 "$OUT/echo-$a.log")"
  done
  for pid in "${CLIENT_PIDS[@]}"; do
    alive "$pid" || fault "a load client exited early: $(tail -3 "$OUT"/client-*.out)"
  done
}

# Not lib.sh's start_server and start_agent: each incarnation binds the same ports again, and
# the agents' configs and logs live in OUT_DIR for the reconciliation.
start_incarnation() {
  INCARNATION=$((INCARNATION + 1))
  event server_start incarnation "$INCARNATION"
  "$SERVER_BIN" --config "$OUT/server.yaml" >"$OUT/server-$INCARNATION.log" 2>&1 &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  wait_until 10 serving || fault "snic_server incarnation $INCARNATION did not start serving"
  event server_serving incarnation "$INCARNATION"
}
# agents_attached N1 N2: the server has attached echo-1's region N1 times and echo-2's N2 times.
agents_attached() { [ "$(attached echo-1)" -ge "$1" ] && [ "$(attached echo-2)" -ge "$2" ]; }
start_echo() {
  local a=$1
  event agent_start agent "echo-$a" incarnation "$INCARNATION"
  "$AGENT_BIN" --config "$OUT/echo-$a.yaml" >>"$OUT/echo-$a.log" 2>&1 &
  AGENT_PIDS[$a]=$!
  PIDS+=("$!")
}
# replies_reach N: the server's replies reach N on each listener in this incarnation (UDP
# requests lost in a restart are sent again only after TIMEOUT_MS).
replies_reach() {
  [ "$(metric 'caracal_listener_replies_total\{[^}]*udp/')" -ge "$1" ] &&
    [ "$(metric 'caracal_listener_replies_total\{[^}]*tcp/')" -ge "$1" ]
}
PROGRESS=$((2000 * LOAD_PERCENT / 100))
[ "$PROGRESS" -gt 0 ] || PROGRESS=1

# stop_server term|kill|end: scrapes, then stops the server with SIGTERM (term, end) or SIGKILL.
stop_server() {
  local how=$1 rc=0
  scrape
  event server_stop incarnation "$INCARNATION" how "$how"
  if [ "$how" = kill ]; then
    kill -KILL "$SERVER_PID"
  else
    kill -TERM "$SERVER_PID"
  fi
  # A stop drains for at most 3 s (tunables::kStopDrain) and closes what is left in 0.5 s.
  local signal=SIGTERM
  [ "$how" = kill ] && signal=SIGKILL
  wait_until 15 bash -c "! kill -0 $SERVER_PID 2>/dev/null" ||
    fault "snic_server incarnation $INCARNATION did not exit within 15 s of $signal"
  wait "$SERVER_PID" 2>/dev/null || rc=$?
  event server_exit incarnation "$INCARNATION" rc "$rc"
  if [ "$how" != kill ] && [ "$rc" -ne 0 ]; then
    fault "snic_server incarnation $INCARNATION exited $rc after SIGTERM"
  fi
  grep -q "final counter" "$OUT/server-$INCARNATION.log" || [ "$how" = kill ] ||
    fault "snic_server incarnation $INCARNATION logged no final counters"
}

echo "chaos: $CYCLES agent cycles, a server restart every $SERVER_EVERY (kill -9 at ${SERVER_KILL:-none}), seed $SEED, ports $BASE-$((BASE + 3)), results in $OUT"
START=$(now)
event run_start seed "$SEED" cycles "$CYCLES" server_every "$SERVER_EVERY" loadavg "$(cut -d" " -f1 /proc/loadavg)"
start_incarnation
start_echo 1
start_echo 2
wait_until 10 agents_attached 1 1 || fault "the agents did not register"

# The clients: until SIGINT, replies checked, TCP reconnecting by itself.
client() {
  local proto=$1 id=$2 port=$3
  "$LOADGEN" --proto "$proto" --port "$port" --handler echo --sizes "$SIZES" \
    --connections "$CONNECTIONS" --window "$WINDOW" --threads 1 --client-id "$id" \
    --seed $((SEED + id)) --error-prefix "ERROR " --timeout-ms "$TIMEOUT_MS" --timeline-ms 50 \
    --warmup 0 --duration 3600 --until-signal ${4:+"$4"} ${5:+"$5"} \
    --json "$OUT/client-$proto.json" >"$OUT/client-$proto.out" 2>&1 &
  CLIENT_PIDS+=($!) PIDS+=($!)
}
client udp 1 "$UDP_PORT"
client tcp 2 "$TCP_PORT" --reconnect-ms 50
event clients_started
wait_until 20 replies_reach "$PROGRESS" || fault "the load never got going"

restarts=0
for cycle in $(seq "$CYCLES"); do
  a=$((2 - cycle % 2))  # echo-1, echo-2, echo-1, ...
  check_alive
  before=$(attached "echo-$a")
  event agent_kill agent "echo-$a" cycle "$cycle" incarnation "$INCARNATION"
  kill -KILL "${AGENT_PIDS[$a]}"
  wait "${AGENT_PIDS[$a]}" 2>/dev/null || true
  AGENT_PIDS[$a]=0
  sleep_ms "$(pick "$AGENT_DOWN_MS")"
  start_echo "$a"
  wait_until 10 bash -c "[ \$(grep -c \"agent 'echo-$a' region for service 'echo' attached\" '$OUT/server-$INCARNATION.log') -gt $before ]" ||
    fault "echo-$a did not register again after its restart (cycle $cycle)"
  event agent_attached agent "echo-$a" cycle "$cycle" incarnation "$INCARNATION"
  sleep_ms "$(pick "$SETTLE_MS")"
  check_alive

  if [ "$SERVER_EVERY" -gt 0 ] && [ $((cycle % SERVER_EVERY)) -eq 0 ]; then
    restarts=$((restarts + 1))
    how=term
    [[ ",$SERVER_KILL," == *",$restarts,"* ]] && how="kill"
    echo "cycle $cycle: server restart $restarts ($how)"
    stop_server "$how"
    start_incarnation
    # The agents were not touched: they must notice and register again by themselves.
    wait_until 20 agents_attached 1 1 ||
      fault "the agents did not register again by themselves after server restart $restarts"
    event agents_back incarnation "$INCARNATION"
    wait_until 20 replies_reach "$PROGRESS" ||
      fault "the clients got no service after server restart $restarts"
    event load_back incarnation "$INCARNATION"
  fi
  [ $((cycle % 10)) -eq 0 ] && echo "cycle $cycle done ($(awk -v s="$START" -v n="$(now)" 'BEGIN { printf "%.0f", n - s }') s)"
done

# The end: a last stretch of load on both agents, then the clients stop and wait for what they
# have in flight; the last incarnation is scraped with no load on it, then stopped.
sleep_ms "$(pick "$SETTLE_MS")"
check_alive
event clients_stop
for pid in "${CLIENT_PIDS[@]}"; do kill -INT "$pid"; done
client_rc=0
for pid in "${CLIENT_PIDS[@]}"; do
  rc=0
  wait_until $((TIMEOUT_MS / 1000 + 10)) bash -c "! kill -0 $pid 2>/dev/null" ||
    fault "a load client did not finish within $((TIMEOUT_MS / 1000 + 10)) s of SIGINT"
  wait "$pid" || rc=$?
  [ "$rc" -eq 0 ] || client_rc=$rc
done
CLIENT_PIDS=()
event clients_done rc "$client_rc"
stop_server end
SERVER_PID=
for a in 1 2; do
  kill -TERM "${AGENT_PIDS[$a]}"
  rc=0
  wait "${AGENT_PIDS[$a]}" || rc=$?
  AGENT_PIDS[$a]=0
  event agent_exit agent "echo-$a" rc "$rc"
  [ "$rc" -eq 0 ] || fault "agent echo-$a exited $rc after SIGTERM"
done
# shellcheck disable=SC2034 # what lib.sh's cleanup stops: nothing left
PIDS=()
END=$(now)
event run_end loadavg "$(cut -d" " -f1 /proc/loadavg)"
cat "$OUT"/client-udp.out "$OUT"/client-tcp.out

machine=$(cpu_model)
python3 "$HERE/reconcile.py" "$OUT" --commit "$COMMIT" --seed "$SEED" \
  --settings "CYCLES=$CYCLES SERVER_EVERY=$SERVER_EVERY SERVER_KILL=$SERVER_KILL AGENT_DOWN_MS=$AGENT_DOWN_MS SETTLE_MS=$SETTLE_MS CONNECTIONS=$CONNECTIONS WINDOW=$WINDOW SIZES=$SIZES TIMEOUT_MS=$TIMEOUT_MS ENGINE_THREADS=$ENGINE_THREADS LOAD_PERCENT=$LOAD_PERCENT" \
  --machine "$(nproc) CPUs, ${machine:-unknown CPU}, $(uname -r)" \
  --duration "$(awk -v s="$START" -v e="$END" 'BEGIN { printf "%.1f", e - s }')"
