# shellcheck shell=bash
# Shared by the end-to-end tests: start the real snic_server and agents on loopback with
# ports the OS picks, wait for them to be ready, and clean everything up on exit.
#
# Each test script is run by CTest as: test.sh BUILD_DIR SOURCE_DIR. Exit 0 passes, 77 skips
# (a client tool is missing), anything else fails; on failure the logs are printed.
#
# CARACAL_E2E_ACCELERATOR picks the agents' accelerator (default cpu; gpu:0 runs the same tests
# with the handlers as persistent CUDA kernels).
#
# CARACAL_E2E_TRANSPORT picks the agents' transport: shm (default) or rdma, which makes each
# agent export its regions over RDMA on CARACAL_E2E_RDMA_ADDRESS (an RDMA device's IP; default
# 192.0.2.1, the Soft-RoCE VM's rxe0) and the server connect to them (tests/rdma/e2e_vm.sh runs
# the scripts that way inside the VM of tests/vm/rxe-vm.sh).
#
# CARACAL_E2E_TIME_SCALE (default 1) multiplies the waits for processes to come up, for slow
# machines (the emulated VM).
#
# CARACAL_E2E_LOAD_PERCENT (environment, default 100) scales the requests per connection of the
# load runs that only need volume (and the seconds of sockperf.sh's runs); the sanitizer CI runs
# set it lower, as they set CARACAL_STRESS_MESSAGES for the stress tests.
set -euo pipefail

BUILD=${1:?build directory}
# shellcheck disable=SC2034 # read by the scripts that source this file
SRC=${2:?source directory}
SERVER_BIN="$BUILD/snic_server/snic_server"
# shellcheck disable=SC2034 # read by the scripts that source this file
ECHO_AGENT="$BUILD/examples/echo/caracal_echo_agent"
TRANSPORT=${CARACAL_E2E_TRANSPORT:-shm}
RDMA_ADDRESS=${CARACAL_E2E_RDMA_ADDRESS:-192.0.2.1}
TIME_SCALE=${CARACAL_E2E_TIME_SCALE:-1}

# now: seconds since the epoch with microseconds, from bash itself (the Soft-RoCE VM's busybox
# `date` has no %N).
now() {
  echo "${EPOCHREALTIME/,/.}"
}
case $TRANSPORT in
  shm) TRANSPORT_YAML="transport: shm" ;;
  rdma) TRANSPORT_YAML="transport: rdma
rdma: { bind_address: $RDMA_ADDRESS }" ;;
  *) echo "CARACAL_E2E_TRANSPORT=$TRANSPORT is not shm or rdma"; exit 2 ;;
esac
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caracal-e2e.XXXXXX")
ACCELERATOR=${CARACAL_E2E_ACCELERATOR:-cpu}
SECRET="e2e-secret-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
PIDS=()

cleanup() {
  local rc=$?
  # On failure, the server's queues as it saw them, before anything is stopped.
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && [ -n "${METRICS_PORT:-}" ]; then
    echo "===== queue metrics at the failure"
    curl -sf -m 5 "http://127.0.0.1:$METRICS_PORT/metrics" |
      grep -E '^caracal_(queue_|rdma_|service_(errors|replies)|agents)' || true
  fi
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    for f in "$WORK"/*.log; do
      [ -e "$f" ] || continue
      echo "===== $(basename "$f") (last ${CARACAL_E2E_LOG_LINES:-40} lines)"
      tail -n "${CARACAL_E2E_LOG_LINES:-40}" "$f"
    done
  fi
  [ -n "${KEEP_WORK:-}" ] && echo "kept $WORK" || rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

need() {
  for tool in "$@"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "SKIP: $tool is not installed (scripts/deps.sh test installs it)"
      exit 77
    fi
  done
}

# load N: N requests, scaled by CARACAL_E2E_LOAD_PERCENT (at least 1).
load() {
  local n=$(($1 * ${CARACAL_E2E_LOAD_PERCENT:-100} / 100))
  echo $((n > 0 ? n : 1))
}

fail() {
  echo "FAIL: $*"
  exit 1
}

# wait_for_line FILE REGEX [SECONDS]: waits until FILE has a line matching REGEX.
wait_for_line() {
  local file=$1 regex=$2 secs=$((${3:-10} * TIME_SCALE))
  for _ in $(seq $((secs * 20))); do
    grep -Eq "$regex" "$file" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "$(basename "$file") never showed /$regex/ within ${secs}s"
}

# start_server CONFIG_TEXT: writes the config (control and metrics on port 0 unless given),
# starts snic_server and waits until it serves. Sets CONTROL_PORT and METRICS_PORT.
start_server() {
  printf '%s\n' "$1" >"$WORK/server.yaml"
  "$SERVER_BIN" --config "$WORK/server.yaml" >"$WORK/server.log" 2>&1 &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  wait_for_line "$WORK/server.log" "serving [0-9]+ service"
  CONTROL_PORT=$(sed -nE 's/.*control endpoint on .* \(port ([0-9]+)\).*/\1/p' "$WORK/server.log")
  METRICS_PORT=$(sed -nE 's/.*metrics on http:.*:([0-9]+)\/metrics.*/\1/p' "$WORK/server.log")
}

