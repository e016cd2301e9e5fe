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
set -euo pipefail
BUILD=$(realpath "${1:?usage: run.sh BUILD_DIR [RESULTS_DIR]}")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/bench/results/idle-cpu-agent}
ROUNDS=${ROUNDS:-3}
IDLE_S=${IDLE_S:-5}
DURATION=${DURATION:-5}
SPARSE_MPS=${SPARSE_MPS:-200}
POLICIES=${POLICIES:-spin backoff}
SERVER_BIN="$BUILD/snic_server/snic_server"
AGENT_BIN="$BUILD/examples/echo/caracal_echo_agent"
for tool in sockperf curl python3; do
  command -v $tool >/dev/null || { echo "run.sh: $tool is missing (scripts/deps.sh test)"; exit 77; }
done
[ -x "$SERVER_BIN" ] && [ -x "$AGENT_BIN" ] || { echo "run.sh: build snic_server and caracal_echo_agent in $BUILD first"; exit 2; }

RAW="$OUT/raw"
rm -rf "$RAW"
mkdir -p "$RAW"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
CLK_TCK=$(getconf CLK_TCK)
SECRET="idle-bench-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"

# ticks PID: user + system CPU ticks of a process, its threads included.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

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
  local policy=$1 n=$2 name="$1-round$2"
  cat >"$WORK/server.yaml" <<YAML
io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }
YAML
  "$SERVER_BIN" --config "$WORK/server.yaml" >"$RAW/$name-server.log" 2>&1 &
  local server=$!
  PIDS+=("$server")
  local control="" metrics="" port=""
  for _ in $(seq 100); do
    control=$(sed -nE 's/.*control endpoint on .* \(port ([0-9]+)\).*/\1/p' "$RAW/$name-server.log")
    metrics=$(sed -nE 's/.*metrics on http:.*:([0-9]+)\/metrics.*/\1/p' "$RAW/$name-server.log")
    port=$(sed -nE 's#.*listening on udp/127.0.0.1:0 \(port ([0-9]+)\).*#\1#p' "$RAW/$name-server.log")
    [ -n "$control" ] && [ -n "$metrics" ] && [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$RAW/$name-server.log"; echo "run.sh: the server did not start"; exit 1; }
  cat >"$WORK/agent.yaml" <<YAML
agent: idle-bench
server: 127.0.0.1:$control
secret: $SECRET
accelerator: cpu
$(policy_yaml "$policy")
services:
  - { name: echo, queues: 2, max_message_bytes: 1024 }
YAML
  "$AGENT_BIN" --config "$WORK/agent.yaml" >"$RAW/$name-agent.log" 2>&1 &
  local agent=$!
  PIDS+=("$agent")
  # The metrics are read whole, then matched: grep -q would close the pipe on curl, which
  # pipefail reports as a failure.
  local registered=0
  for _ in $(seq 100); do
    [[ "$(curl -fs "http://127.0.0.1:$metrics/metrics")" == *$'\ncaracal_agents 1'* ]] &&
      registered=1 && break
    sleep 0.1
  done
  [ $registered = 1 ] || { echo "run.sh: the agent did not register"; exit 1; }

  # Idle: a second to settle, then IDLE_S seconds with no traffic.
  sleep 1
  local a0 s0 w0 a1 s1 w1
  a0=$(ticks "$agent"); s0=$(ticks "$server"); w0=$(date +%s.%N)
  sleep "$IDLE_S"
  a1=$(ticks "$agent"); s1=$(ticks "$server"); w1=$(date +%s.%N)
  local agent_cores server_cores
  agent_cores=$(awk -v t=$((a1 - a0)) -v hz="$CLK_TCK" -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", t / hz / (b - a) }')
  server_cores=$(awk -v t=$((s1 - s0)) -v hz="$CLK_TCK" -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", t / hz / (b - a) }')

  timeout $((DURATION + 30)) sockperf ping-pong -i 127.0.0.1 -p "$port" -m 64 -t "$DURATION" \
    --full-rtt >"$RAW/$name-busy.txt" 2>&1 || true
  timeout $((DURATION + 30)) sockperf ping-pong -i 127.0.0.1 -p "$port" -m 64 -t "$DURATION" \
    --full-rtt --mps "$SPARSE_MPS" >"$RAW/$name-sparse.txt" 2>&1 || true

  kill -INT "$agent" "$server"
  wait "$agent" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  PIDS=()
  printf '{"policy":"%s","round":%d,"idle_agent_cores":%s,"idle_server_cores":%s,"busy":"%s","sparse":"%s"}\n' \
    "$policy" "$n" "$agent_cores" "$server_cores" "$name-busy.txt" "$name-sparse.txt" >>"$RAW/rounds.jsonl"
  echo "$name: idle agent $agent_cores cores, server $server_cores"
}

for n in $(seq "$ROUNDS"); do
  for policy in $POLICIES; do
    round "$policy" "$n"
  done
done

commit=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git -C "$SRC" status --porcelain -- accel agent server control config core mqueue 2>/dev/null)" ] || commit="$commit+changes"
machine="$(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME")"
python3 "$SRC/bench/idle/report.py" "$RAW" "$commit" "$machine" "$(date -u +%Y-%m-%d)" \
  "$IDLE_S" "$DURATION" "$SPARSE_MPS" >"$OUT/README.md"
cat "$OUT/README.md"
