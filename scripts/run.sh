#!/usr/bin/env bash
# Builds Caracal, then starts snic_server with configs/echo-server.yaml and the echo agent
# (configs/echo-agent.yaml) on the best accelerator present, over the embedded shm transport.
# Ctrl-C stops both. Extra arguments go to snic_server (for instance --log-level debug).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCARACAL_BUILD_TESTS=OFF \
  -DCARACAL_BUILD_BENCH=OFF >/dev/null
cmake --build build -j "$(nproc)" --target snic_server caracal_echo_agent

build/snic_server/snic_server --config configs/echo-server.yaml "$@" &
server=$!
agent=
stop() {
  [ -n "$agent" ] && kill -INT "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
  kill -INT "$server" 2>/dev/null && wait "$server" 2>/dev/null
}
trap stop EXIT INT TERM
sleep 0.5
build/examples/echo/caracal_echo_agent --config configs/echo-agent.yaml &
agent=$!
sleep 1
cat <<'TRY'

Caracal is serving the echo handler. Try it from another terminal:
  echo hello | nc -q1 127.0.0.1 7002                        # TCP, one message per line
  echo hello | socat - UDP:127.0.0.1:7000                   # UDP, one datagram per message
  sockperf ping-pong -i 127.0.0.1 -p 7000 -m 64 -t 5        # UDP latency
  sockperf ping-pong --tcp -i 127.0.0.1 -p 7003 -m 64 -t 5  # TCP latency (64-byte messages)
  sockperf throughput -i 127.0.0.1 -p 7000 -m 64 -t 5       # UDP throughput
  curl -s 127.0.0.1:9100/metrics                            # Prometheus metrics
Ctrl-C stops the server and the agent.
TRY
wait "$server"