# port_of LISTENER: the port the server bound for a listener ("udp/127.0.0.1:0" is the first
# UDP listener on 127.0.0.1 with port 0; with several, pass the index as $2, from 1).
port_of() {
  sed -nE "s#.*listening on $1 \(port ([0-9]+)\).*#\1#p" "$WORK/server.log" | sed -n "${2:-1}p"
}

# start_agent NAME BINARY SERVICES_YAML [ARGS...]: an agent registered under NAME, with ARGS
# on its command line (handler options); waits until it serves. AGENT_ACCELERATOR, when set,
# overrides ACCELERATOR for this agent; AGENT_YAML, when set, is added to its configuration.
start_agent() {
  local name=$1 bin=$2 services=$3
  shift 3
  cat >"$WORK/$name.yaml" <<YAML
agent: $name
server: 127.0.0.1:$CONTROL_PORT
secret: $SECRET
accelerator: ${AGENT_ACCELERATOR:-$ACCELERATOR}
$TRANSPORT_YAML
reconnect_interval_ms: 100
${AGENT_YAML:-}
services:
$services
YAML
  "$bin" --config "$WORK/$name.yaml" "$@" >"$WORK/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  eval "AGENT_PID_${name//-/_}=$pid"
  wait_for_line "$WORK/$name.log" "serving [0-9]+ service"
  wait_for_line "$WORK/server.log" "agent '$name' region for service .* attached"
}

# start_fault_server [CONTROL_KEYS [SERVICE_KEYS]]: the server the fault scripts (agent_loss.sh,
# tests/rdma/link_fault.sh) run, with two engine threads (an shm region's queues are split
# between them, an rdma region stays on one; ENGINE_THREADS=0 runs the engine in the I/O
# threads instead, as do kv_memcached.sh and backpressure.sh): service echo over line-framed TCP with error replies, heartbeats
# every 50 ms (CARACAL_E2E_AGENT_TIMEOUT_MS, default 500, lengthens the timeout where they run
# late, as in the emulated VM), CONTROL_KEYS (", key: value" ...) added to `control` and
# SERVICE_KEYS (", key: value" ...) to the service (reply_timeout_ms, say). Sets
# PORT to the TCP listener's port and SERVICE to the agents' service entry (with RX_LINES, when
# set, as its rx_lines).
start_fault_server() {
  start_server "io_threads: 2
engine_threads: ${ENGINE_THREADS:-2}
control: { listen: 127.0.0.1:0, secret: $SECRET, heartbeat_interval_ms: 50, agent_timeout_ms: ${CARACAL_E2E_AGENT_TIMEOUT_MS:-500}${1:-} }
metrics: { listen: 127.0.0.1:0 }
services:
  - { name: echo, max_message_bytes: 512, dispatch: round_robin${2:-},
      listeners: [ { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line }, error_reply: 'ERROR {reason}' } ] }"
  PORT=$(port_of "tcp/127.0.0.1:0")
  # shellcheck disable=SC2034 # read by the fault scripts, the callers
  SERVICE="  - { name: echo, queues: 2, ring_capacity: 64, slot_bytes: 128, max_message_bytes: 512${RX_LINES:+, rx_lines: $RX_LINES} }"
}

