#!/usr/bin/env bash
# An idle snic_server with the echo agent attached and no traffic: each thread's CPU (from
# /proc/PID/task/TID/stat) and voluntary switches over 5 s, and the engine's sleeps
# (caracal_engine_sleeps_total), with configs/echo-server.yaml's heartbeat interval set to
# HEARTBEAT_MS (agent timeout 5x that).
#
#   bench/results/experiments/idle-heartbeats/idle.sh BUILD_DIR HEARTBEAT_MS
set -euo pipefail
cd "$(dirname "$0")/../../../.."
build=$1 hb=$2
work=$(mktemp -d)
sed -e "s/heartbeat_interval_ms: .*/heartbeat_interval_ms: $hb/" \
  -e "s/agent_timeout_ms: .*/agent_timeout_ms: $((hb * 5))/" \
  configs/echo-server.yaml >"$work/server.yaml"
"$build/snic_server/snic_server" --config "$work/server.yaml" >"$work/server.log" 2>&1 &
server=$!
sleep 0.5
"$build/examples/echo/caracal_echo_agent" --config configs/echo-agent.yaml >"$work/agent.log" 2>&1 &
agent=$!
trap 'kill -INT $agent $server 2>/dev/null; wait; rm -rf "$work"' EXIT
sleep 2
snap() {  # TID NAME TICKS VOLUNTARY_SWITCHES, one line per thread
  for t in /proc/$server/task/*; do
    echo "$(basename "$t") $(cut -d' ' -f2 "$t/stat") $(awk '{print $14 + $15}' "$t/stat")" \
      "$(awk '$1 == "voluntary_ctxt_switches:" {print $2}' "$t/status")"
  done
}
sleeps() { curl -sf "127.0.0.1:9100/metrics" | awk '/^caracal_engine_sleeps_total/ {print $2}'; }
snap >"$work/a"
s0=$(sleeps)
sleep 5
snap >"$work/b"
s1=$(sleeps)
hz=$(getconf CLK_TCK)
echo "heartbeat every $hb ms, 5 s idle:"
join "$work/a" "$work/b" |
  awk -v hz="$hz" '{printf "  %s %s %.3f cores, %d voluntary switches\n", $1, $2,
    ($6 - $3) / hz / 5, $7 - $4}'
echo "  engine sleeps: $((s1 - s0))"
