#!/usr/bin/env bash
# What an idle CPU agent costs, and what its idle policy costs a request: snic_server and the
# echo agent on the CPU accelerator over shm, run with two idle policies side by side, their
# rounds taking turns:
#   spin     cpu.idle_sleep_max_us: 0, a worker that polls without ever sleeping (the policy
#            before the agent backed off)
#   backoff  the agent's defaults: polling for cpu.idle_spin_us after the last request, then
#            sleeps between polls doubling up to cpu.idle_sleep_max_us
#   sleepN   the defaults with cpu.idle_sleep_max_us: N
# Each round starts a fresh server and agent and measures:
#   idle     the agent's and the server's cores (from /proc) over IDLE_S seconds of no traffic
#   busy     sockperf ping-pong over UDP, 64 B, one message in flight, for DURATION seconds
#   sparse   the same at SPARSE_MPS messages a second, so that each request finds a worker that
#            has stopped spinning (the price of the sleeps)
# and the report gives each figure's median over the rounds.
#
#   bench/idle/run.sh BUILD_DIR [RESULTS_DIR]   (default bench/results/idle-cpu-agent)
# Environment: ROUNDS (3), IDLE_S (5), DURATION (5), SPARSE_MPS (200), POLICIES ("spin backoff").
BUILD=$(realpath "${1:?usage: run.sh BUILD_DIR [RESULTS_DIR]}")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/bench/results/idle-cpu-agent}
set -- "$BUILD" "$SRC"
source "$SRC/bench/lib/bench.sh"
# The agent on the CPU over shm, whatever the environment says for the end-to-end tests.
CARACAL_E2E_ACCELERATOR=cpu CARACAL_E2E_TRANSPORT=shm source "$SRC/tests/e2e/lib.sh"
ROUNDS=${ROUNDS:-3}
IDLE_S=${IDLE_S:-5}
DURATION=${DURATION:-5}
SPARSE_MPS=${SPARSE_MPS:-200}
POLICIES=${POLICIES:-spin backoff}
need sockperf curl python3
need_built "$SERVER_BIN" "$ECHO_AGENT"
RAW="$OUT/raw"
rm -rf "$RAW"
mkdir -p "$RAW"

# policy_yaml POLICY: the agent's cpu section.
policy_yaml() {
  case $1 in
    spin) echo "cpu: { workers: 1, idle_sleep_max_us: 0 }" ;;
    backoff) echo "cpu: { workers: 1 }" ;;
    sleep[0-9]*) echo "cpu: { workers: 1, idle_sleep_max_us: ${1#sleep} }" ;;
    *) echo "run.sh: unknown policy '$1'" >&2; exit 2 ;;
  esac
}

# round POLICY N: one fresh server and agent, measured idle, busy and sparse.
round() {
  local policy=$1 n=$2 name="$1-round$2" port agent a0 s0 w0 a1 s1 w1 agent_cores server_cores
  start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }"
  port=$(port_of "udp/127.0.0.1:0")
  AGENT_YAML=$(policy_yaml "$policy") start_agent idle-bench "$ECHO_AGENT" \
    "  - { name: echo, queues: 2, max_message_bytes: 1024 }"
  # shellcheck disable=SC2154 # start_agent (tests/e2e/lib.sh) sets AGENT_PID_<name> through eval
  agent=$AGENT_PID_idle_bench

  # Idle: a second to settle, then IDLE_S seconds with no traffic.
  sleep 1
  a0=$(pid_ticks "$agent") s0=$(pid_ticks "$SERVER_PID") w0=$(date +%s.%N)
  sleep "$IDLE_S"
  a1=$(pid_ticks "$agent") s1=$(pid_ticks "$SERVER_PID") w1=$(date +%s.%N)
  agent_cores=$(cores_over $((a1 - a0)) "$w0" "$w1")
  server_cores=$(cores_over $((s1 - s0)) "$w0" "$w1")

  timeout $((DURATION + 30)) sockperf ping-pong -i 127.0.0.1 -p "$port" -m 64 -t "$DURATION" \
    --full-rtt >"$RAW/$name-busy.txt" 2>&1 || true
  timeout $((DURATION + 30)) sockperf ping-pong -i 127.0.0.1 -p "$port" -m 64 -t "$DURATION" \
    --full-rtt --mps "$SPARSE_MPS" >"$RAW/$name-sparse.txt" 2>&1 || true

  kill -INT "$agent" "$SERVER_PID"
  wait "$agent" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  # shellcheck disable=SC2034 # what lib.sh's cleanup stops
  PIDS=()
  cp "$WORK/server.log" "$RAW/$name-server.log"
  cp "$WORK/idle-bench.log" "$RAW/$name-agent.log"
  printf '{"policy":"%s","round":%d,"idle_agent_cores":%s,"idle_server_cores":%s,"busy":"%s","sparse":"%s"}\n' \
    "$policy" "$n" "$agent_cores" "$server_cores" "$name-busy.txt" "$name-sparse.txt" >>"$RAW/rounds.jsonl"
  echo "$name: idle agent $agent_cores cores, server $server_cores"
}

for n in $(seq "$ROUNDS"); do
  for policy in $POLICIES; do
    round "$policy" "$n"
  done
done

python3 "$SRC/bench/idle/report.py" "$RAW" "$(commit_id accel agent server control config core mqueue)" \
  "$(machine_line)" "$(date -u +%Y-%m-%d)" "$IDLE_S" "$DURATION" "$SPARSE_MPS" >"$OUT/README.md"
cat "$OUT/README.md"