# start_load SEED: the pipelined load the fault scripts (agent_loss.sh, tests/rdma/link_fault.sh)
# run across a fault, in the background: 200 connections x 8 in flight, every reply checked in
# order, error replies counted (not failures). Sets LOAD_PID; output in $WORK/client.log.
start_load() {
  "$BUILD/tests/e2e/caracal_pipeline_client" --connect "127.0.0.1:$PORT" --connections 200 \
    --requests "$(load 3000)" --pipeline 8 --min-bytes 1 --max-bytes 500 --framing line \
    --seed "$1" --timeout-s 300 --error-prefix "ERROR " >"$WORK/client.log" 2>&1 &
  LOAD_PID=$!
  PIDS+=("$LOAD_PID")
}

# wait_for_replies N: until the server has answered N requests (CARACAL_E2E_KILL_AFTER, default
# 20000, when N is not given; CARACAL_E2E_LOAD_PERCENT must leave the load well above it).
wait_for_replies() {
  local n=${1:-${CARACAL_E2E_KILL_AFTER:-20000}}
  for _ in $(seq $((200 * TIME_SCALE))); do
    [ "$(metric caracal_service_replies_total)" -ge "$n" ] && return 0
    sleep 0.05
  done
  fail "the load never got going (fewer than $n replies)"
}

# finish_load: waits for start_load's client, which must have seen no wrong or missing reply;
# sets LOAD_ERRORS to the requests that failed visibly.
finish_load() {
  local rc=0
  wait "$LOAD_PID" || rc=$?
  cat "$WORK/client.log"
  [ "$rc" -eq 0 ] || fail "the load client saw a wrong or missing reply (exit $rc)"
  # shellcheck disable=SC2034 # read by the fault scripts, the callers
  LOAD_ERRORS=$(sed -nE 's/.*errors=([0-9]+).*/\1/p' "$WORK/client.log")
}

# metric REGEX: the sum of the series whose line starts with REGEX (0 when there is none yet).
metric() {
  curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" | { grep -E "^$1" || true; } |
    awk '{s += $NF} END {print s + 0}'
}

# pingpong_ok OUT WHAT: sockperf ping-pong output with replies and nothing lost, duplicated or
# reordered; prints the latency lines.
pingpong_ok() {
  local out=$1 what=$2
  grep -q "Summary: Latency is" "$out" || fail "$what: sockperf reported no latency"
  grep -Eq "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0" "$out" ||
    fail "$what: sockperf saw dropped, duplicated or out-of-order messages"
  if grep -q "No messages were received" "$out"; then fail "$what: no replies"; fi
  grep -E "Summary: Latency|percentile 50.000|percentile 99.000" "$out" | sed "s/^/$what: /"
}

# A memcached of the test's own (kv_memcached.sh, face_memcached.sh), on loopback, on a port
# picked below the kernel's ephemeral range: every socket the other tests bind to port 0 comes
# from that range, so a pick inside it can find the port taken. Sets MC_PORT and MC_PID.
read -r ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range
[ "$ephemeral_low" -gt 11024 ] || ephemeral_low=32768
pick_mc_port() { MC_PORT=$((10000 + RANDOM % (ephemeral_low - 10000))); }
# start_memcached [pick]: starts it on MC_PORT; `pick` picks the port first and swaps one found
# taken for another (up to 5 tries), which only the first start may do: the server is told it.
start_memcached() {
  local as_user=(); [ "$(id -u)" -eq 0 ] && as_user=(-u nobody)
  local tries=1; [ "${1:-}" = pick ] && tries=5
  [ "${1:-}" = pick ] && pick_mc_port
  for _ in $(seq "$tries"); do
    memcached "${as_user[@]}" -l 127.0.0.1 -p "$MC_PORT" -U 0 -m 16 -t 1 >"$WORK/memcached.log" 2>&1 &
    MC_PID=$!
    PIDS+=("$MC_PID")
    for _ in $(seq 100); do
      printf 'version\r\n' | timeout 2 nc -N -w 2 127.0.0.1 "$MC_PORT" 2>/dev/null | grep -q VERSION && return 0
      grep -q "Address already in use" "$WORK/memcached.log" && break
      sleep 0.05
    done
    grep -q "Address already in use" "$WORK/memcached.log" || break
    echo "port $MC_PORT is taken; memcached tries another"
    pick_mc_port
  done
  fail "memcached did not start on port $MC_PORT"
}
# mc_set KEY VALUE: stores a text value.
mc_set() {
  printf 'set %s 0 0 %d\r\n%s\r\n' "$1" "${#2}" "$2" | timeout 3 nc -N -w 2 127.0.0.1 "$MC_PORT" | grep -q STORED ||
    fail "memcached did not store $1"
}
